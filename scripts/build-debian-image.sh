#!/usr/bin/env bash
# Builds a Debian bookworm image that boots systemd as PID 1 in an unprivileged container, from
# the machine's own Debian mirror with debootstrap, and imports it as `incus-hpa-bookworm` (or
# $1). Idempotent; the tarball is cached in /var/cache/incus-hpa so a kept machine rebuilds
# nothing. Used by the systemd end-to-end test.
set -euo pipefail

alias=${1:-incus-hpa-bookworm}
cache=/var/cache/incus-hpa
tarball=$cache/bookworm-systemd.tar.gz
log() { printf 'build-debian-image: %s\n' "$*" >&2; }

# The tarball is also the base of the cluster members' image (scripts/build-member-image.sh):
# it is rebuilt when missing even if the image is there.
if incus image show "$alias" >/dev/null 2>&1 && [ -s "$tarball" ]; then
    exit 0
fi
mkdir -p "$cache/debootstrap"
if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null || {
        log "installing debootstrap"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
    }
    mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [ -n "$mirror" ] || mirror=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list)
    [ -n "$mirror" ] || { log "error: no Debian mirror found in /etc/apt"; exit 1; }
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    log "debootstrap bookworm (about a minute)"
    debootstrap --variant=minbase --cache-dir="$cache/debootstrap" \
        --include=systemd,systemd-sysv,dbus,procps,adduser \
        bookworm "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || {
        tail -20 "$work/debootstrap.log" >&2
        exit 1
    }
    rm -rf "$work/rootfs/var/lib/apt/lists/"* "$work/rootfs/var/cache/apt/archives/"*.deb
    : >"$work/rootfs/etc/machine-id"
    rm -f "$work/rootfs/var/lib/dbus/machine-id"
    echo incus-hpa-e2e >"$work/rootfs/etc/hostname"
    cat >"$work/metadata.yaml" <<META
architecture: $(uname -m)
creation_date: $(date +%s)
properties:
  description: Debian bookworm with systemd, built locally for incus-hpa's end-to-end test
  os: debian
  release: bookworm
META
    tar -C "$work" -czf "$tarball.tmp" metadata.yaml rootfs
    mv "$tarball.tmp" "$tarball"
fi
if ! incus image show "$alias" >/dev/null 2>&1; then
    log "importing image as '$alias'"
    incus image import "$tarball" --alias "$alias" >/dev/null
fi
