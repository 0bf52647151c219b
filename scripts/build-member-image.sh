#!/usr/bin/env bash
# Builds the image of one member of the test cluster (scripts/cluster.sh) and imports it as
# `hpa-cm-member` (or $1): the Debian bookworm systemd image of scripts/build-debian-image.sh
# with incusd (incus-base + incus-client from bookworm-backports, --no-install-recommends, so no
# QEMU) installed in a chroot before import, since the members have no route to the archive.
# Baked in, so that a member needs nothing at launch:
#   - /etc/subuid and /etc/subgid `root:100000:200000` (the nested incusd's id map fits in the
#     member's own 65536+ ids instead of wanting 1e9),
#   - hpa-cm-member-setup.service, run at boot before incus: it remounts the cgroup v1 `cpu` and
#     `cpuacct` hierarchies the member's systemd turns into dangling symlinks (nested LXC fails
#     with "Failed to open 9/cpuacct" otherwise), and gives eth0 its static address from the
#     host name: hpa-cmN gets 10.250.77.1N/24 (the bridge has no NAT and the image no DHCP client).
# The mirror is the machine's own (the `URIs:` of /etc/apt/sources.list.d/debian.sources, or
# the first `deb` line of /etc/apt/sources.list); no mirror is named here. Idempotent: the
# tarball is cached in /var/cache/incus-hpa (zstd, fast on two cores) and the downloaded .debs
# in /var/cache/incus-hpa/member-debs, so a kept machine rebuilds nothing.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
alias=${1:-hpa-cm-member}
cache=/var/cache/incus-hpa
base=$cache/bookworm-systemd.tar.gz
tarball=$cache/hpa-cm-member.tar.zst
log() { printf 'build-member-image: %s\n' "$*" >&2; }

if incus image show "$alias" >/dev/null 2>&1; then
    exit 0
fi
command -v zstd >/dev/null || {
    log "installing zstd"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zstd >/dev/null
}
if [ ! -s "$tarball" ]; then
    if [ ! -s "$base" ]; then
        log "building the bookworm systemd base first (scripts/build-debian-image.sh)"
        "$here/build-debian-image.sh"
    fi
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$mirror" ] || mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list)
    [ -n "$mirror" ] || { log "error: no Debian mirror found in /etc/apt"; exit 1; }
    work=$(mktemp -d "$cache/member-build.XXXXXX")
    root=$work/rootfs
    cleanup() {
        for m in dev/pts dev proc sys var/cache/apt/archives; do
            mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m"
        done
        rm -rf --one-file-system "$work"
    }
    trap cleanup EXIT
    log "unpacking $base"
    tar -C "$work" -xzf "$base"
    mkdir -p "$cache/member-debs/partial"
    mount --bind /proc "$root/proc"
    mount --bind /sys "$root/sys"
    mount --bind /dev "$root/dev"
    mount --bind /dev/pts "$root/dev/pts"
    mount --bind "$cache/member-debs" "$root/var/cache/apt/archives"
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    rm -f "$root/etc/apt/sources.list"
    cat >"$root/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates bookworm-backports
Components: main
SRC
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod 755 "$root/usr/sbin/policy-rc.d"
    log "installing incus-base from bookworm-backports in the chroot (about a minute cold)"
    chroot "$root" sh -c 'export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq &&
        apt-get install -y -qq --no-install-recommends -t bookworm-backports incus-base incus-client' \
        >"$work/apt.log" 2>&1 || {
        tail -30 "$work/apt.log" >&2
        exit 1
    }
    rm -f "$root/usr/sbin/policy-rc.d"
    umount "$root/var/cache/apt/archives" "$root/dev/pts" "$root/dev" "$root/sys" "$root/proc"
    rm -rf "$root/var/lib/apt/lists/"*
    : >"$root/etc/resolv.conf"
    # The host name is the instance's (hpa-cmN): systemd keeps the one the container manager sets.
    rm -f "$root/etc/hostname"
    printf 'root:100000:200000\n' >"$root/etc/subuid"
    printf 'root:100000:200000\n' >"$root/etc/subgid"
    cat >"$root/usr/local/sbin/hpa-cm-member-setup" <<'SETUP'
#!/bin/sh
# Boot-time fixes of an incus-hpa test cluster member (see scripts/build-member-image.sh).
set -e
# cgroup v1: the host mounts cpu and cpuacct as separate hierarchies; systemd here made
# symlinks to a cpu,cpuacct directory that is not mounted.
if [ -d /sys/fs/cgroup/memory ] && ! mountpoint -q /sys/fs/cgroup/cpuacct; then
    mount -o remount,rw /sys/fs/cgroup
    for c in cpu cpuacct; do
        [ -L /sys/fs/cgroup/$c ] && rm -f /sys/fs/cgroup/$c
        mkdir -p /sys/fs/cgroup/$c
        mountpoint -q /sys/fs/cgroup/$c || mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c
    done
    mount -o remount,ro /sys/fs/cgroup || true
fi
# Static address from the host name: hpa-cmN -> 10.250.77.1N/24.
n=$(hostname | sed -n 's/^hpa-cm\([0-9]\)$/\1/p')
if [ -n "$n" ]; then
    ip link set eth0 up
    ip -4 addr show dev eth0 | grep -q "10.250.77.1$n/" || ip addr add "10.250.77.1$n/24" dev eth0
fi
SETUP
    chmod 755 "$root/usr/local/sbin/hpa-cm-member-setup"
    cat >"$root/etc/systemd/system/hpa-cm-member-setup.service" <<'UNIT'
[Unit]
Description=incus-hpa test cluster member: cgroup v1 cpu/cpuacct fix and static address
DefaultDependencies=no
After=local-fs.target
Before=incus.socket incus.service lxcfs.service network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/hpa-cm-member-setup

[Install]
WantedBy=sysinit.target
UNIT
    mkdir -p "$root/etc/systemd/system/sysinit.target.wants"
    ln -sf /etc/systemd/system/hpa-cm-member-setup.service \
        "$root/etc/systemd/system/sysinit.target.wants/hpa-cm-member-setup.service"
    # Nothing here needs the daily apt timers.
    rm -f "$root/etc/systemd/system/timers.target.wants/"apt-daily*.timer
    cat >"$work/metadata.yaml" <<META
architecture: $(uname -m)
creation_date: $(date +%s)
properties:
  description: Debian bookworm with systemd and incusd, a member of incus-hpa's test cluster
  os: debian
  release: bookworm
META
    log "packing $tarball"
    tar -C "$work" -cf - metadata.yaml rootfs | zstd -q -T0 -3 -o "$tarball.tmp"
    mv "$tarball.tmp" "$tarball"
fi
log "importing image as '$alias'"
incus image import "$tarball" --alias "$alias" >/dev/null
