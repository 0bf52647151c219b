#!/usr/bin/env bash
# lab/stress.sh: puts the instances of an incus-hpa group under memory pressure, for demos
# and manual tests of the autoscaler.
#
# Every RUNNING instance managed by incus-hpa for GROUP (config key
# user.incus-hpa.group=GROUP, checked for the exact value) is brought to about PERCENT of
# its memory limit by writing a file into a tmpfs inside it (/dev/shm/incus-hpa-stress;
# /dev/shm is mounted as a tmpfs first when it is not one yet). The fill is held for
# SECONDS (default: until Ctrl-C) and then removed; Ctrl-C, SIGTERM or any exit remove it
# too. With --no-hold the fill is left in place and the script exits at once;
# `lab/stress.sh --release GROUP` removes it later. Instances that are not managed by
# incus-hpa for GROUP are never touched.
#
# The memory limit is read from `incus config get --expanded NAME limits.memory`
# (bytes, kB/KiB, MB/MiB, GB/GiB, TB/TiB suffixes); when it is unset or a percentage the
# total reported in the instance state (/1.0/instances/NAME/state, memory.total) is used.
#
# Needs the `incus` client and write access to the Incus socket
# (${INCUS_SOCKET:-/var/lib/incus/unix.socket}). Exit status: 0 done, 2 bad usage or
# environment (unknown group, bad percent, no access to Incus), 1 failure while filling.
set -euo pipefail

readonly GROUP_KEY=user.incus-hpa.group
readonly FILL_FILE=/dev/shm/incus-hpa-stress
prog=${0##*/}

usage() {
    cat <<EOF
Usage:
  $prog [--project P] [--no-hold] GROUP PERCENT [SECONDS]
  $prog [--project P] --release GROUP

Brings every running instance of the incus-hpa group GROUP to about PERCENT (1-95) of its
memory limit by writing to a tmpfs inside it, holds it for SECONDS (default: until
Ctrl-C), then releases it.

Options:
  --project P   Incus project of the group (default: the client's current project)
  --no-hold     fill, leave the fill in place and exit (release it with --release)
  --release     remove the fill from every running instance of GROUP and exit
  -h, --help    show this help

Examples:
  $prog lab 80 30          # 80 % for 30 s
  $prog --no-hold lab 80   # fill and return at once
  $prog --release lab      # remove the fill
EOF
}

log() { printf '%s: %s\n' "$prog" "$*" >&2; }
die() { log "error: $1"; exit "${2:-1}"; }  # die MESSAGE [STATUS]
usage_error() { log "error: $*"; log "run '$prog --help' for usage"; exit 2; }

project=
hold=1
release_only=0
args=()
while [ $# -gt 0 ]; do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --project) [ $# -ge 2 ] || usage_error "--project needs a value"; project=$2; shift 2 ;;
        --project=*) project=${1#--project=}; shift ;;
        --no-hold) hold=0; shift ;;
        --release) release_only=1; shift ;;
        --) shift; args+=("$@"); break ;;
        -*) usage_error "unknown option: $1" ;;
        *) args+=("$1"); shift ;;
    esac
done

if [ "$release_only" -eq 1 ]; then
    [ "${#args[@]}" -eq 1 ] || usage_error "--release takes exactly one argument: GROUP"
    group=${args[0]}
else
    if [ "${#args[@]}" -lt 2 ] || [ "${#args[@]}" -gt 3 ]; then
        usage_error "expected GROUP PERCENT [SECONDS]"
    fi
    group=${args[0]}
    percent=${args[1]}
    seconds=${args[2]:-}
    [[ $percent =~ ^[0-9]+$ ]] || usage_error "PERCENT must be a whole number between 1 and 95, got '$percent'"
    percent=$((10#$percent))
    if [ "$percent" -lt 1 ] || [ "$percent" -gt 95 ]; then
        usage_error "PERCENT must be between 1 and 95 (higher risks the OOM killer), got $percent"
    fi
    if [ -n "$seconds" ]; then
        [[ $seconds =~ ^[0-9]+$ ]] || usage_error "SECONDS must be a whole number of seconds, got '$seconds'"
        seconds=$((10#$seconds))
    fi
fi
[[ $group =~ ^[a-z][a-z0-9-]*$ ]] \
    || usage_error "GROUP must be lowercase letters, digits and '-', starting with a letter, got '$group'"

proj_args=()
[ -n "$project" ] && proj_args=(--project "$project")

# --- access to Incus --------------------------------------------------------------------
command -v incus >/dev/null 2>&1 || die "the 'incus' client is not installed (run scripts/setup-incus.sh as root)" 2
check_access() {
    local sock=${INCUS_SOCKET:-/var/lib/incus/unix.socket} err
    if err=$(incus info 2>&1 >/dev/null); then
        return
    fi
    local dir=${sock%/*}
    if [ ! -S "$sock" ] && { [ ! -d "$dir" ] || [ -x "$dir" ]; }; then
        die "no Incus socket at $sock: incusd is not running (start it with scripts/setup-incus.sh as root) or INCUS_SOCKET points elsewhere" 2
    fi
    if [ ! -S "$sock" ] || [ ! -w "$sock" ] || [ ! -r "$sock" ]; then
        local sgroup
        sgroup=$(stat -c %G "$sock" 2>/dev/null || echo incus-admin)
        if [ "$sgroup" = root ]; then
            die "no permission on the Incus socket $sock (group 'root': incusd runs with --group root): run this as root, or restart incusd with --group incus-admin and join 'incus-admin' (sudo usermod -aG incus-admin \$USER, then log in again)" 2
        fi
        die "no permission on the Incus socket $sock: run as root or join the group '$sgroup' (sudo usermod -aG $sgroup \$USER, then log in again)" 2
    fi
    die "'incus info' failed: ${err:-unknown error}" 2
}
check_access

# --- helpers ------------------------------------------------------------------------------
# Names of the RUNNING instances whose own config has user.incus-hpa.group == $group exactly.
# The server-side filter is a regex, so the value is checked again here.
managed_running() {
    incus list "${proj_args[@]}" "$GROUP_KEY=$group" -f csv,noheader -c "n,s,config:$GROUP_KEY" \
        | awk -F, -v g="$group" '$2 == "RUNNING" && $3 == g { print $1 }'
}

# Converts an Incus size ("64MiB", "64MB", "1GiB", "1.5GB", "67108864", "512kB") to bytes;
# prints nothing for what it cannot read (e.g. "50%").
to_bytes() {
    printf '%s\n' "$1" | awk '
        {
            s = $0; gsub(/[[:space:]]/, "", s)
            if (!match(s, /^[0-9]+(\.[0-9]+)?/)) exit
            n = substr(s, 1, RLENGTH); u = tolower(substr(s, RLENGTH + 1))
            m["" ] = 1;  m["b"]  = 1
            m["k"] = 1024;  m["kb"] = 1000;    m["kib"] = 1024
            m["m"] = 1024^2; m["mb"] = 1000^2; m["mib"] = 1024^2
            m["g"] = 1024^3; m["gb"] = 1000^3; m["gib"] = 1024^3
            m["t"] = 1024^4; m["tb"] = 1000^4; m["tib"] = 1024^4
            m["p"] = 1024^5; m["pb"] = 1000^5; m["pib"] = 1024^5
            if (!(u in m)) exit
            printf "%.0f\n", n * m[u]
        }'
}

# Prints "<total> <usage>" (bytes) read from the instance state (pretty-printed JSON), or
# nothing when the state cannot be read or has no memory section.
state_memory() {
    local q="/1.0/instances/$1/state"
    [ -n "$project" ] && q="$q?project=$project"
    incus query "$q" 2>/dev/null | awk '
        /"memory"[[:space:]]*:[[:space:]]*\{/ { inmem = 1; next }
        inmem && /\}/ { inmem = 0 }
        inmem && /"total"[[:space:]]*:/ { gsub(/[^0-9]/, ""); total = $0 }
        inmem && /"usage"[[:space:]]*:/ { gsub(/[^0-9]/, ""); usage = $0 }
        END { if (total != "") print total, (usage == "" ? 0 : usage) }'
}

limit_bytes() {
    local name=$1 raw bytes
    raw=$(incus config get "${proj_args[@]}" --expanded "$name" limits.memory 2>/dev/null || true)
    if [ -n "$raw" ]; then
        bytes=$(to_bytes "$raw")
        if [ -n "$bytes" ] && [ "$bytes" -gt 0 ]; then
            echo "$bytes"
            return
        fi
    fi
    # No limit, or a percentage of the host: what the instance state reports as total.
    local st
    st=$(state_memory "$name" || true)
    [ -z "$st" ] || echo "${st%% *}"
}

mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }

release_one() {
    incus exec "${proj_args[@]}" -n -T "$1" -- rm -f "$FILL_FILE" >/dev/null 2>&1
}

# --- the group's running instances ---------------------------------------------------------
where=
[ -z "$project" ] || where=" in project '$project'"
if [ -n "$project" ] && ! incus project show "$project" >/dev/null 2>&1; then
    die "there is no Incus project '$project' (see: incus project list)" 2
fi
listing=$(managed_running) || die "cannot list the instances$where (see the error above)" 2
instances=()
[ -z "$listing" ] || mapfile -t instances <<<"$listing"
if [ "${#instances[@]}" -eq 0 ]; then
    die "no running instance is managed by incus-hpa for group '$group'$where (looked for $GROUP_KEY=$group exactly; see: incus list ${proj_args[*]}${project:+ }$GROUP_KEY=$group)" 2
fi

# --- release mode ----------------------------------------------------------------------------
if [ "$release_only" -eq 1 ]; then
    rc=0
    for name in "${instances[@]}"; do
        if release_one "$name"; then
            echo "released $name"
        else
            log "warning: could not release $name"
            rc=1
        fi
    done
    exit "$rc"
fi

# --- fill ----------------------------------------------------------------------------------
filled=()
released=0
sleep_pid=
# shellcheck disable=SC2317 # called from the EXIT trap
release_all() {
    [ -z "$sleep_pid" ] || kill "$sleep_pid" 2>/dev/null || true
    [ "$released" -eq 0 ] || return 0
    released=1
    local name
    for name in "${filled[@]}"; do
        if release_one "$name"; then
            echo "released $name"
        else
            log "warning: could not release $name (already gone?)"
        fi
    done
}
if [ "$hold" -eq 1 ]; then
    trap 'release_all' EXIT
fi
trap 'exit 130' INT
trap 'exit 143' TERM

# Safety net for instances without a limit (whose "limit" is the host's memory): never write
# more than half of what the host has available.
host_avail=$(awk '/^MemAvailable:/ { printf "%.0f\n", $2 * 1024 }' /proc/meminfo 2>/dev/null || true)
failed=0
for name in "${instances[@]}"; do
    limit=$(limit_bytes "$name" || true)
    if [ -z "$limit" ]; then
        log "warning: $name: cannot tell its memory limit, skipped"
        failed=1
        continue
    fi
    # Remove a previous fill first so that the baseline usage is the instance's own.
    release_one "$name" || true
    st=$(state_memory "$name" || true)
    usage=${st#* }
    [ -n "$st" ] || usage=0
    target=$((limit * percent / 100))
    need_mib=$(( (target - usage + 524288) / 1048576 ))
    if [ "$need_mib" -le 0 ]; then
        echo "$name: already at $(mib "$usage") MiB of $(mib "$limit") MiB (>= $percent %), nothing written"
        continue
    fi
    if [ -n "$host_avail" ] && [ "$((need_mib * 1048576))" -gt "$((host_avail / 2))" ]; then
        log "warning: $name: filling $need_mib MiB would take more than half of the host's available memory ($((host_avail / 1048576)) MiB; no limits.memory?), skipped"
        failed=1
        continue
    fi
    size_mib=$((need_mib + 16))
    filled+=("$name")
    # Inside the instance (any image with a POSIX sh, mount, rm and dd): make /dev/shm a
    # tmpfs big enough, then write the file.
    # shellcheck disable=SC2016 # expanded by the instance's sh, not here
    if ! out=$(incus exec "${proj_args[@]}" -n -T "$name" -- sh -c '
            set -e
            f=$1; count=$2; size=$3
            mkdir -p /dev/shm
            cur=$(awk '\''$2 == "/dev/shm" && $3 == "tmpfs" { print $4 }'\'' /proc/mounts | tail -n 1)
            if [ -z "$cur" ]; then
                mount -t tmpfs -o "size=${size}m,mode=1777" tmpfs /dev/shm
            else
                kib=$(echo "$cur" | tr , "\n" | sed -n "s/^size=\([0-9]*\)k$/\1/p")
                if [ -n "$kib" ] && [ "$kib" -lt $((size * 1024)) ]; then
                    mount -o "remount,size=${size}m" /dev/shm
                fi
            fi
            rm -f "$f"
            dd if=/dev/zero of="$f" bs=1M count="$count" 2>&1 >/dev/null | grep -v records || true
            [ "$(($(wc -c <"$f") / 1048576))" -ge "$count" ] || { echo "short write to $f (tmpfs full?)"; exit 1; }
        ' incus-hpa-stress "$FILL_FILE" "$need_mib" "$size_mib" 2>&1); then
        log "error: $name: filling failed: ${out:-no output}"
        failed=1
        continue
    fi
    st=$(state_memory "$name" || true)
    now=${st#* }
    [ -n "$st" ] || now=0
    echo "filled $name: wrote $need_mib MiB, memory $(mib "$now") MiB of $(mib "$limit") MiB ($(awk -v u="$now" -v l="$limit" 'BEGIN { printf "%.0f", 100 * u / l }') %)"
done

[ "${#filled[@]}" -gt 0 ] || [ "$failed" -eq 0 ] || die "no instance could be filled" 1

if [ "$hold" -eq 0 ]; then
    echo "fill left in place; release it with: $0 ${project:+--project $project }--release $group"
    exit "$failed"
fi

if [ -n "$seconds" ]; then
    echo "holding for $seconds s (Ctrl-C releases early)"
    sleep "$seconds" &
else
    echo "holding until Ctrl-C"
    sleep infinity &
fi
sleep_pid=$!
wait "$sleep_pid" || true
exit "$failed"
