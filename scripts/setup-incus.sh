#!/usr/bin/env bash
# Sets a fresh Debian 12 machine up for incus-hpa, idempotently (run as root):
#   1. installs Incus 6.0 LTS from bookworm-backports (reusing the machine's own Debian mirror),
#   2. starts incusd when nothing runs it yet (no systemd needed),
#   3. creates the `default` storage pool (dir) and the default profile's root disk,
#   4. builds and imports the local `busybox` image (scripts/build-busybox-image.sh).
# Every step checks first and does nothing when it is already done.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
log() { printf 'setup-incus: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run me as root (I install packages and start incusd)"

install_incus() {
    if command -v incus >/dev/null 2>&1 && [ -x /usr/libexec/incus/incusd ]; then
        return
    fi
    local src=/etc/apt/sources.list.d/debian.sources bp=/etc/apt/sources.list.d/incus-hpa-backports.sources
    if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        [ -r "$src" ] || die "$src not found: cannot tell which Debian mirror to use for bookworm-backports"
        # Reuse the first URIs: line of the machine's own Debian sources: no mirror is named here.
        local uris
        uris=$(awk '/^URIs:/ {print; exit}' "$src")
        [ -n "$uris" ] || die "no URIs: line in $src"
        log "adding bookworm-backports ($uris)"
        cat >"$bp" <<SRC
Types: deb
$uris
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    fi
    log "installing incus from bookworm-backports"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t bookworm-backports incus >/dev/null
}

start_incusd() {
    if incus admin waitready --timeout 1 >/dev/null 2>&1; then
        return
    fi
    if [ -d /run/systemd/system ] && systemctl list-unit-files incus.service >/dev/null 2>&1; then
        log "starting incus through systemd"
        systemctl start incus.socket incus.service || true
    fi
    if ! incus admin waitready --timeout 2 >/dev/null 2>&1; then
        log "starting incusd in the background (log: /var/log/incus-hpa-incusd.log)"
        mkdir -p /var/log
        nohup setsid /usr/libexec/incus/incusd --group root >>/var/log/incus-hpa-incusd.log 2>&1 </dev/null &
    fi
    incus admin waitready --timeout 120 || die "incusd did not become ready (see /var/log/incus-hpa-incusd.log)"
}

init_storage() {
    if ! incus storage show default >/dev/null 2>&1; then
        log "creating storage pool 'default' (dir)"
        incus storage create default dir
    fi
    if ! incus profile device get default root pool >/dev/null 2>&1; then
        log "adding the root disk to the default profile"
        incus profile device add default root disk path=/ pool=default
    fi
}

install_incus
start_incusd
init_storage
"$here/build-busybox-image.sh"
log "ready: $(incus version | tr '\n' ' ')"
