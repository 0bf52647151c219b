#!/usr/bin/env bash
# Builds target/debian/incus-hpa_VERSION-1_ARCH.deb with cargo-deb ([package.metadata.deb] in
# Cargo.toml: Depends computed from the binary, the conffile, the maintainer scripts in
# packaging/debian/, the unit, the man pages incus-hpa(8) and incus-hpa.toml(5), shell
# completions, the guides and examples). The man pages and completions are generated from the
# program first. Prints the path of the package.
# Needs cargo-deb: `bash scripts/install-test-tools.sh` installs it.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo deb --version >/dev/null 2>&1 || {
    echo "build-deb.sh: cargo-deb is missing: cargo install --locked cargo-deb --version 3.8.0 (or bash scripts/install-test-tools.sh)" >&2
    exit 1
}
cargo build --release --locked >&2
rm -rf target/assets
target/release/incus-hpa generate-assets target/assets
gzip -9n target/assets/incus-hpa.8 target/assets/incus-hpa.toml.5
# cargo-deb prints the package's path.
cargo deb --no-build --locked
