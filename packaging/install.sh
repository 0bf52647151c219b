#!/usr/bin/env bash
# Installs incus-hpa from source on a systemd machine that is not Debian (run as root from a
# checkout): the binary in /usr/local/bin, the unit in /etc/systemd/system, the desired-state
# file in /etc/incus-hpa (kept if present), a system user in the Incus socket's group, the
# endpoint hooks in /usr/lib/incus-hpa/hooks, and the README, docs/ and examples/ in /usr/share/doc/incus-hpa (as the package does: the
# daemon's messages, the man pages and the file's comments name the drop-ins there).
# Set INCUS_GROUP when the socket's group is not incus-admin. Does not start the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "install.sh: run me as root" >&2; exit 1; }
group=${INCUS_GROUP:-incus-admin}

if [ ! -x target/release/incus-hpa ]; then
    cargo build --release --locked
fi
install -Dm0755 target/release/incus-hpa /usr/local/bin/incus-hpa
sed -e 's|/usr/bin/incus-hpa|/usr/local/bin/incus-hpa|g' \
    -e "s|^SupplementaryGroups=.*|SupplementaryGroups=$group|" \
    systemd/incus-hpa.service >/etc/systemd/system/incus-hpa.service
getent group "$group" >/dev/null || groupadd --system "$group"
getent passwd incus-hpa >/dev/null ||
    useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin incus-hpa
usermod -aG "$group" incus-hpa
if [ ! -e /etc/incus-hpa/desired-state.toml ]; then
    install -Dm0640 -o root -g incus-hpa packaging/desired-state.toml /etc/incus-hpa/desired-state.toml
fi
assets=$(mktemp -d)
/usr/local/bin/incus-hpa generate-assets "$assets"
install -Dm0644 "$assets/incus-hpa.8" /usr/local/share/man/man8/incus-hpa.8
install -Dm0644 "$assets/incus-hpa.toml.5" /usr/local/share/man/man5/incus-hpa.toml.5
install -Dm0644 "$assets/incus-hpa.bash" /usr/local/share/bash-completion/completions/incus-hpa
# The ready-made endpoint hooks, calling the binary where this script put it.
for hook in packaging/hooks/*; do
    sed 's|/usr/bin/incus-hpa|/usr/local/bin/incus-hpa|g' "$hook" >"$assets/hook"
    install -Dm0755 "$assets/hook" "/usr/lib/incus-hpa/hooks/${hook##*/}"
done
rm -rf "$assets"
install -Dm0644 README.md /usr/share/doc/incus-hpa/README.md
install -Dm0644 -t /usr/share/doc/incus-hpa/docs docs/*
install -Dm0644 -t /usr/share/doc/incus-hpa/examples examples/*
systemctl daemon-reload 2>/dev/null || true
echo "installed. Declare a group in /etc/incus-hpa/desired-state.toml, then: systemctl enable --now incus-hpa"
