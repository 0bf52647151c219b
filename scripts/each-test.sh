#!/usr/bin/env bash
# Runs the tests of one cargo test target one at a time, each in its own process under a time
# limit, so that a test that never ends (an Incus that never answers, an instance it left stuck)
# fails by itself with its name, and the others still run. Prints how long each passing test
# took, the failures at the end, and exits 1 when there is one.
#
#   each-test.sh TARGET LIMIT_SECONDS [FILTER] [-- LIBTEST_FLAGS...]
#
#   TARGET          the integration test target (`integration`, `faults`)
#   LIMIT_SECONDS   how long one test may take; past it, it is killed and counted failed
#   FILTER          only the tests whose name contains it
#   LIBTEST_FLAGS   which tests: `--ignored` (default) or `--include-ignored`
set -uo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 2 ] || { sed -n '/^#   each-test.sh/,/^#   LIBTEST/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
target=$1 limit=$2
shift 2
filter=''
if [ $# -gt 0 ] && [ "$1" != "--" ]; then filter=$1; shift; fi
[ "${1:-}" = "--" ] && shift
which=("$@")
[ ${#which[@]} -gt 0 ] || which=(--ignored)

cargo test --locked --test "$target" --no-run >/dev/null 2>&1 ||
    cargo test --locked --test "$target" --no-run || exit 1
mapfile -t names < <(cargo test --locked --test "$target" -- "${which[@]}" --list --format terse 2>/dev/null |
    sed -n 's/: test$//p' | grep -F -- "$filter")
[ ${#names[@]} -gt 0 ] || { echo "each-test.sh: no test of $target matches '${filter}'" >&2; exit 1; }

failed=()
for name in "${names[@]}"; do
    started=$SECONDS
    timeout --kill-after=30 "$limit" \
        cargo test --locked --test "$target" -- "${which[@]}" --exact "$name" --test-threads=1 \
        2>&1 | grep -v -e '^running 1 test$' -e '^$' -e 'filtered out; finished in' \
        -e '^test result: ok' -e '^     Running ' -e '^    Finished '
    rc=${PIPESTATUS[0]}
    took=$((SECONDS - started))
    case $rc in
    0) echo "  (took ${took} s)" ;;
    124 | 137)
        echo "each-test.sh: $name did not end within ${limit} s: killed (took ${took} s)"
        failed+=("$name (killed after ${limit} s)")
        ;;
    *) failed+=("$name") ;;
    esac
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "each-test.sh: ${#failed[@]} of ${#names[@]} test(s) of $target failed:"
    printf '  %s\n' "${failed[@]}"
    exit 1
fi
echo "each-test.sh: all ${#names[@]} test(s) of $target passed"
