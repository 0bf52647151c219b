#!/usr/bin/env bash
# The whole test suite, as CI runs it (root on Debian 12): sets Incus up when it is missing,
# then formatting, lints, unit and integration tests, and the real-Incus tests, which fail
# (never skip) when Incus cannot be used.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo >/dev/null || {
    echo "test.sh: cargo not found: install Rust (https://rustup.rs) and run me again" >&2
    exit 1
}

bash scripts/setup-incus.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --locked -- -D warnings
echo "== cargo test (unit, fake Incus, CLI, real Incus)"
cargo test --all-targets --locked -- --include-ignored
