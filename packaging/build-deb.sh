#!/usr/bin/env bash
# Builds target/debian/incus-hpa_VERSION_ARCH.deb with dpkg-deb: the binary, the systemd unit,
# the commented desired-state file (a conffile: an operator's edits survive upgrades), the man
# page and shell completions generated from the CLI, examples, and the maintainer scripts.
# Prints the path of the package.
set -euo pipefail
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
cargo build --release --locked >&2
bin=target/release/incus-hpa

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
chmod 0755 "$stage"
install -Dm0755 "$bin" "$stage/usr/bin/incus-hpa"
install -Dm0644 systemd/incus-hpa.service "$stage/lib/systemd/system/incus-hpa.service"
install -Dm0640 packaging/desired-state.toml "$stage/etc/incus-hpa/desired-state.toml"
assets=$stage/assets
"$bin" generate-assets "$assets"
install -Dm0644 "$assets/incus-hpa.1" "$stage/usr/share/man/man1/incus-hpa.1"
gzip -9n "$stage/usr/share/man/man1/incus-hpa.1"
install -Dm0644 "$assets/incus-hpa.bash" "$stage/usr/share/bash-completion/completions/incus-hpa"
install -Dm0644 "$assets/_incus-hpa" "$stage/usr/share/zsh/vendor-completions/_incus-hpa"
install -Dm0644 "$assets/incus-hpa.fish" "$stage/usr/share/fish/vendor_completions.d/incus-hpa.fish"
rm -rf "$assets"
install -Dm0644 README.md "$stage/usr/share/doc/incus-hpa/README.md"
for ex in examples/*.toml; do
    install -Dm0644 "$ex" "$stage/usr/share/doc/incus-hpa/examples/$(basename "$ex")"
done
install -Dm0644 /dev/stdin "$stage/usr/share/doc/incus-hpa/copyright" <<COPY
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: incus-hpa
Files: *
License: Apache-2.0
COPY

mkdir -p "$stage/DEBIAN"
for s in postinst prerm postrm; do
    install -m0755 "packaging/debian/$s" "$stage/DEBIAN/$s"
done
echo /etc/incus-hpa/desired-state.toml >"$stage/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat >"$stage/DEBIAN/control" <<CTRL
Package: incus-hpa
Version: $version
Architecture: $arch
Maintainer: incus-hpa developers <incus-hpa@localhost>
Installed-Size: $size
Depends: libc6 (>= 2.34), adduser
Recommends: incus
Section: admin
Priority: optional
Description: horizontal autoscaler for Incus containers
 incus-hpa keeps each declared group of Incus containers between min and max
 instances, adding instances when their average memory use is above the
 group's threshold and removing them when it is well below. The desired
 state lives in /etc/incus-hpa/desired-state.toml; the daemon runs under
 systemd as an unprivileged user in the incus-admin group.
CTRL

mkdir -p target/debian
out=target/debian/incus-hpa_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz --build "$stage" "$out" >&2
echo "$out"
