#!/usr/bin/env bash
# The daemon on this host's Incus with N real instances in G groups: what it and incusd cost in
# a steady state. The release daemon creates the instances itself (each group's min is N/G,
# busybox, no network device), then, once every group holds its min and has been steady for
# SETTLE seconds, for S seconds: the daemon's CPU, incusd's CPU (its helpers included) and the
# passes the daemon made; then the daemon is stopped and incusd's CPU is measured alone for S
# seconds more (side by side: what incusd spends anyway with N instances running). Prints the
# daemon's resident memory and the cost per instance per tick. Deletes its instances at the end.
#
# Needs scripts/setup-incus.sh (Incus and the busybox image) and a release build
# (cargo build --release, or BIN=PATH). Run, as root: bash benches/real-fleet.sh [N] [G] [S]
# (1000 10 30). Not run by CI: at N = 1,000 it takes about 6 minutes and 14 GiB of memory here.
set -euo pipefail

N=${1:-1000}
G=${2:-10}
S=${3:-30}
SETTLE=${SETTLE:-20}
PER=$(( (N + G - 1) / G ))
N=$(( PER * G ))
BIN=${BIN:-target/release/incus-hpa}
[ -x "$BIN" ] || { echo "real-fleet: no $BIN: run cargo build --release first" >&2; exit 1; }
dir=$(mktemp -d /tmp/incus-hpa-real-fleet.XXXXXX)
sock="$dir/control.sock"
daemon=""

cleanup() {
    if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
        kill -TERM "$daemon"; wait "$daemon" || true
    fi
    echo "real-fleet: deleting the instances" >&2
    incus list --format csv -c n | grep '^realfleet' | xargs -r -P 4 -n 25 incus delete -f || true
    rm -rf "$dir"
}
trap cleanup EXIT

{
    printf '[daemon]\ninterval = "1s"\ncontrol_socket = "%s"\nmemory_source = "cgroup"\n' "$sock"
    for g in $(seq 0 $((G - 1))); do
        printf '\n[groups.realfleet%02d]\nmin = %d\nmax = %d\nmemory_threshold = 50\nimage = "busybox"\n' \
            "$g" "$PER" $((PER * 2))
        printf '\n[groups.realfleet%02d.config]\n"limits.memory" = "64MiB"\n' "$g"
    done
} > "$dir/hpa.toml"

# CPU time of a process, in clock ticks: utime + stime, with its reaped children's when $2 is set.
ticks() {
    awk -v kids="${2:-}" '{ sub(/.*\) /, ""); t = $12 + $13; if (kids) t += $14 + $15; print t }' \
        "/proc/$1/stat"
}
incusd=$(pgrep -x incusd | head -1)
hz=$(getconf CLK_TCK)
passes() {
    curl -s --unix-socket "$sock" http://incus-hpa/metrics |
        awk '/^incus_hpa_reconcile_duration_seconds_count/ { s += $2 } END { print s + 0 }'
}
steady() {
    "$BIN" status --json --control-socket "$sock" 2>/dev/null |
        python3 -c 'import json, sys
d = json.load(sys.stdin)
ok = all(g["current"] == g["min"] and g["standby"] is None for g in d["groups"])
sys.exit(0 if ok and d["groups"] else 1)' 2>/dev/null
}

start=$(date +%s.%N)
RUST_LOG=incus_hpa=warn "$BIN" run --config "$dir/hpa.toml" 2> "$dir/daemon.log" &
daemon=$!
until steady; do
    kill -0 "$daemon" || { tail -20 "$dir/daemon.log"; exit 1; }
    sleep 2
done
echo "real-fleet: $N instances in $G groups running after $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }') s" >&2
sleep "$SETTLE"

d0=$(ticks "$daemon"); i0=$(ticks "$incusd" kids); p0=$(passes); t0=$(date +%s.%N)
sleep "$S"
d1=$(ticks "$daemon"); i1=$(ticks "$incusd" kids); p1=$(passes); t1=$(date +%s.%N)
rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$daemon/status")
hwm=$(awk '/^VmHWM/ { print $2 }' "/proc/$daemon/status")
kill -TERM "$daemon"; wait "$daemon" || true; daemon=""
sleep 5
j0=$(ticks "$incusd" kids); u0=$(date +%s.%N)
sleep "$S"
j1=$(ticks "$incusd" kids); u1=$(date +%s.%N)

python3 - "$N" "$G" "$hz" "$d0" "$d1" "$i0" "$i1" "$p0" "$p1" "$t0" "$t1" "$j0" "$j1" "$u0" "$u1" "$rss" "$hwm" <<'EOF'
import sys
n, g, hz = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
d0, d1, i0, i1, p0, p1, t0, t1, j0, j1, u0, u1, rss, hwm = map(float, sys.argv[4:])
secs, alone = t1 - t0, u1 - u0
daemon = (d1 - d0) / hz * 1000 / secs          # ms of CPU per second
incusd = (i1 - i0) / hz * 1000 / secs
base = (j1 - j0) / hz * 1000 / alone
ticks = (p1 - p0) / secs / g                    # passes per group per second
per = lambda ms: ms / n / max(ticks, 1e-9)
print("| instances / groups | daemon CPU ms/s | incusd CPU ms/s, with the daemon / without | "
      "daemon + incusd's extra, ms per instance per tick | passes per group per s | daemon RSS MiB (peak) |")
print("|---|---|---|---|---|---|")
print(f"| {n} / {g} | {daemon:.1f} | {incusd:.1f} / {base:.1f} | "
      f"{per(daemon + incusd - base):.4f} (daemon alone {per(daemon):.4f}) | {ticks:.2f} | "
      f"{rss / 1024:.1f} ({hwm / 1024:.1f}) |")
EOF
