#!/usr/bin/env bash
# shellcheck disable=SC2317 # functions run from traps look unreachable
# lab/traffic.sh: a group of web servers that scales on its request rate behind a real HAProxy,
# under a real HTTP load generator, through scale-ups and scale-downs, offline, in about five
# minutes. Run it as root from anywhere in the repository:   sudo lab/traffic.sh
#
#   1. sets Incus up (scripts/setup-incus.sh), installs HAProxy, wrk and socat from Debian when
#      they are missing, builds incus-hpa (cargo build --release) and the busybox web-server
#      image (scripts/build-web-image.sh);
#   2. makes a bridge of its own, hpa-lab-br (10.252.9.1/24, no NAT, no IPv6: nothing leaves
#      it) and a profile hpa-lab that puts an instance's eth0 on it;
#   3. runs HAProxy on 127.0.0.1:18080 (a backend `web` of 8 free server slots, its admin
#      socket in a temporary directory), and `incus-hpa run` on a group `traffic`: min 1,
#      max 6, ready once `/` answers, published to HAProxy by `incus-hpa hook haproxy`,
#      scaled on HAProxy's request rate (`incus-hpa hook haproxy-rate`, 45 requests per second
#      per instance), deregistration_delay 3 s;
#   4. drives wrk through eight phases of 30 s at a steady rate each (about 20, 80, 160, 240,
#      120, 40, 160 and 20 requests per second), so the group grows and shrinks at least
#      three times each way;
#   5. prints a table per phase: requests, failed requests (connection errors, timeouts,
#      non-2xx answers), p50 and p99 latency, instances in service at its end; then each
#      instance the daemon created, and how long it took from its creation to its first
#      request through HAProxy.
# Exits 0 only when no request failed in any phase and every instance created took requests.
# On any exit the daemon and HAProxy are stopped, every instance of the group is deleted, and
# the bridge and profile are removed; nothing else is touched.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
readonly repo
readonly GROUP=traffic
readonly KEY=user.incus-hpa.group
readonly BRIDGE=hpa-lab-br PROFILE=hpa-lab SUBNET=10.252.9
readonly PORT=18080
readonly PHASE_SECONDS=30
# Connections per phase; each sends a request, waits 100 ms, and again: about 9 requests per
# second per connection.
readonly PHASES=(2 8 16 24 12 4 16 2)

prog=${0##*/}
say() { printf '%s\n' "$*"; }
log() { printf '%s: %s\n' "$prog" "$*" >&2; }
fail() { log "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || fail "run me as root (sudo $0)"

work=$(mktemp -d /tmp/incus-hpa-traffic.XXXXXX)
chmod 0755 "$work"
daemon_pid= haproxy_pid=

cleanup() {
    set +e
    if [ -n "$daemon_pid" ]; then
        kill -TERM "$daemon_pid" 2>/dev/null
        wait "$daemon_pid" 2>/dev/null
    fi
    [ -n "$haproxy_pid" ] && kill -TERM "$haproxy_pid" 2>/dev/null && wait "$haproxy_pid" 2>/dev/null
    local name
    for name in $(incus list "$KEY=$GROUP" -f csv,noheader -c "n,config:$KEY" 2>/dev/null |
        awk -F, -v g="$GROUP" '$2 == g { print $1 }'); do
        incus delete --force "$name" >/dev/null 2>&1
    done
    incus profile delete "$PROFILE" >/dev/null 2>&1
    incus network delete "$BRIDGE" >/dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

say "== setting up (Incus, HAProxy, wrk, socat, the release build, the web image)"
bash "$repo/scripts/setup-incus.sh" >/dev/null
missing=()
for tool in haproxy:haproxy wrk:wrk socat:socat; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool##*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# Debian's HAProxy service is not the lab's: the lab runs its own, on its own port.
(cd "$repo" && PATH="${HOME:-/root}/.cargo/bin:$PATH" cargo build --release --locked -q) ||
    fail "cargo build --release failed (is Rust installed? https://rustup.rs)"
bin=$repo/target/release/incus-hpa
bash "$repo/scripts/build-web-image.sh"

if ! incus network show "$BRIDGE" >/dev/null 2>&1; then
    incus network create "$BRIDGE" ipv4.address="$SUBNET.1/24" ipv4.nat=false ipv6.address=none >/dev/null
fi
if ! incus profile show "$PROFILE" >/dev/null 2>&1; then
    incus profile create "$PROFILE" >/dev/null
    incus profile device add "$PROFILE" eth0 nic name=eth0 network="$BRIDGE" >/dev/null
fi

socket=$work/haproxy.sock
cat >"$work/haproxy.cfg" <<CFG
global
    stats socket $socket mode 600 level admin
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
frontend lab
    bind 127.0.0.1:$PORT
    default_backend web
backend web
    server-template web- 1-8 127.0.0.1:80 disabled
CFG
haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
haproxy_pid=$!
for _ in $(seq 50); do
    echo "show info" | socat - "UNIX-CONNECT:$socket" 2>/dev/null | grep -q '^Name: HAProxy' && break
    sleep 0.2
done
echo "show info" | socat - "UNIX-CONNECT:$socket" 2>/dev/null | grep -q '^Name: HAProxy' ||
    fail "HAProxy did not start: $(tail -n 5 "$work/haproxy.log")"

control=$work/control.sock
cat >"$work/traffic.toml" <<TOML
[daemon]
interval = "2s"
control_socket = "$control"

[groups.$GROUP]
min = 1
max = 6
image = "busybox-web"
profiles = ["default", "$PROFILE"]
scale_down_stabilization = "10s"
stop_timeout = "2s"

[groups.$GROUP.config]
"limits.memory" = "64MiB"

[groups.$GROUP.ready]
port = 80
path = "/"
period = "1s"
timeout = "500ms"

[groups.$GROUP.endpoints]
command = ["$bin", "hook", "haproxy", "--socket", "$socket", "--backend", "web"]
deregistration_delay = "3s"

[[groups.$GROUP.external]]
command = ["$bin", "hook", "haproxy-rate", "--socket", "$socket", "--backend", "web"]
target = 45
timeout = "2s"
TOML
"$bin" validate --config "$work/traffic.toml" >/dev/null || fail "the lab's file does not validate"
RUST_LOG=incus_hpa=info "$bin" run --config "$work/traffic.toml" >"$work/daemon.log" 2>&1 &
daemon_pid=$!

# The group's instances in service, as the daemon last published them.
in_service() {
    "$bin" status --json --control-socket "$control" 2>/dev/null | tr -d ' \n\t' |
        grep -o '"published":\[[^]]*\]' | grep -o '"instance"' | wc -l
}

for _ in $(seq 60); do
    [ "$(in_service)" -ge 1 ] && break
    sleep 1
done
[ "$(in_service)" -ge 1 ] || fail "no instance in service after 60 s: $(tail -n 5 "$work/daemon.log")"

# Once a second: each server slot's address and its total of requests (HAProxy's `stot`), and
# the instances the daemon has published with their addresses. An address took its first
# request when its slot's total grew between two readings that both show that address.
watch() {
    while :; do
        now=$(date +%s.%N)
        echo "show stat web 4 -1" | socat - "UNIX-CONNECT:$socket" 2>/dev/null |
            awk -F, -v now="$now" '$1 == "web" && $2 != "BACKEND" { print now, $2, $74, $8 }' \
                >>"$work/slots.log"
        "$bin" status --json --control-socket "$control" 2>/dev/null | tr -d ' \n\t' |
            grep -o '"instance":"[^"]*","address":"[^"]*"' |
            sed 's/"instance":"\([^"]*\)","address":"\([^"]*\)"/\1 \2/' >>"$work/published.log"
        sleep 1
    done
}
watch &
watcher=$!

cat >"$work/pace.lua" <<'LUA'
function delay()
    return 100
end
LUA

say ""
say "| phase | connections | requests | failed | p50 | p99 | in service at its end |"
say "|---|---|---|---|---|---|---|"
total_failed=0
n=0
for c in "${PHASES[@]}"; do
    n=$((n + 1))
    threads=$((c < 2 ? 1 : 2))
    out=$(wrk -t "$threads" -c "$c" -d "${PHASE_SECONDS}s" --latency -s "$work/pace.lua" \
        "http://127.0.0.1:$PORT/" 2>&1) || fail "wrk failed: $out"
    requests=$(sed -n 's/^ *\([0-9]*\) requests in .*/\1/p' <<<"$out")
    errors=$(sed -n 's/^ *Socket errors: connect \([0-9]*\), read \([0-9]*\), write \([0-9]*\), timeout \([0-9]*\).*/\1 \2 \3 \4/p' <<<"$out")
    non2xx=$(sed -n 's/^ *Non-2xx or 3xx responses: \([0-9]*\).*/\1/p' <<<"$out")
    failed=$((${non2xx:-0}))
    for e in $errors; do failed=$((failed + e)); done
    p50=$(awk '$1 == "50%" { print $2 }' <<<"$out")
    p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
    total_failed=$((total_failed + failed))
    say "| $n | $c | ${requests:-0} | $failed | ${p50:-?} | ${p99:-?} | $(in_service) |"
done
kill "$watcher" 2>/dev/null || true

say ""
say "| instance | created | first request through HAProxy | created to receiving |"
say "|---|---|---|---|"
# Each creation the daemon logged, its address as published, and the first time a request
# reached that address through HAProxy.
awk '{ key = $2; if (key in last && last[key] == $3 && $4 > total[key] && !($3 in first)) first[$3] = $1;
       last[key] = $3; total[key] = $4 }
     END { for (a in first) print a, first[a] }' "$work/slots.log" >"$work/first.log"
status=0
created=0
while read -r when name; do
    created=$((created + 1))
    t0=$(date -d "$when" +%s.%N)
    addr=$(awk -v n="$name" '$1 == n { print $2; exit }' "$work/published.log")
    first=
    [ -z "$addr" ] || first=$(awk -v a="$addr:80" '$1 == a { print $2; exit }' "$work/first.log")
    if [ -z "$first" ]; then
        say "| $name | $(date -d "$when" +%T) | never | - |"
        status=1
        continue
    fi
    say "| $name | $(date -d "$when" +%T) | $(date -d "@$first" +%T) | $(awk -v a="$t0" -v b="$first" 'BEGIN { printf "%.1f s", b - a }') |"
done < <(grep 'action="create"' "$work/daemon.log" | grep 'outcome="ok"' |
    sed -n 's/^\([^ ]*\) .*created \([^ ]*\) .*/\1 \2/p')

say ""
say "requests failed: $total_failed; instances created: $created"
grep -E 'WARN|ERROR' "$work/daemon.log" | tail -n 5 || true
[ "$total_failed" -eq 0 ] || { log "requests failed"; status=1; }
[ "$created" -gt 0 ] || { log "the daemon created no instance"; status=1; }
exit "$status"
