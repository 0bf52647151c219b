#!/usr/bin/env bash
# What it costs the cluster's incusd to be asked for the instances' usage each tick, two ways:
#   metrics: one GET /1.0/metrics?project=default&target=mN per member (3 requests), and
#   state:   one GET /1.0/instances/NAME/state per instance (N requests),
# all through m1 (CLUSTER_URL), as the daemon would. Cost = CPU time of the three members' main
# incusd processes (utime+stime, plus cutime+cstime: the state of a container forks helpers),
# read from /proc/PID/stat on the host, minus their idle rate over the same time.
# Incus caches /1.0/metrics for ~8 s, so the cold metrics rounds are >= 10 s apart; a second
# metrics round right after each cold one shows the cached cost.
#
#   benches/cluster-memory-cost.sh [PER_MEMBER [REPS]]   (defaults 6 and 20; run as root)
#
# Brings the cluster up with scripts/cluster.sh if needed, creates PER_MEMBER busybox instances
# per member named hpa-cm-bench-mN-I, deletes them at the end, and prints a markdown table on
# stdout (progress on stderr).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
per_member=${1:-6}
reps=${2:-20}
log() { printf 'cluster-memory-cost: %s\n' "$*" >&2; }

eval "$("$here/../scripts/cluster.sh" up)"
pin=$(openssl x509 -in "$CLUSTER_SERVER_CERT" -noout -pubkey | openssl pkey -pubin -outform der |
    openssl dgst -sha256 -binary | base64)
hz=$(getconf CLK_TCK)
in_m1() { incus exec hpa-cm1 -- "$@"; }

names=()
for m in 1 2 3; do
    for i in $(seq "$per_member"); do names+=("hpa-cm-bench-m$m-$i"); done
done
cleanup() {
    log "deleting the bench instances"
    in_m1 incus delete --force "${names[@]}" >/dev/null 2>&1 || true
}
trap cleanup EXIT
log "creating ${#names[@]} busybox instances"
for m in 1 2 3; do
    for i in $(seq "$per_member"); do
        in_m1 incus info "hpa-cm-bench-m$m-$i" >/dev/null 2>&1 ||
            in_m1 incus create busybox "hpa-cm-bench-m$m-$i" --target "m$m" -q >/dev/null 2>&1
    done
done
in_m1 incus start "${names[@]}" >/dev/null 2>&1 || true
running=$(in_m1 incus list '^hpa-cm-bench-' -c s -f csv | grep -c RUNNING || true)
[ "$running" = "${#names[@]}" ] || { log "error: only $running of ${#names[@]} bench instances run"; exit 1; }

# The host PID of each member's main incusd (the one whose pid namespace is the member's).
pids=()
for m in 1 2 3; do
    init=$(incus query "/1.0/instances/hpa-cm$m/state" | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
    ns=$(readlink "/proc/$init/ns/pid")
    for p in $(pgrep -f '^/usr/libexec/incus/incusd --group incus-admin'); do
        [ "$(readlink "/proc/$p/ns/pid")" = "$ns" ] && pids+=("$p")
    done
done
[ "${#pids[@]}" = 3 ] || { log "error: found ${#pids[@]} member incusd processes, not 3"; exit 1; }
log "member incusd host pids: ${pids[*]}"

# cpu_ticks: clock ticks used so far by the three incusd (utime+stime+cutime+cstime).
cpu_ticks() {
    local p total=0 f
    for p in "${pids[@]}"; do
        # Fields after the ")" that ends the command name: utime is the 12th, cstime the 15th.
        f=$(sed 's/^.*) //' "/proc/$p/stat")
        # shellcheck disable=SC2086
        set -- $f
        total=$((total + ${12} + ${13} + ${14} + ${15}))
    done
    echo "$total"
}
now_ms() { date +%s%3N; }

# fetch URL_PATH...: GETs them all through m1 on one keep-alive connection; fails on a non-200.
fetch() {
    local args=() p
    for p in "$@"; do args+=("$CLUSTER_URL$p" -o /dev/null); done
    codes=$(curl -sk --pinnedpubkey "sha256//$pin" --cert "$CLUSTER_CERT" --key "$CLUSTER_KEY" \
        -w '%{http_code}\n' "${args[@]}")
    if printf '%s\n' "$codes" | grep -qv '^200$'; then
        log "error: a request failed: $(printf '%s' "$codes" | tr '\n' ' ')"
        exit 1
    fi
}
metrics_paths=()
for m in 1 2 3; do metrics_paths+=("/1.0/metrics?project=default&target=m$m"); done
state_paths=()
for n in "${names[@]}"; do state_paths+=("/1.0/instances/$n/state?project=default"); done

# measure KIND PATH...: prints "ticks wall_ms" for one round.
measure() {
    local t0 c0
    shift
    c0=$(cpu_ticks)
    t0=$(now_ms)
    fetch "$@"
    echo "$(($(cpu_ticks) - c0)) $(($(now_ms) - t0))"
}

# /1.0/metrics covers every instance of the project on the member, bench or not.
covered=0
for p in "${metrics_paths[@]}"; do
    c=$(curl -sk --pinnedpubkey "sha256//$pin" --cert "$CLUSTER_CERT" --key "$CLUSTER_KEY" "$CLUSTER_URL$p" |
        grep -o '^incus_cpu_seconds_total{[^}]*name="[^"]*"' | sed 's/.*name="//' | sort -u | wc -l)
    covered=$((covered + c))
done
[ "$covered" = "${#names[@]}" ] || log "note: /1.0/metrics covers $covered instances, not only the ${#names[@]} bench ones"

log "warming up (one round of each, then 12 s idle to measure the idle rate)"
fetch "${metrics_paths[@]}"
fetch "${state_paths[@]}"
sleep 10
c0=$(cpu_ticks)
t0=$(now_ms)
sleep 12
idle_ticks=$(($(cpu_ticks) - c0))
idle_ms=$(($(now_ms) - t0))

declare -A ticks wall
for k in cold cached state; do ticks[$k]=0; wall[$k]=0; done
for r in $(seq "$reps"); do
    read -r t w < <(measure cold "${metrics_paths[@]}")
    ticks[cold]=$((ticks[cold] + t)); wall[cold]=$((wall[cold] + w))
    read -r t w < <(measure cached "${metrics_paths[@]}")
    ticks[cached]=$((ticks[cached] + t)); wall[cached]=$((wall[cached] + w))
    sleep 5
    read -r t w < <(measure state "${state_paths[@]}")
    ticks[state]=$((ticks[state] + t)); wall[state]=$((wall[state] + w))
    log "round $r/$reps: cold metrics ${ticks[cold]}, cached ${ticks[cached]}, state ${ticks[state]} ticks so far"
    sleep 5
done

python3 - "$hz" "$reps" "${#names[@]}" "$covered" "$idle_ticks" "$idle_ms" \
    "${ticks[cold]}" "${wall[cold]}" "${ticks[cached]}" "${wall[cached]}" "${ticks[state]}" "${wall[state]}" <<'PY'
import sys
hz, reps, n, covered, idle_t, idle_ms = map(int, sys.argv[1:7])
v = list(map(int, sys.argv[7:]))
idle_rate = idle_t * 1000 / hz / idle_ms  # CPU ms per wall ms
rows = {}
for i, (k, label, count) in enumerate([("cold", "metrics, cold (3 req/tick)", covered),
                                       ("cached", "metrics, cached (3 req/tick)", covered),
                                       ("state", f"instance state ({n} req/tick)", n)]):
    t, w = v[2 * i], v[2 * i + 1]
    cpu_ms = t * 1000 / hz
    net = max(cpu_ms - idle_rate * w, 0)
    rows[k] = (label, cpu_ms / reps, w / reps, net / reps / count)
print(f"{n} running instances on 3 members ({covered} in /1.0/metrics), {reps} ticks each; CPU of the 3 member incusd "
      f"(CLK_TCK {hz}); idle {idle_rate * 1000:.1f} CPU ms/s subtracted\n")
print("| way | CPU ms / tick (raw) | wall ms / tick | CPU ms / instance / tick (net of idle) |")
print("|---|---:|---:|---:|")
for k in ("cold", "cached", "state"):
    label, cpu, wall, per = rows[k]
    print(f"| {label} | {cpu:.1f} | {wall:.0f} | {per:.3f} |")
c, s = rows["cold"][3], rows["state"][3]
print(f"\nstate / cold metrics: {s / c:.2f}x" if c > 0 else "\ncold metrics cost rounded to 0")
PY
