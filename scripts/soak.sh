#!/usr/bin/env bash
# shellcheck disable=SC2317 # functions run from traps look unreachable
# scripts/soak.sh: runs incus-hpa on this machine's Incus for a long while (60 minutes by
# default) under churn, and shows whether the daemon's memory and open descriptors stay flat.
# Not run by CI: run it as root from anywhere in the repository, after scripts/setup-incus.sh
# (which it runs, idempotently):   sudo scripts/soak.sh [--minutes N]
#
# The daemon (target/release/incus-hpa, built with `cargo build --release`, or --bin PATH) runs
# in the foreground's place with a desired-state file and a control socket in a temporary
# directory, on four groups of its own (soakXXXX-mem, -cpu, -ext, -sched): one on memory, one
# on CPU, one on the number a small root-owned script prints (a file this script changes every
# minute), and one whose schedule window (every 10 minutes, for 4) raises its min. Every minute
# the script does one thing behind the daemon's back, in a fixed cycle: fills the memory group
# (lab/stress.sh), deletes an instance, stops one, edits the file (a max changed, the schedule
# group removed, everything restored) and sends SIGHUP, burns CPU in the CPU group for 90 s,
# freezes an instance, releases the memory, and sends SIGHUP (every other time after saving a
# file that does not parse, restored right after).
#
# It samples the daemon every minute: its resident memory (VmRSS of /proc/PID/status), its
# open descriptors (/proc/PID/fd), its threads and the groups' instances, one table row each;
# at the end it compares the first minutes after the start-up with the last ones.
#
# Nothing goes over the network: Incus is reached on its unix socket, the control socket is a
# unix socket in the temporary directory, no metrics address is set, the program reads a file.
# On any exit (Ctrl-C included) the daemon is stopped (SIGTERM, then waited for), the CPU
# burners are ended, every instance whose config has user.incus-hpa.group equal to one of the
# four groups is deleted (nothing else is touched), and the temporary directory is removed.
#
# --dry-run needs no root, no Incus and no build: a `sleep` stands in for the daemon (it is
# what is sampled), and every command that would change Incus or signal the daemon is printed
# as `would-run ...` instead; with --sample-every 0 it runs the whole cycle at once, to check
# the script itself.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
readonly repo
readonly KEY=user.incus-hpa.group
readonly PROJECT=default
readonly DAEMON_STOP_WAIT=30   # seconds after SIGTERM before the daemon is killed
readonly CPU_BURN=90           # seconds a CPU burner runs
prog=${0##*/}

usage() {
    cat <<EOF
Usage: $prog [--minutes N] [--bin PATH] [--sample-every SECONDS] [--dry-run]

Runs incus-hpa on this machine's Incus for N minutes (default 60) under churn, samples its
memory (VmRSS) and open descriptors every minute, and compares the first minutes with the
last ones. Run it as root; it cleans up everything it created on exit.

Options:
  --minutes N             how long to run (default 60)
  --bin PATH              the incus-hpa binary (default: cargo build --release, then
                          target/release/incus-hpa)
  --sample-every SECONDS  the length of a "minute" (default 60; 0 in a dry run)
  --dry-run               no root, no Incus, no daemon: print what would be done, sample a
                          stand-in process
  -h, --help              show this help
EOF
}

log() { printf '%s: %s\n' "$prog" "$*" >&2; }
usage_error() { log "error: $*"; log "run '$prog --help' for usage"; exit 2; }

minutes=60
bin=
every=60
dry_run=0
while [ $# -gt 0 ]; do
    case $1 in
        -h|--help) usage; exit 0 ;;
        --minutes) [ $# -ge 2 ] || usage_error "--minutes needs a value"; minutes=$2; shift 2 ;;
        --minutes=*) minutes=${1#--minutes=}; shift ;;
        --bin) [ $# -ge 2 ] || usage_error "--bin needs a value"; bin=$2; shift 2 ;;
        --bin=*) bin=${1#--bin=}; shift ;;
        --sample-every) [ $# -ge 2 ] || usage_error "--sample-every needs a value"; every=$2; shift 2 ;;
        --sample-every=*) every=${1#--sample-every=}; shift ;;
        --dry-run) dry_run=1; shift ;;
        *) usage_error "unknown argument: $1" ;;
    esac
done
if ! [[ $minutes =~ ^[0-9]+$ ]] || [ "$((10#$minutes))" -lt 1 ]; then
    usage_error "--minutes must be a whole number of minutes, 1 or more, got '$minutes'"
fi
minutes=$((10#$minutes))
[[ $every =~ ^[0-9]+$ ]] || usage_error "--sample-every must be a whole number of seconds, got '$every'"
every=$((10#$every))
[ "$every" -gt 0 ] || [ "$dry_run" -eq 1 ] || usage_error "--sample-every 0 is for dry runs only"

# A dry run's report goes to the original stdout, wherever the real command's output would go.
exec 3>&1

# run COMMAND...: runs it, or in a dry run prints it.
run() {
    if [ "$dry_run" -eq 1 ]; then
        printf '        would-run %s\n' "$*" >&3
        return 0
    fi
    "$@"
}

# --- state shared with the cleanup ------------------------------------------------------------
workdir=
daemon_pid=
daemon_log=
burners=()
tag=soak$(printf '%04x' $((RANDOM % 65536)))
readonly G_MEM=$tag-mem G_CPU=$tag-cpu G_EXT=$tag-ext G_SCHED=$tag-sched
readonly GROUPS_ALL="$G_MEM $G_CPU $G_EXT $G_SCHED"

stop_daemon() {
    [ -n "$daemon_pid" ] || return 0
    if kill -0 "$daemon_pid" 2>/dev/null; then
        kill -TERM "$daemon_pid" 2>/dev/null || true
        local waited=0
        while kill -0 "$daemon_pid" 2>/dev/null && [ "$waited" -lt $((DAEMON_STOP_WAIT * 5)) ]; do
            sleep 0.2
            waited=$((waited + 1))
        done
        if kill -0 "$daemon_pid" 2>/dev/null; then
            log "warning: the daemon did not exit within ${DAEMON_STOP_WAIT}s of SIGTERM: killing it"
            kill -KILL "$daemon_pid" 2>/dev/null || true
        fi
    fi
    wait "$daemon_pid" 2>/dev/null || true
    daemon_pid=
}

# The instances (any state) whose own config has $KEY equal to group $1 exactly.
group_instances() {
    incus list --project "$PROJECT" "$KEY=$1" -f csv,noheader -c "n,config:$KEY" 2>/dev/null \
        | awk -F, -v g="$1" '$2 == g { print $1 }' || true
}

# The running instances of group $1.
group_running() {
    incus list --project "$PROJECT" "$KEY=$1" -f csv,noheader -c "n,s,config:$KEY" 2>/dev/null \
        | awk -F, -v g="$1" '$2 == "RUNNING" && $3 == g { print $1 }' || true
}

delete_instances() {
    local group name value
    for group in $GROUPS_ALL; do
        for name in $(group_instances "$group"); do
            value=$(incus config get --project "$PROJECT" "$name" "$KEY" 2>/dev/null || true)
            [ "$value" = "$group" ] || continue
            incus delete --project "$PROJECT" --force "$name" >/dev/null 2>&1 \
                || log "warning: could not delete $name"
        done
    done
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    printf '\n== cleanup ==\n'
    stop_daemon
    local pid
    for pid in "${burners[@]}"; do
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    if [ "$dry_run" -eq 0 ]; then
        delete_instances
    fi
    if [ -n "$workdir" ]; then
        if [ "$rc" -ne 0 ] && [ -n "$daemon_log" ] && [ -s "$daemon_log" ]; then
            printf -- '--- last lines of the daemon log ---\n' >&2
            tail -n 30 "$daemon_log" >&2
        fi
        rm -rf "$workdir"
    fi
    exit "$rc"
}

fail() {
    log "error: $*"
    exit 1
}

# --- preparation --------------------------------------------------------------------------------
cd "$repo"
if [ "$dry_run" -eq 0 ]; then
    [ "$(id -u)" -eq 0 ] || { log "error: run me as root (sudo $0): I create containers and run the daemon"; exit 1; }
    scripts/setup-incus.sh
    if [ -z "$bin" ]; then
        # Under sudo, build as the invoking user so that target/ stays theirs.
        if [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ] && command -v sudo >/dev/null 2>&1; then
            home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
            sudo -u "$SUDO_USER" -H env "PATH=$home/.cargo/bin:$PATH" cargo build --release
        else
            PATH="${HOME:-/root}/.cargo/bin:$PATH" cargo build --release
        fi
        bin=$repo/target/release/incus-hpa
    fi
    [ -x "$bin" ] || fail "$bin is not an executable"
fi

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Root's directory (mktemp makes it 0700): the daemon trusts the file, and the program, in it.
workdir=$(mktemp -d /tmp/incus-hpa-soak.XXXXXX)
chmod 0755 "$workdir"
config=$workdir/desired-state.toml
daemon_log=$workdir/incus-hpa.log
queue=$workdir/queue
program=$workdir/queue-depth
printf '0\n' >"$queue"
cat >"$program" <<EOF
#!/bin/sh
# The soak's external signal: the number in $queue.
cat $queue
EOF
chmod 0755 "$program"

# write_config MAX_MEM WITH_SCHED [BROKEN]: writes the desired state (atomically, as an
# editor that renames does); BROKEN writes a file that does not parse.
write_config() {
    local max_mem=$1 with_sched=$2 broken=${3:-0} tmp=$config.new
    {
        cat <<EOF
[daemon]
interval = "5s"
control_socket = "$workdir/control.sock"

[groups.$G_MEM]
min = 1
max = $max_mem
memory_threshold = 50
image = "busybox"
scale_down_stabilization = "30s"
stop_timeout = "1s"

[groups.$G_MEM.config]
"limits.memory" = "64MiB"

[groups.$G_CPU]
min = 1
max = 3
cpu_threshold = 50
image = "busybox"
scale_down_stabilization = "30s"
stop_timeout = "1s"

[groups.$G_CPU.config]
"limits.memory" = "64MiB"
"limits.cpu" = "1"

[groups.$G_EXT]
min = 1
max = 4
image = "busybox"
scale_down_stabilization = "30s"
stop_timeout = "1s"

[[groups.$G_EXT.external]]
command = ["$program"]
target = 10
timeout = "2s"

[groups.$G_EXT.config]
"limits.memory" = "64MiB"
EOF
        if [ "$with_sched" -eq 1 ]; then
            cat <<EOF

[groups.$G_SCHED]
min = 1
max = 3
memory_threshold = 70
image = "busybox"
scale_down_stabilization = "30s"
stop_timeout = "1s"

[[groups.$G_SCHED.schedule]]
cron = "*/10 * * * *"
duration = "4m"
min = 2

[groups.$G_SCHED.config]
"limits.memory" = "64MiB"
EOF
        fi
        [ "$broken" -eq 0 ] || printf '\n[groups.%s\nmax = "oops"\n' "$G_MEM"
    } >"$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$config"
}
write_config 3 1

if [ "$dry_run" -eq 1 ]; then
    # A stand-in for the daemon: what is sampled.
    sleep 1000000 &
    daemon_pid=$!
else
    "$bin" validate --config "$config" >/dev/null || fail "the soak's desired state does not validate"
    # setsid: Ctrl-C reaches this script only, which then stops the daemon with SIGTERM. Its
    # log to the file, not the journal; no systemd notifications.
    env -u JOURNAL_STREAM -u NOTIFY_SOCKET setsid "$bin" run --config "$config" \
        </dev/null >/dev/null 2>"$daemon_log" &
    daemon_pid=$!
fi

# --- churn ----------------------------------------------------------------------------------------
# pick GROUP N: the N-th (modulo) running instance of GROUP; empty when none runs.
pick() {
    if [ "$dry_run" -eq 1 ]; then
        echo "<an instance of $1>"
        return
    fi
    local names=() n
    mapfile -t names < <(group_running "$1")
    n=${#names[@]}
    [ "$n" -gt 0 ] || return 0
    echo "${names[$(($2 % n))]}"
}

hup() { run kill -HUP "$daemon_pid"; }

# churn MINUTE: what minute MINUTE does behind the daemon's back, said in $what (run in this
# shell, not a subshell: the CPU burners it starts are remembered for the cleanup).
what=
churn() {
    local m=$1 groups name cycle
    # shellcheck disable=SC2206 # the names have no spaces
    groups=($GROUPS_ALL)
    cycle=$((m / 8))
    # The external signal: 0 to 39, 10 per instance.
    if [ "$dry_run" -eq 1 ]; then
        printf '        would-write %s %d\n' "$queue" $(((m * 13) % 40)) >&3
    else
        printf '%d\n' $(((m * 13) % 40)) >"$queue"
    fi
    case $((m % 8)) in
        0)
            what="fill $G_MEM to 80 %"
            run "$repo/lab/stress.sh" --project "$PROJECT" --no-hold "$G_MEM" 80 >/dev/null 2>&1 || true
            ;;
        1)
            name=$(pick "${groups[$((cycle % 3))]}" "$m")
            what="delete ${name:-nothing (none running)}"
            [ -z "$name" ] || run incus delete --project "$PROJECT" --force "$name" >/dev/null 2>&1 || true
            ;;
        2)
            name=$(pick "${groups[$(((cycle + 1) % 3))]}" "$m")
            what="stop ${name:-nothing (none running)}"
            [ -z "$name" ] || run incus stop --project "$PROJECT" --force "$name" >/dev/null 2>&1 || true
            ;;
        3)
            case $((cycle % 3)) in
                0) what="edit: $G_MEM max 4, SIGHUP"; write_config 4 1 ;;
                1) what="edit: $G_SCHED removed, SIGHUP"; write_config 3 0 ;;
                2) what="edit: everything restored, SIGHUP"; write_config 3 1 ;;
            esac
            hup
            ;;
        4)
            name=$(pick "$G_CPU" "$m")
            what="burn CPU in ${name:-nothing (none running)} for ${CPU_BURN}s"
            if [ -n "$name" ]; then
                if [ "$dry_run" -eq 1 ]; then
                    run incus exec --project "$PROJECT" -T -n "$name" -- timeout "$CPU_BURN" sh -c 'while :; do :; done'
                else
                    incus exec --project "$PROJECT" -T -n "$name" -- \
                        timeout "$CPU_BURN" sh -c 'while :; do :; done' >/dev/null 2>&1 &
                    burners+=("$!")
                    # Those done need no ending.
                    local pid alive=()
                    for pid in "${burners[@]}"; do
                        ! kill -0 "$pid" 2>/dev/null || alive+=("$pid")
                    done
                    burners=("${alive[@]}")
                fi
            fi
            ;;
        5)
            name=$(pick "${groups[$(((cycle + 2) % 3))]}" "$m")
            what="freeze ${name:-nothing (none running)}"
            [ -z "$name" ] || run incus pause --project "$PROJECT" "$name" >/dev/null 2>&1 || true
            ;;
        6)
            what="release $G_MEM's memory"
            run "$repo/lab/stress.sh" --project "$PROJECT" --release "$G_MEM" >/dev/null 2>&1 || true
            ;;
        7)
            if [ $((cycle % 2)) -eq 0 ]; then
                what="SIGHUP, no change"
                hup
            else
                what="a file that does not parse, SIGHUP; restored, SIGHUP"
                write_config 3 1 1
                hup
                [ "$dry_run" -eq 1 ] || sleep 3
                write_config 3 1
                hup
            fi
            ;;
    esac
}

# --- sampling ---------------------------------------------------------------------------------------
samples_rss=()
samples_fds=()

# sample MINUTE WHAT: one table row; fails when the daemon has died.
sample() {
    local m=$1 what=$2 rss threads fds instances=- group n
    kill -0 "$daemon_pid" 2>/dev/null || fail "the daemon exited (see its log above)"
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$daemon_pid/status")
    threads=$(awk '/^Threads:/ { print $2 }' "/proc/$daemon_pid/status")
    fds=$(find "/proc/$daemon_pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
    if [ "$dry_run" -eq 0 ]; then
        instances=0
        for group in $GROUPS_ALL; do
            n=$(group_instances "$group" | wc -l)
            instances=$((instances + n))
        done
    fi
    samples_rss+=("$rss")
    samples_fds+=("$fds")
    printf '%6d  %9s  %5s  %7s  %9s  %s\n' "$m" "$rss" "$fds" "$threads" "$instances" "$what"
}

# mean FIRST COUNT VALUES...: the mean of COUNT values from index FIRST.
mean() {
    local first=$1 count=$2
    shift 2
    local values=("$@")
    printf '%s\n' "${values[@]:first:count}" | awk '{ s += $1; n++ } END { printf "%.0f", n ? s / n : 0 }'
}

now_s() { local t=${EPOCHREALTIME/[.,]/}; echo $((10#$t / 1000000)); }

printf 'soak: %d minute(s) of %ds, groups %s, daemon pid %s%s\n\n' "$minutes" "$every" \
    "$GROUPS_ALL" "$daemon_pid" "$([ "$dry_run" -eq 0 ] || echo ' (dry run: a stand-in)')"
printf '%6s  %9s  %5s  %7s  %9s  %s\n' minute "rss (kB)" fds threads instances "churn (this minute)"
t0=$(now_s)
sample 0 "start"
for ((m = 1; m <= minutes; m++)); do
    churn "$m"
    # The next sample at the minute's end, whatever the churn took.
    left=$((t0 + m * every - $(now_s)))
    [ "$left" -le 0 ] || sleep "$left"
    sample "$m" "$what"
done

# --- first minutes against the last ones ----------------------------------------------------------------
n=${#samples_rss[@]}
window=$(( minutes / 6 ))
[ "$window" -le 5 ] || window=5
[ "$window" -ge 1 ] || window=1
first=$window                      # after the start-up's minutes
last=$((n - window))
[ "$last" -ge "$first" ] || last=$first
rss_first=$(mean "$first" "$window" "${samples_rss[@]}")
rss_last=$(mean "$last" "$window" "${samples_rss[@]}")
fds_first=$(mean "$first" "$window" "${samples_fds[@]}")
fds_last=$(mean "$last" "$window" "${samples_fds[@]}")
printf '\n== first minutes against the last ones (means of %d sample(s)) ==\n' "$window"
printf 'minutes %d-%d: rss %s kB, %s descriptors\n' "$first" $((first + window - 1)) "$rss_first" "$fds_first"
printf 'minutes %d-%d: rss %s kB, %s descriptors\n' "$last" $((last + window - 1)) "$rss_last" "$fds_last"
awk -v a="$rss_first" -v b="$rss_last" -v f="$fds_first" -v g="$fds_last" 'BEGIN {
    printf "change: rss %+d kB (%+.1f %%), %+d descriptors\n", b - a, a ? 100 * (b - a) / a : 0, g - f
}'
exit 0
