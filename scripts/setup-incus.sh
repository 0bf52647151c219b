#!/usr/bin/env bash
# Sets a fresh Debian machine up for incus-hpa, idempotently (run as root):
#   1. installs Incus 6.0 LTS when it is missing: on Debian 12 (bookworm) from bookworm-backports,
#      reusing the machine's own Debian mirror (from a deb822 debian.sources or a classic
#      sources.list); on Debian 13 (trixie) from the main archive; anywhere else it says what it
#      found and stops (install Incus yourself, then run it again),
#   2. starts incusd when nothing runs it yet (no systemd needed),
#   3. creates the `default` storage pool (dir) and the default profile's root disk,
#   4. builds and imports the local `busybox` image (scripts/build-busybox-image.sh).
# Every step checks first and does nothing when it is already done.
#
# For tests, two variables make step 1 observable without changing the machine:
#   SETUP_INCUS_DRY_RUN=1  needs no root, decides as if Incus were missing, prints on stdout what
#                          it would do (`would-write PATH` followed by the file's lines,
#                          `would-run COMMAND...`), then exits 0 before starting incusd;
#   SETUP_INCUS_ROOT=DIR   reads etc/os-release and etc/apt/ under DIR instead of / (dry runs
#                          only); the paths it prints and logs are those of the machine, without DIR.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
log() { printf 'setup-incus: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

case ${SETUP_INCUS_DRY_RUN:-0} in
0) dry_run= ;;
1) dry_run=1 ;;
*) die "SETUP_INCUS_DRY_RUN must be 1 or 0, not '${SETUP_INCUS_DRY_RUN}'" ;;
esac
root=${SETUP_INCUS_ROOT:-}
root=${root%/}
[ -z "$root" ] || [ -n "$dry_run" ] || die "SETUP_INCUS_ROOT is only for dry runs (SETUP_INCUS_DRY_RUN=1)"
# A dry run's report goes to the original stdout, whatever the real command's output would go to.
exec 3>&1

if [ -n "$dry_run" ]; then
    log "dry run: reading /etc under ${root:-/}, changing nothing"
else
    [ "$(id -u)" -eq 0 ] || die "run me as root (I install packages and start incusd)"
fi

# apt_get ARGS...: runs apt-get non-interactively, or in a dry run says it would.
apt_get() {
    if [ -n "$dry_run" ]; then
        printf 'would-run apt-get %s\n' "$*" >&3
        return
    fi
    DEBIAN_FRONTEND=noninteractive apt-get "$@"
}

# write_file PATH CONTENT: writes CONTENT and a final newline to PATH (under $root), or in a
# dry run says it would.
write_file() {
    if [ -n "$dry_run" ]; then
        printf 'would-write %s\n%s\n' "$1" "$2" >&3
        return
    fi
    printf '%s\n' "$2" >"$root$1"
}

# cannot_install WHY: stops, saying WHY and what to do instead.
cannot_install() {
    log "error: $1"
    log "install Incus 6.0 LTS yourself (the incus client and /usr/libexec/incus/incusd; see https://linuxcontainers.org/incus/docs/main/installing/), then run me again"
    exit 1
}

# os_release_value FILE KEY: KEY's value in the os-release FILE, unquoted (empty when absent).
os_release_value() {
    local value
    value=$(awk -F= -v key="$2" '$1 == key { sub(/^[^=]*=/, ""); print; exit }' "$1")
    value=${value#[\"\']}
    value=${value%[\"\']}
    printf '%s' "$value"
}

# has_bookworm_backports: whether a source apt reads (not a comment) already names bookworm-backports.
has_bookworm_backports() {
    local apt=$root/etc/apt
    grep -qsE '^[^#]*bookworm-backports' "$apt/sources.list" "$apt"/sources.list.d/*.list "$apt"/sources.list.d/*.sources
}

# deb822_bookworm_uris FILE: the URIs of the first enabled `deb` stanza of FILE whose Suites
# include bookworm (empty when there is none).
deb822_bookworm_uris() {
    awk '
        function norm(s) { gsub(/[ \t]+/, " ", s); sub(/^ /, "", s); sub(/ $/, "", s); return s }
        function end_stanza() {
            if (!found && enabled && (" " types " ") ~ / deb / && (" " suites " ") ~ / bookworm / && uris != "") {
                print uris
                found = 1
            }
            types = suites = uris = key = ""
            enabled = 1
        }
        BEGIN { enabled = 1 }
        /^#/ { next }
        /^[ \t]*$/ { end_stanza(); next }
        /^[ \t]/ {
            if (key == "types") types = norm(types " " $0)
            else if (key == "suites") suites = norm(suites " " $0)
            else if (key == "uris") uris = norm(uris " " $0)
            next
        }
        {
            colon = index($0, ":")
            if (colon == 0) next
            key = tolower(substr($0, 1, colon - 1))
            value = norm(substr($0, colon + 1))
            if (key == "types") types = value
            else if (key == "suites") suites = value
            else if (key == "uris") uris = value
            else if (key == "enabled") enabled = (tolower(value) != "no")
        }
        END { end_stanza() }
    ' "$1"
}

# one_line_bookworm_backports FILE: from the first `deb` line of the one-line-style FILE whose
# suite is bookworm (a cdrom: one does not count), the same line for bookworm-backports main,
# with the same options and URI (empty when there is none).
one_line_bookworm_backports() {
    awk '
        { sub(/^[ \t]+/, "") }
        /^#/ { next }
        { sub(/[ \t]#.*$/, "") }
        $1 != "deb" { next }
        {
            i = 2
            options = ""
            if (substr($2, 1, 1) == "[") {
                while (i <= NF) {
                    options = options (options == "" ? "" : " ") $i
                    if ($(i++) ~ /\]$/) break
                }
            }
            uri = $i
            if (uri ~ /^cdrom:/ || $(i + 1) != "bookworm") next
            print "deb " (options == "" ? "" : options " ") uri " bookworm-backports main"
            exit
        }
    ' "$1"
}

install_incus() {
    if [ -z "$dry_run" ] && command -v incus >/dev/null 2>&1 && [ -x /usr/libexec/incus/incusd ]; then
        return
    fi
    local os_release=/etc/os-release id codename found
    [ -r "$root$os_release" ] || os_release=/usr/lib/os-release
    [ -r "$root$os_release" ] ||
        cannot_install "found no /etc/os-release (nor /usr/lib/os-release): cannot tell which system this is, and I can install Incus only on Debian 12 (bookworm) or Debian 13 (trixie)"
    id=$(os_release_value "$root$os_release" ID)
    codename=$(os_release_value "$root$os_release" VERSION_CODENAME)
    found="ID=${id:-(unset)} VERSION_CODENAME=${codename:-(unset)} (from $os_release)"
    case "$id/$codename" in
    debian/bookworm)
        add_bookworm_backports "$found"
        log "installing incus from bookworm-backports"
        apt_get update -qq
        apt_get install -y -qq -t bookworm-backports incus >/dev/null
        ;;
    debian/trixie)
        log "installing incus from Debian 13 (trixie)"
        apt_get update -qq
        apt_get install -y -qq incus >/dev/null
        ;;
    *)
        cannot_install "this machine is $found: I can install Incus only on Debian 12 (bookworm) or Debian 13 (trixie)"
        ;;
    esac
}

# add_bookworm_backports FOUND: adds bookworm-backports to apt's sources unless it is there,
# reusing the machine's own Debian mirror: no mirror is named here.
add_bookworm_backports() {
    local debian_sources=/etc/apt/sources.list.d/debian.sources sources_list=/etc/apt/sources.list
    local bp=/etc/apt/sources.list.d/incus-hpa-backports uris line
    if has_bookworm_backports; then
        return
    fi
    if [ -r "$root$debian_sources" ]; then
        uris=$(deb822_bookworm_uris "$root$debian_sources")
        if [ -n "$uris" ]; then
            log "adding bookworm-backports (URIs: $uris)"
            write_file "$bp.sources" "Types: deb
URIs: $uris
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
            return
        fi
    fi
    if [ -r "$root$sources_list" ]; then
        line=$(one_line_bookworm_backports "$root$sources_list")
        if [ -n "$line" ]; then
            log "adding bookworm-backports ($line)"
            write_file "$bp.list" "$line"
            return
        fi
    fi
    cannot_install "this machine is $1, but neither $debian_sources (a deb822 stanza with Suites: bookworm) nor $sources_list (a 'deb URI bookworm ...' line) names the machine's Debian mirror, so I cannot tell where to get bookworm-backports from (adding that mirror to apt's sources and running me again works too)"
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
        # From /, as a service manager would: a daemon must not hold the caller's directory
        # (rsync inside `incus copy` fails once that directory is removed).
        # Nor the script's descriptors (fd 3 is its stdout: a pipe a caller waits on).
        (cd / && exec nohup setsid /usr/libexec/incus/incusd --group root \
            >>/var/log/incus-hpa-incusd.log 2>&1 </dev/null 3>&-) &
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
if [ -n "$dry_run" ]; then
    log "dry run: stopping here, before incusd is started"
    exit 0
fi
start_incusd
init_storage
"$here/build-busybox-image.sh"
log "ready: $(incus version | tr '\n' ' ')"
