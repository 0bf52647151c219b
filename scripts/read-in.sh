# Sourced by scripts/e2e-systemd.sh and scripts/cluster.sh (bash).
#
# read_in CT CMD...: the output of CMD, which only reads, run in the Incus container CT; asked
# again (5 times at most) when it comes back empty: `incus exec` on a busy host now and then exits
# 0 with none of its command's output (canonical/lxd#11890). A failed CMD returns its status at
# once. Never for a command that changes anything: that one would run twice.
read_in() {
    local c=$1 out= _
    shift
    for _ in 1 2 3 4 5; do
        out=$(incus exec "$c" -- "$@") || return
        [ -n "$out" ] && break
    done
    printf '%s\n' "$out"
}
