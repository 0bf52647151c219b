#!/usr/bin/env bash
# shellcheck disable=SC2317 # functions run from traps and through wait_for look unreachable
# lab/demo.sh: a complete scale-up / scale-down cycle of incus-hpa on this machine, in about
# a minute. Run it as root from anywhere in the repository:   sudo lab/demo.sh
#
#   1. sets Incus up (scripts/setup-incus.sh, idempotent) and builds the daemon
#      (cargo build --release);
#   2. validates examples/lab.toml and runs `incus-hpa run` on it in the background, its log
#      in a temporary directory;
#   3. waits for the group `lab` to reach min (1) running instances, fills their memory to
#      ~80 % of limits.memory with lab/stress.sh (memory_threshold: 30), waits for the daemon to
#      add instances, shows the peak, releases the memory and waits for the group to shrink
#      back to min;
#   4. prints a summary (peak, seconds to scale up, seconds to scale down).
#
# A live timeline shows, once a second: elapsed time, running instances of the group, their
# average memory use (read from the cgroup files, or the Incus API when those are missing)
# and the daemon's last decision; the daemon's actions (create/delete) appear as they happen.
# Each phase has a deadline: when one is missed the script prints the daemon log's tail and
# exits 1. On any exit (Ctrl-C included) the daemon is stopped (SIGTERM, then waited for) and
# every instance whose config has user.incus-hpa.group=lab exactly is stopped and deleted;
# nothing else is touched.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
readonly repo
readonly GROUP=lab
readonly KEY=user.incus-hpa.group
readonly PROJECT=default          # examples/lab.toml: project = "default"
readonly FILL_PERCENT=80          # memory fill, percent of limits.memory
# Deadlines (seconds) of the phases; together well under three minutes.
readonly DEADLINE_MIN=40          # daemon start-up until min instances run
readonly DEADLINE_UP=40           # fill until more instances run
readonly PEAK_QUIET=6             # after a scale-up: watch this long without change for the peak
readonly PEAK_MAX=20              # ... but no longer than this
readonly DEADLINE_DOWN=75         # release until back to min (scale_down_stabilization: 20s)
readonly DAEMON_STOP_WAIT=30      # SIGTERM until the daemon must have exited

prog=${0##*/}
say() { printf '%s\n' "$*"; }
log() { printf '%s: %s\n' "$prog" "$*" >&2; }
phase() { printf '\n== %s ==\n' "$*"; }

# --- state shared with the cleanup --------------------------------------------------------
workdir=
daemon_pid=
daemon_log=
log_seen=0

# Stops the daemon (SIGTERM, waits for it; SIGKILL only if it hangs).
stop_daemon() {
    [ -n "$daemon_pid" ] || return 0
    if kill -0 "$daemon_pid" 2>/dev/null; then
        say "stopping the daemon (SIGTERM to pid $daemon_pid)"
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
    local rc=0
    wait "$daemon_pid" 2>/dev/null || rc=$?
    [ "$rc" -eq 0 ] || log "warning: the daemon exited with status $rc"
    daemon_pid=
}

# Names of the instances (any state) whose own config has $KEY == $GROUP exactly.
lab_instances() {
    incus list --project "$PROJECT" "$KEY=$GROUP" -f csv,noheader -c "n,config:$KEY" 2>/dev/null \
        | awk -F, -v g="$GROUP" '$2 == g { print $1 }' || true
}

# Stops (by force) and deletes every instance of the group, after checking the key once more.
delete_lab_instances() {
    local name value
    for name in $(lab_instances); do
        value=$(incus config get --project "$PROJECT" "$name" "$KEY" 2>/dev/null || true)
        if [ "$value" != "$GROUP" ]; then
            log "warning: $name: $KEY is '$value', not '$GROUP': left alone"
            continue
        fi
        incus stop --project "$PROJECT" --force "$name" >/dev/null 2>&1 || true
        if incus delete --project "$PROJECT" "$name" >/dev/null 2>&1; then
            say "deleted $name"
        else
            log "warning: could not delete $name"
        fi
    done
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    phase "cleanup"
    stop_daemon
    delete_lab_instances
    if [ -n "$workdir" ]; then
        if [ "$rc" -eq 0 ]; then
            rm -rf "$workdir"
        else
            say "daemon log kept: $daemon_log"
        fi
    fi
    exit "$rc"
}

fail() {
    log "error: $*"
    if [ -n "$daemon_log" ] && [ -s "$daemon_log" ]; then
        printf '\n--- last lines of the daemon log (%s) ---\n' "$daemon_log" >&2
        tail -n 40 "$daemon_log" >&2
        printf -- '---\n' >&2
    fi
    exit 1
}

# --- preparation --------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || { log "error: run me as root (sudo $0): I set Incus up and create containers"; exit 1; }
cd "$repo"

phase "setting Incus up (scripts/setup-incus.sh)"
scripts/setup-incus.sh

phase "building incus-hpa (cargo build --release)"
build() {
    # Under sudo, build as the invoking user so that target/ stays theirs.
    if [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ] && command -v sudo >/dev/null 2>&1; then
        local home
        home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
        sudo -u "$SUDO_USER" -H env "PATH=$home/.cargo/bin:$PATH" cargo build --release
    else
        PATH="${HOME:-/root}/.cargo/bin:$PATH" cargo build --release
    fi
}
build || { log "error: cargo build --release failed (is Rust installed? https://rustup.rs)"; exit 1; }
bin=$repo/target/release/incus-hpa
[ -x "$bin" ] || { log "error: $bin was not built"; exit 1; }

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

workdir=$(mktemp -d /tmp/incus-hpa-demo.XXXXXX)
daemon_log=$workdir/incus-hpa.log
# The daemon refuses a desired-state file writable by others or owned by another user (a
# checkout's files may be): run it on a root-owned copy.
config=$workdir/lab.toml
install -m 0644 examples/lab.toml "$config"

# A few values of [groups.lab], for the messages and the conditions below.
lab_value() {
    awk -v k="$1" '/^\[/ { in_lab = ($0 == "[groups.lab]") }
        in_lab && $1 == k && $2 == "=" { v = $3; gsub(/"/, "", v); print v; exit }' "$config"
}
min=$(lab_value min)
max=$(lab_value max)
threshold=$(lab_value memory_threshold)
window=$(lab_value scale_down_stabilization)
[[ $min =~ ^[0-9]+$ ]] || min=1
[[ $max =~ ^[0-9]+$ ]] || max=4

phase "validating examples/lab.toml"
"$bin" validate --config "$config" || fail "examples/lab.toml does not validate"

leftovers=$(lab_instances | wc -l)
if [ "$leftovers" -gt 0 ]; then
    phase "removing $leftovers instance(s) left by an earlier run of group '$GROUP'"
    delete_lab_instances
fi

phase "starting the daemon: incus-hpa run --config examples/lab.toml (log: $daemon_log)"
# setsid: Ctrl-C reaches this script only, which then stops the daemon with SIGTERM.
setsid "$bin" run --config "$config" </dev/null >/dev/null 2>"$daemon_log" &
daemon_pid=$!

# --- observation ----------------------------------------------------------------------------
now_us() { local t=${EPOCHREALTIME/[.,]/}; echo "$((10#$t))"; }
secs() { awk -v us="$1" 'BEGIN { printf "%.1f", us / 1000000 }'; }
t0=$(now_us)

running=0      # running instances of the group
total=0        # instances of the group, any state
avg=           # average memory use of the running ones, percent ("" when unknown)
peak=0

# Memory use of one running instance, percent of its limit ("" when unreadable).
mem_percent() {
    local name=$1 u='' l='' st
    local v1=/sys/fs/cgroup/memory/lxc.payload.$name v2=/sys/fs/cgroup/lxc.payload.$name
    if [ -r "$v1/memory.usage_in_bytes" ]; then
        u=$(cat "$v1/memory.usage_in_bytes" 2>/dev/null || true)
        l=$(cat "$v1/memory.limit_in_bytes" 2>/dev/null || true)
    elif [ -r "$v2/memory.current" ]; then
        u=$(cat "$v2/memory.current" 2>/dev/null || true)
        l=$(cat "$v2/memory.max" 2>/dev/null || true)
    fi
    # Unlimited ("max", or v1's huge number) or unreadable: ask Incus (usage, effective total).
    if ! [[ $u =~ ^[0-9]+$ && $l =~ ^[0-9]+$ ]] || [ "${#l}" -ge 19 ]; then
        st=$(incus query "/1.0/instances/$name/state?project=$PROJECT" 2>/dev/null | awk '
            /"memory"[[:space:]]*:[[:space:]]*\{/ { m = 1; next }
            m && /\}/ { m = 0 }
            m && /"total"[[:space:]]*:/ { gsub(/[^0-9]/, ""); t = $0 }
            m && /"usage"[[:space:]]*:/ { gsub(/[^0-9]/, ""); u = $0 }
            END { if (t != "" && u != "") print u, t }' || true)
        u=${st% *}
        l=${st#* }
    fi
    [[ $u =~ ^[0-9]+$ && $l =~ ^[0-9]+$ ]] && [ "$l" -gt 0 ] || return 0
    awk -v u="$u" -v l="$l" 'BEGIN { printf "%.1f", 100 * u / l }'
}

observe() {
    local rows row name status p sum=0 n=0
    rows=$(incus list --project "$PROJECT" "$KEY=$GROUP" -f csv,noheader -c "n,s,config:$KEY" 2>/dev/null \
        | awk -F, -v g="$GROUP" '$3 == g { print $1 "," $2 }' || true)
    running=0
    total=0
    for row in $rows; do
        name=${row%%,*}
        status=${row#*,}
        total=$((total + 1))
        [ "$status" = RUNNING ] || continue
        running=$((running + 1))
        p=$(mem_percent "$name")
        if [ -n "$p" ]; then
            sum=$(awk -v a="$sum" -v b="$p" 'BEGIN { print a + b }')
            n=$((n + 1))
        fi
    done
    avg=
    [ "$n" -eq 0 ] || avg=$(awk -v s="$sum" -v n="$n" 'BEGIN { printf "%.1f", s / n }')
    [ "$running" -le "$peak" ] || peak=$running
}

# The daemon's last decision for the group: its group/current/desired/utilization/reason.
last_decision() {
    awk -v g="$GROUP" '
        { gsub(/\033\[[0-9;]*m/, "") }
        / desired=/ && ($0 ~ (" group=\"?" g "\"?( |$)")) { last = $0 }
        END {
            n = split(last, w, " ")
            out = ""
            for (i = 1; i <= n; i++)
                if (w[i] ~ /^(group|current|desired|utilization|reason)=/) {
                    gsub(/"/, "", w[i])
                    out = out (out == "" ? "" : " ") w[i]
                }
            print (out == "" ? "(none yet)" : out)
        }' "$daemon_log" 2>/dev/null || true
}

# New action, warning and error lines of the daemon log, trimmed.
new_events() {
    local lines
    lines=$(wc -l <"$daemon_log" 2>/dev/null || echo 0)
    [ "$lines" -gt "$log_seen" ] || return 0
    awk -v from="$log_seen" -v stamp="$1" '
        NR <= from { next }
        { gsub(/\033\[[0-9;]*m/, "") }
        / action=/ {
            n = split($0, w, " ")
            out = ""
            for (i = 1; i <= n; i++)
                if (w[i] ~ /^(instance|action|reason|outcome|error)=/) {
                    gsub(/"/, "", w[i])
                    out = out " " w[i]
                }
            printf "%s   >> daemon:%s\n", stamp, out
            next
        }
        / (WARN|ERROR) / {
            sub(/^[^ ]* +/, "")
            printf "%s   >> daemon: %s\n", stamp, substr($0, 1, 160)
        }' "$daemon_log" 2>/dev/null || true
    log_seen=$lines
}

# One timeline line (and the daemon's new events); fails when the daemon has died.
tick() {
    local stamp others='' mem=-
    stamp=$(printf '[%6ss]' "$(secs $(($(now_us) - t0)))")
    # Events first: the listing that follows is then at least as recent as the log.
    new_events "$stamp"
    observe
    [ -z "$avg" ] || mem="$avg%"
    [ "$total" -eq "$running" ] || others=" (+$((total - running)) not running)"
    printf '%s running=%d%s avg_mem=%s | last decision: %s\n' \
        "$stamp" "$running" "$others" "$mem" "$(last_decision)"
    if ! kill -0 "$daemon_pid" 2>/dev/null; then
        local rc=0
        wait "$daemon_pid" 2>/dev/null || rc=$?
        daemon_pid=
        fail "the daemon exited (status $rc)"
    fi
}
next_tick=
# Sleeps until one second after the previous tick.
pace() {
    local now
    now=$(now_us)
    [ -n "$next_tick" ] || next_tick=$now
    next_tick=$((next_tick + 1000000))
    if [ "$next_tick" -gt "$now" ]; then
        sleep "$(secs $((next_tick - now)))"
    else
        next_tick=$now
    fi
}

# wait_for DESCRIPTION DEADLINE_SECONDS CONDITION...: ticks until CONDITION holds.
wait_for() {
    local what=$1 deadline=$2 start
    shift 2
    start=$(now_us)
    while :; do
        tick
        if "$@"; then
            return 0
        fi
        if [ $(($(now_us) - start)) -ge $((deadline * 1000000)) ]; then
            fail "deadline missed: $what took more than ${deadline}s"
        fi
        pace
    done
}
at_least_min() { [ "$running" -ge "$min" ]; }
above_min() { [ "$running" -gt "$min" ]; }
back_to_min() { [ "$total" -eq "$min" ] && [ "$running" -eq "$min" ]; }

# --- the scenario ---------------------------------------------------------------------------
phase "1/4 waiting for min=$min running instance(s) (deadline ${DEADLINE_MIN}s)"
wait_for "reaching min=$min" "$DEADLINE_MIN" at_least_min

phase "2/4 filling memory to ~${FILL_PERCENT}% (threshold ${threshold}%): lab/stress.sh --no-hold $GROUP $FILL_PERCENT"
"$repo/lab/stress.sh" --project "$PROJECT" --no-hold "$GROUP" "$FILL_PERCENT" | sed 's/^/    /' \
    || fail "lab/stress.sh could not fill the instances"
t_fill=$(now_us)

phase "3/4 waiting for the daemon to scale up (deadline ${DEADLINE_UP}s)"
wait_for "scaling up" "$DEADLINE_UP" above_min
t_up=$(now_us)
# Watch until the count has not changed for PEAK_QUIET seconds, to see the peak.
last_change=$t_up
last_count=$running
watch_start=$t_up
while [ $(($(now_us) - last_change)) -lt $((PEAK_QUIET * 1000000)) ] \
    && [ $(($(now_us) - watch_start)) -lt $((PEAK_MAX * 1000000)) ]; do
    pace
    tick
    if [ "$running" -ne "$last_count" ]; then
        last_count=$running
        last_change=$(now_us)
    fi
done
say "peak: $peak running instance(s) (min $min, max $max)"

phase "4/4 releasing the memory (lab/stress.sh --release $GROUP), waiting for min=$min (deadline ${DEADLINE_DOWN}s)"
"$repo/lab/stress.sh" --project "$PROJECT" --release "$GROUP" | sed 's/^/    /' \
    || fail "lab/stress.sh could not release the memory"
t_release=$(now_us)
wait_for "scaling back down to min=$min" "$DEADLINE_DOWN" back_to_min
t_down=$(now_us)

phase "summary"
say "peak instances:   $peak (min $min, max $max)"
say "scale-up:         $(secs $((t_up - t_fill))) s after the fill to ${FILL_PERCENT}% (threshold ${threshold}%)"
say "scale-down:       $(secs $((t_down - t_release))) s after the release (scale_down_stabilization $window)"
say "whole scenario:   $(secs $((t_down - t0))) s"
exit 0
