#!/usr/bin/env bash
# Builds a tiny container image from Debian's busybox-static and imports it as the local
# alias `busybox` (or $1), offline. Idempotent: does nothing when the alias exists.
# The image boots busybox init, which keeps a shell-less idle process running, and has
# /dev/shm ready for `lab/stress.sh` (tmpfs + dd) to put memory under pressure.
set -euo pipefail

alias=${1:-busybox}
log() { printf 'build-busybox-image: %s\n' "$*" >&2; }

if incus image show "$alias" >/dev/null 2>&1; then
    exit 0
fi
if [ ! -x /bin/busybox ] || ! /bin/busybox --list >/dev/null 2>&1 || ! dpkg -s busybox-static >/dev/null 2>&1; then
    log "installing busybox-static"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq busybox-static >/dev/null
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,root,var/log}
chmod 1777 "$root/tmp"
cp /bin/busybox "$root/bin/busybox"
for applet in $(/bin/busybox --list-full); do
    [ -e "$root/$applet" ] || ln -s /bin/busybox "$root/$applet"
done
cat >"$root/etc/inittab" <<'TAB'
::sysinit:/bin/mkdir -p /dev/shm
::respawn:/bin/sleep 2147483647
::shutdown:/bin/umount -a -r
TAB
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"

arch=$(uname -m)
cat >"$work/metadata.yaml" <<META
architecture: $arch
creation_date: $(date +%s)
properties:
  description: busybox (Debian busybox-static), built locally for incus-hpa
  os: busybox
  release: static
META
tar -C "$work" -czf "$work/image.tar.gz" metadata.yaml rootfs
log "importing image as '$alias'"
incus image import "$work/image.tar.gz" --alias "$alias" >/dev/null
