#!/usr/bin/env bash
# The daemon on this host's Incus with N real instances in G groups: what it and incusd cost in
# a steady state, how fast one group reacts to a memory fill beside them, and how fast one group
# bursts beside them against the bare API. The release daemon creates the instances itself
# (each group's min is N/G, busybox, no network device), beside two groups of one instance:
# `realfleetx` (the fill) and `realfleetb` (the burst). Then, side by side in one run:
#
#  1. steady: once every group holds the count it wants (its min; after the fills,
#     `realfleetx` wants more) and has been steady for SETTLE seconds, for S
#     seconds, the daemon's CPU, incusd's CPU (its helpers included), the passes the daemon
#     made and its resident memory; with BEFORE=PATH (another build), the same for that build
#     restarted on the same instances, and for this build restarted too (a restart lists every
#     instance at once, where the first run created them one by one);
#  2. the fill (FILLS rounds, 3; 0 skips): one instance of `realfleetx` has 40 MiB of its
#     64 MiB filled (a tmpfs), and the time from the start of that command to the daemon's
#     "scaling up" of the group is its reaction (the round's instance is a new one each time);
#  3. the burst (BURST, 200; 0 skips): BURST - 1 create+start requests straight to Incus'
#     API, max_parallel_actions (4) at a time, beside the running instances with the daemon
#     stopped (timed, then deleted), then the daemon started again and `realfleetb`'s min
#     raised from 1 to BURST by a reload (SIGHUP), timed from the reload to the last creation
#     the daemon logs as done;
#  4. incusd alone, for S seconds, with the daemon stopped.
#
# Needs scripts/setup-incus.sh (Incus and the busybox image) and a release build
# (cargo build --release, or BIN=PATH). Run, as root: bash benches/real-fleet.sh [N] [G] [S]
# (1000 10 30). KEEP=1 leaves the instances of the G groups (a next run adopts them: its
# "running after" is then the adoption). WAIT (1800) is how many seconds the daemon may take to
# bring every group to its count; each wait has a deadline and ends the run with an error. At
# N = 1,000 it takes about 10 minutes and 17 GiB of memory here; CI runs it at N = 4
# (scripts/test.sh: SETTLE=2 FILLS=1 BURST=3 bash benches/real-fleet.sh 4 2 2, about a minute).
set -euo pipefail

N=${1:-1000}
G=${2:-10}
S=${3:-30}
SETTLE=${SETTLE:-20}
FILLS=${FILLS:-3}
BURST=${BURST:-200}
WAIT=${WAIT:-1800}
PARALLEL=4
PER=$(( (N + G - 1) / G ))
N=$(( PER * G ))
BIN=${BIN:-target/release/incus-hpa}
[ -x "$BIN" ] || { echo "real-fleet: no $BIN: run cargo build --release first" >&2; exit 1; }
if [ -n "${BEFORE:-}" ] && [ ! -x "$BEFORE" ]; then
    echo "real-fleet: BEFORE=$BEFORE is not an executable" >&2; exit 1
fi
SOCKET=/var/lib/incus/unix.socket
dir=$(mktemp -d /tmp/incus-hpa-real-fleet.XXXXXX)
sock="$dir/control.sock"
daemon=""
log=""

stop_daemon() {
    if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
        kill -TERM "$daemon"; wait "$daemon" || true
    fi
    daemon=""
}
# What the last daemon learned of the groups (the summary a stopped daemon leaves in Incus for
# the next holder of a group's lease): forgotten before a run and after it, so that each run
# starts from nothing, as the first did.
forget_learned() {
    for g in $(seq -f 'realfleet%02g' 0 $((G - 1))) realfleetx realfleetb; do
        incus profile unset incus-hpa.learned "user.incus-hpa.learned.default.$g" 2>/dev/null || true
    done
}
cleanup() {
    stop_daemon
    if [ -z "${KEEP:-}" ]; then
        forget_learned
        echo "real-fleet: deleting the instances" >&2
        incus list --format csv -c n | grep '^realfleet' | xargs -r -P 4 -n 25 incus delete -f || true
    else
        incus list --format csv -c n | grep -E '^realfleet(api|x|b)-' | xargs -r -P 4 -n 25 incus delete -f || true
    fi
    if [ -n "${LOGS:-}" ]; then cp "$dir"/*.log "$LOGS"/; fi
    rm -rf "$dir"
}
trap cleanup EXIT
# A `timeout` (or ^C) ends the run through the cleanup too.
trap 'exit 143' TERM INT

config() { # $1: the burst group's min
    printf '[daemon]\ninterval = "1s"\ncontrol_socket = "%s"\nmemory_source = "cgroup"\n' "$sock"
    printf 'max_parallel_actions = %d\n' "$PARALLEL"
    group() {
        printf '\n[groups.%s]\nmin = %d\nmax = %d\nmemory_threshold = 50\nimage = "busybox"\n' "$1" "$2" "$3"
        printf '\n[groups.%s.config]\n"limits.memory" = "64MiB"\n' "$1"
    }
    for g in $(seq 0 $((G - 1))); do
        group "$(printf 'realfleet%02d' "$g")" "$PER" $((PER * 2))
    done
    group realfleetx 1 10
    group realfleetb "$1" "$(( BURST > 1 ? BURST : 2 ))"
}
config 1 > "$dir/hpa.toml"

# CPU time of a process, in clock ticks: utime + stime, with its reaped children's when $2 is set.
ticks() {
    awk -v kids="${2:-}" '{ sub(/.*\) /, ""); t = $12 + $13; if (kids) t += $14 + $15; print t }' \
        "/proc/$1/stat"
}
# incusd itself: each instance's `[lxc monitor]` process is called incusd too.
incusd=$(for p in $(pgrep -x incusd); do
    # (A monitor may exit meanwhile: its file is then gone.)
    case "$(tr '\0' ' ' 2>/dev/null < "/proc/$p/cmdline" || true)" in "[lxc"*|"") ;; *) echo "$p" ;; esac
done | head -1)
[ -n "$incusd" ] || { echo "real-fleet: no incusd runs (scripts/setup-incus.sh starts it)" >&2; exit 1; }
hz=$(getconf CLK_TCK)
now() { date +%s.%N; }
passes() {
    curl -s -m 10 --unix-socket "$sock" http://incus-hpa/metrics |
        awk '/^incus_hpa_reconcile_duration_seconds_count/ { s += $2 } END { print s + 0 }'
}
# The requests the daemon sent Incus so far (its own count), every kind.
requests() {
    curl -s -m 10 --unix-socket "$sock" http://incus-hpa/metrics |
        awk '/^incus_hpa_incus_requests_total/ { s += $2 } END { print s + 0 }'
}
status() { "$BIN" status --json --control-socket "$sock" 2>/dev/null; }
steady() {
    status | python3 -c 'import json, sys
d = json.load(sys.stdin)
ok = all(g["reason"] != "pending" and g["current"] == g["desired"] and g["standby"] is None
         for g in d["groups"])
sys.exit(0 if ok and d["groups"] else 1)' 2>/dev/null
}
# The time of the first line of the daemon's log after $1 (seconds) that has every other
# argument in it; empty while there is none.
logged() {
    python3 - "$log" "$@" <<'EOF'
import datetime, sys
path, since, parts = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
for line in open(path, errors="replace"):
    if not all(p in line for p in parts):
        continue
    t = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()
    if t >= since:
        print(f"{t:.3f}")
        break
EOF
}
start_daemon() { # $1: the binary, $2: a name for its log
    log="$dir/$2.log"
    RUST_LOG=incus_hpa=info "$1" run --config "$dir/hpa.toml" 2> "$log" &
    daemon=$!
    local deadline=$(( $(date +%s) + WAIT ))
    until steady; do
        kill -0 "$daemon" || { tail -20 "$log"; exit 1; }
        [ "$(date +%s)" -lt "$deadline" ] || {
            tail -20 "$log"
            echo "real-fleet: the groups were not steady within WAIT=$WAIT s" >&2; exit 1
        }
        sleep 2
    done
}
rows=()
# Measures the daemon running now for S seconds; $1 names the row.
measure() {
    sleep "$SETTLE"
    local d0 i0 p0 t0 r0 d1 i1 p1 t1 r1 rss hwm anon file
    d0=$(ticks "$daemon"); i0=$(ticks "$incusd" kids); p0=$(passes); r0=$(requests); t0=$(now)
    sleep "$S"
    d1=$(ticks "$daemon"); i1=$(ticks "$incusd" kids); p1=$(passes); r1=$(requests); t1=$(now)
    rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$daemon/status")
    hwm=$(awk '/^VmHWM/ { print $2 }' "/proc/$daemon/status")
    anon=$(awk '/^RssAnon/ { print $2 }' "/proc/$daemon/status")
    file=$(awk '/^RssFile/ { print $2 }' "/proc/$daemon/status")
    rows+=("$1 $d0 $d1 $i0 $i1 $p0 $p1 $t0 $t1 $rss $hwm $anon $file $r0 $r1")
}

forget_learned
start=$(now)
start_daemon "$BIN" now
echo "real-fleet: $N instances in $G groups (and 2 of one) running after $(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.0f", b - a }') s" >&2
measure "now"
if [ -n "${BEFORE:-}" ]; then
    stop_daemon; start_daemon "$BEFORE" before; measure "before,restarted"
    stop_daemon; start_daemon "$BIN" now-again; measure "now,restarted"
fi

# 2. The fill: each round fills a new instance of realfleetx and waits for the scale-up.
reactions=()
filled=" "
for round in $(seq 1 "$FILLS"); do
    # A running instance of the group not filled yet (the last round's new one).
    deadline=$(( $(date +%s) + 120 ))
    until pick=$(status | python3 -c 'import json, sys
filled = sys.argv[1].split()
g = next(g for g in json.load(sys.stdin)["groups"] if g["name"] == "realfleetx")
print(next(i["name"] for i in g["instances"] if i["status"] == "running" and i["name"] not in filled))' "$filled" 2>/dev/null); do
        [ "$(date +%s)" -lt "$deadline" ] ||
            { echo "real-fleet: no running instance of realfleetx to fill within 120 s" >&2; exit 1; }
        sleep 0.5
    done
    filled="$filled $pick"
    t=$(now)
    timeout 60 incus exec "$pick" -- sh -c '/bin/busybox grep -q " /dev/shm " /proc/mounts || /bin/busybox mount -t tmpfs -o size=60m tmpfs /dev/shm;
        dd if=/dev/zero of=/dev/shm/fill bs=1M count=40 2>/dev/null'
    deadline=$(( $(date +%s) + 60 ))
    until r=$(logged "$t" 'realfleetx:' "scaling up") && [ -n "$r" ]; do
        [ "$(date +%s)" -lt "$deadline" ] || { echo "real-fleet: no scale-up within 60 s of a fill" >&2; exit 1; }
        sleep 0.2
    done
    reactions+=("$(awk -v a="$t" -v b="$r" 'BEGIN { printf "%.2f", b - a }')")
done

# 3. The burst: the bare API first, then the daemon.
bare="" burst=""
if [ "$BURST" -gt 1 ]; then
    create_one() {
        local op
        op=$(curl -s -m 60 --unix-socket "$SOCKET" -X POST -H 'Content-Type: application/json' \
            -d "{\"name\": \"$1\", \"type\": \"container\", \"source\": {\"type\": \"image\", \"alias\": \"busybox\"}, \"config\": {\"limits.memory\": \"64MiB\"}, \"start\": true}" \
            http://incus/1.0/instances | sed -n 's/.*"operation":"\([^"]*\)".*/\1/p')
        curl -s -m 150 --unix-socket "$SOCKET" "http://incus$op/wait?timeout=120" | grep -q '"status":"Success"' ||
            echo "real-fleet: creating $1 failed" >&2
    }
    export -f create_one; export SOCKET
    # The bare API alone: the daemon reads each instance another client creates or starts
    # (informer::SETTLE after its event), and reads beside starts slow them down on Incus 6.0.
    stop_daemon
    t=$(now)
    seq 1 $((BURST - 1)) | xargs -P "$PARALLEL" -I{} bash -c 'create_one realfleetapi-{}'
    bare=$(awk -v a="$t" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
    # Incus 6.0 now and then fails a delete among many ("Operation not found"): asked again.
    for _ in 1 2 3; do
        incus list --format csv -c n | grep '^realfleetapi' | xargs -r -P 4 -n 25 incus delete -f || true
    done
    start_daemon "$BIN" burst
    sleep "$SETTLE"
    config "$BURST" > "$dir/hpa.toml"
    t=$(now)
    kill -HUP "$daemon"
    deadline=$(( $(date +%s) + 600 ))
    while :; do
        done_=$(python3 - "$log" "$t" <<'EOF'
import datetime, sys
times = []
for line in open(sys.argv[1], errors="replace"):
    if ' realfleetb-' in line and 'action="create"' in line and 'outcome="ok"' in line:
        t = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()
        if t >= float(sys.argv[2]):
            times.append(t)
print(len(times), max(times, default=0))
EOF
)
        [ "${done_% *}" -ge $((BURST - 1)) ] && break
        [ "$(date +%s)" -lt "$deadline" ] || { echo "real-fleet: the burst did not end within 600 s" >&2; exit 1; }
        sleep 1
    done
    burst=$(awk -v a="$t" -v b="${done_#* }" 'BEGIN { printf "%.1f", b - a }')
fi

# 4. incusd alone.
stop_daemon
sleep 5
j0=$(ticks "$incusd" kids); u0=$(now)
sleep "$S"
j1=$(ticks "$incusd" kids); u1=$(now)

python3 - "$N" "$G" "$hz" "$j0" "$j1" "$u0" "$u1" "${rows[@]}" <<'EOF'
import sys
n, g, hz = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
j0, j1, u0, u1 = map(float, sys.argv[4:8])
base = (j1 - j0) / hz * 1000 / (u1 - u0)
print("| instances / groups | daemon | daemon CPU ms/s | incusd CPU ms/s, with the daemon / without | "
      "daemon + incusd's extra, ms per instance per tick | passes per group per s | "
      "daemon RSS MiB (peak): anonymous + file-backed | requests to Incus per s |")
print("|---|---|---|---|---|---|---|---|")
for row in sys.argv[8:]:
    name, *f = row.split()
    d0, d1, i0, i1, p0, p1, t0, t1, rss, hwm, anon, file, r0, r1 = map(float, f)
    secs = t1 - t0
    daemon = (d1 - d0) / hz * 1000 / secs          # ms of CPU per second
    incusd = (i1 - i0) / hz * 1000 / secs
    ticks = (p1 - p0) / secs / (g + 2)             # passes per group per second
    per = lambda ms: ms / (n + 2) / max(ticks, 1e-9)
    print(f"| {n} / {g} (+2 of 1) | {name} | {daemon:.1f} | {incusd:.1f} / {base:.1f} | "
          f"{per(daemon + incusd - base):.4f} (daemon alone {per(daemon):.4f}) | {ticks:.2f} | "
          f"{rss / 1024:.1f} ({hwm / 1024:.1f}): {anon / 1024:.1f} + {file / 1024:.1f} | "
          f"{(r1 - r0) / secs:.2f} |")
EOF
if [ "${#reactions[@]}" -gt 0 ]; then
    echo "fill → scaling up (interval 1 s), each round: ${reactions[*]} s"
fi
if [ -n "$burst" ]; then
    echo "burst 1 → $BURST beside the others, $PARALLEL at a time: the bare API $bare s, the daemon $burst s ($(awk -v a="$bare" -v b="$burst" 'BEGIN { printf "%.2f", b / a }')×)"
fi
