#!/usr/bin/env bash
# The whole test suite, as CI runs it (root on Debian 12 or 13): sets Incus up when it is
# missing, then formatting, lints, unit and integration tests, the real-Incus tests (which fail,
# never skip, when Incus cannot be used), the fault suite, the unit's hardening score, lintian
# on the .deb and its man pages, the end-to-end test of the .deb under a real systemd, the demo
# and the benchmarks' smoke runs (the real fleet's on Incus among them).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || {
    echo "test.sh: cargo not found: install Rust (https://rustup.rs) and run me again" >&2
    exit 1
}

# Each phase's header says how long the suite has run (budget: 35 min on 2 cores).
suite_started=$SECONDS
phase() { printf '== [%dm%02ds] %s\n' $(((SECONDS - suite_started) / 60)) $(((SECONDS - suite_started) % 60)) "$*"; }

bash scripts/setup-incus.sh
# Reads Incus left unanswered and starts it failed, which the tests waited out
# (tests/integration/lab.rs, STALL_LOG): printed at the end.
stalls=/tmp/incus-hpa-test-stalls.log
rm -f "$stalls"
# promtool (checks /metrics), lintian and cargo-deb (the .deb).
bash scripts/install-test-tools.sh
# The three-member cluster of the cluster tests forms in the background (about 3 minutes,
# mostly spent waiting for its members and for apt) while the cargo phases run, after the
# tools' installs (one apt at a time); nothing before the real-Incus tests uses Incus, and
# they wait for it. Its own session, as the release build's below: an early end stops both.
mkdir -p target/tmp
background=()
trap 'for p in "${background[@]}"; do kill -- -"$p" 2>/dev/null || true; done' EXIT
cluster_log=target/tmp/cluster-up.log
setsid bash scripts/cluster.sh up >"$cluster_log" 2>&1 &
cluster_up=$!
background+=("$cluster_up")

phase "cargo fmt --check"
cargo fmt --all -- --check
phase "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --locked -- -D warnings
phase "cargo test (unit, fake Incus, CLI, properties), in a PID namespace of their own"
# As in a container (CI's): the session's leader lives outside the namespace, so the tests'
# session is 0, which the external programs' reaping must handle (it once aborted on it).
in_pid_namespace=(unshare --pid --fork --mount-proc)
"${in_pid_namespace[@]}" true 2>/dev/null || {
    echo "test.sh: cannot make a PID namespace here (unshare: no CAP_SYS_ADMIN?): the tests run in this one"
    in_pid_namespace=()
}
"${in_pid_namespace[@]}" cargo test --locked --lib --bins --test integration
# The .deb's optimized build (fat LTO, one codegen unit: about 3 minutes of both cores) runs
# from here in the background, at the lowest CPU and I/O priority, while the real-Incus tests
# and the fault suite mostly wait on Incus; the .deb phase waits for it. Its own session, so
# that a suite that stops early stops it too.
release_log=target/tmp/release-build.log
setsid nice -n 19 ionice -c 3 cargo build --release --locked >"$release_log" 2>&1 &
release_build=$!
background+=("$release_build")
# One at a time: Incus 6.0 can stall a container start for 90 s when other clients stop or
# delete instances at the same moment (docs/cost.md), and these tests are such clients
# for each other.
phase "a three-member Incus cluster in nested containers, for the cluster tests (scripts/cluster.sh, started with the cargo phases)"
wait "$cluster_up" || {
    cat "$cluster_log" >&2
    echo "test.sh: scripts/cluster.sh up failed (its log is above)" >&2
    exit 1
}
grep '^cluster: up:' "$cluster_log" || true
phase "the real-Incus tests, the cluster's among them (one at a time, each in its own process, at most 10 min each)"
bash scripts/each-test.sh integration 600
# The members' memory and CPU are not needed by what follows (the image stays cached).
bash scripts/cluster.sh down

phase "fault suite (real Incus through a fault proxy, SIGKILL, incusd stopped for 30 s; one at a time)"
table=target/tmp/faults-table.md
rm -f "$table"
bash scripts/each-test.sh faults 600 '' -- --include-ignored
echo "| scenario | unmanaged touched | orphans left | scale-downs on missing data | panics | converged after the fault |"
echo "|---|---|---|---|---|---|"
cat "$table"

phase "systemd unit exposure (at most 2.0)"
command -v systemd-analyze >/dev/null ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
exposure=$(systemd-analyze security --offline=true --no-pager systemd/incus-hpa.service |
    sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')
echo "exposure: $exposure"
awk -v e="$exposure" 'BEGIN { exit !(e != "" && e <= 2.0) }' || {
    echo "test.sh: the unit's exposure ${exposure:-unknown} is above 2.0" >&2
    exit 1
}

phase "the .deb (cargo-deb), checked by lintian --pedantic: no error, no warning, no pedantic tag"
started=$SECONDS
wait "$release_build" || {
    cat "$release_log" >&2
    echo "test.sh: cargo build --release failed (its output above)" >&2
    exit 1
}
trap - EXIT
echo "waited $((SECONDS - started)) s for the optimized build started after cargo test"
deb=$(bash packaging/build-deb.sh)
lintian --pedantic --fail-on error,warning,pedantic "$deb"
phase "its man pages, found by name and rendered without a warning"
pages=$(mktemp -d)
dpkg-deb -x "$deb" "$pages"
for page in "8 incus-hpa" "5 incus-hpa.toml"; do
    # shellcheck disable=SC2086 # "SECTION NAME" is two words
    warnings=$(MANWIDTH=80 man --warnings -M "$pages/usr/share/man" $page 2>&1 >/dev/null)
    [ -z "$warnings" ] || { echo "test.sh: man $page: $warnings" >&2; exit 1; }
    # shellcheck disable=SC2086
    MANWIDTH=80 man -M "$pages/usr/share/man" $page | grep -q "^NAME" ||
        { echo "test.sh: man $page is not found in the package" >&2; exit 1; }
done
rm -rf "$pages"

phase "end-to-end under systemd (package, enable, reload, journal, watchdog, stop)"
bash scripts/e2e-systemd.sh

phase "the README's demo"
bash lab/demo.sh

phase "the benchmarks, smoke runs (a few instances; the figures in docs/ come from bigger runs)"
# The test profile reuses what `cargo test` built: an optimized build (fat LTO, one codegen
# unit, the dev-dependencies' tokio features) took 2 of the suite's minutes to compile.
TICKS=1 PARALLEL=2 REPEAT=1 cargo bench --locked --profile test \
    --bench tick_cost --bench burst --bench memory_cost -- 3
# The fleet: one daemon, a fake incusd and a fake cgroup tree (no Incus), 100 instances in 10
# groups for 2 s.
FLEET_SECONDS=2 cargo bench --locked --profile test --bench fleet -- 100/10
# The real fleet: the optimized daemon on this host's Incus with 4 instances in 2 groups (and
# the fill's and the burst's groups of one): steady for 2 s, one fill, a burst to 3. Every wait
# in it has a deadline; `timeout` bounds the whole.
SETTLE=2 FILLS=1 BURST=3 timeout 600 bash benches/real-fleet.sh 4 2 2
if [ -s "$stalls" ]; then
    echo "test.sh: Incus stalled (a read unanswered, a start failed) and the tests waited it out:"
    cat "$stalls"
fi
phase "all tests passed"
