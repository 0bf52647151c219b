#!/usr/bin/env bash
# Installs what the test suite checks the daemon's outputs with, where it is missing (root, Debian):
# - promtool, which checks the /metrics exposition. It comes from Debian's `prometheus` package,
#   but only the one binary is taken: installing the package would also start a Prometheus
#   server (no systemd here: its init script) and pull in a web UI the tests do not need;
# - lintian, which checks the .deb, and dpkg-dev, whose dpkg-shlibdeps computes its Depends;
# - haproxy and nginx-light, the real load balancers the endpoint hooks are tested against
#   (tests/integration/hooks_*.rs start their own instances on 127.0.0.1; the packages' own
#   services are not needed, and are stopped and disabled where systemd started them);
# - python3 and curl, which benches/real-fleet.sh (its smoke run) reads the daemon's status and
#   metrics with;
# - cargo-deb, which builds the .deb (`cargo install --locked`, about a minute the first time).
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

if ! command -v promtool >/dev/null; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # apt's sandbox user cannot write into a root-owned mktemp directory.
    get() { (cd "$tmp" && apt-get -qq -o APT::Sandbox::User=root download prometheus); }
    get || { apt-get update -qq && get; }
    dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb | tar -xO ./usr/bin/promtool >"$tmp/promtool"
    install -m0755 "$tmp/promtool" /usr/local/bin/promtool
    echo "install-test-tools: promtool $(promtool --version 2>&1 | sed -n '1s/.*version \([^ ]*\).*/\1/p')"
fi

# apt_install PACKAGE: refreshes apt's lists only when the first try fails.
apt_install() {
    apt-get install -y -qq "$1" >/dev/null || { apt-get update -qq && apt-get install -y -qq "$1" >/dev/null; }
    echo "install-test-tools: $1 installed"
}
command -v lintian >/dev/null || apt_install lintian
command -v python3 >/dev/null || apt_install python3
command -v curl >/dev/null || apt_install curl
# cargo-deb computes Depends with dpkg-shlibdeps.
command -v dpkg-shlibdeps >/dev/null || apt_install dpkg-dev
for tool in haproxy nginx; do
    [ -x /usr/sbin/$tool ] && continue
    package=$tool
    [ "$tool" = nginx ] && package=nginx-light
    apt_install $package
    # The tests run their own; the package's service would hold port 80 for nothing.
    if [ -d /run/systemd/system ]; then
        systemctl disable --now $tool >/dev/null 2>&1 || true
    fi
done

if ! cargo deb --version >/dev/null 2>&1; then
    # The version this project was packaged and checked with (lintian-clean).
    cargo install --locked cargo-deb --version 3.8.0
fi
