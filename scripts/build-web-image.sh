#!/usr/bin/env bash
# Builds a tiny web-server image from Debian's busybox-static and imports it as the local alias
# `busybox-web` (or $1), offline. Idempotent: does nothing when the alias exists.
# Its init asks for an address on eth0 (busybox udhcpc, from the bridge's dnsmasq) and serves
# /www on port 80 (busybox httpd). /www/index.html exists; /www/healthz does not: whoever
# wants the instance ready creates it (`incus exec NAME -- touch /www/healthz`), so a test
# decides when a check on /healthz passes.
set -euo pipefail

alias=${1:-busybox-web}
log() { printf 'build-web-image: %s\n' "$*" >&2; }

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
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,root,var/log,www}
chmod 1777 "$root/tmp"
cp /bin/busybox "$root/bin/busybox"
for applet in $(/bin/busybox --list-full); do
    [ -e "$root/$applet" ] || ln -s /bin/busybox "$root/$applet"
done
# Applets by full path: the links above do not cover every directory an applet expects.
cat >"$root/etc/udhcpc.script" <<'SCRIPT'
#!/bin/busybox sh
# Called by udhcpc with the lease in the environment ($ip, $mask, $router, $interface).
bb=/bin/busybox
case "$1" in
deconfig)
    $bb ip addr flush dev "$interface"
    $bb ip link set "$interface" up
    ;;
bound | renew)
    $bb ip addr flush dev "$interface"
    $bb ip addr add "$ip/$mask" dev "$interface"
    if [ -n "${router:-}" ]; then
        $bb ip route add default via "${router%% *}" dev "$interface" 2>/dev/null || true
    fi
    ;;
esac
exit 0
SCRIPT
chmod 0755 "$root/etc/udhcpc.script"
cat >"$root/etc/inittab" <<'TAB'
::sysinit:/bin/busybox mkdir -p /dev/shm
::sysinit:/bin/busybox ip link set lo up
::respawn:/bin/busybox udhcpc -f -i eth0 -s /etc/udhcpc.script
::respawn:/bin/busybox httpd -f -p 80 -h /www
::shutdown:/bin/busybox umount -a -r
TAB
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
printf 'hello from incus-hpa\n' >"$root/www/index.html"

arch=$(uname -m)
cat >"$work/metadata.yaml" <<META
architecture: $arch
creation_date: $(date +%s)
properties:
  description: busybox web server (Debian busybox-static), built locally for incus-hpa
  os: busybox
  release: web
META
tar -C "$work" -czf "$work/image.tar.gz" metadata.yaml rootfs
log "importing image as '$alias'"
incus image import "$work/image.tar.gz" --alias "$alias" >/dev/null
