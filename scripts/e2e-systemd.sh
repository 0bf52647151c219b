#!/usr/bin/env bash
# End-to-end test under a real systemd: boots a Debian bookworm container (systemd as PID 1,
# unprivileged), hands it the host's Incus socket through a proxy device, installs the .deb and
# checks what an operator does: enable --now, save a group, reload, a broken edit, the journal
# fields, an external signal, a group of web servers with readiness checks published to a real
# HAProxy by the packaged hook (and its drop-in), the watchdog, stop. The daemon inside creates
# its instances on the host's Incus.
# Exits non-zero on the first failed check; removes its container and instances in any case.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'e2e: %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; dump; exit 1; }

suffix=$(printf '%04x%04x' $RANDOM $RANDOM)
ct=incus-hpa-e2e-$suffix
group=e2e$suffix
web=e2eweb$suffix
# The web group's bridge and profile (a subnet no other test uses; no NAT, no IPv6) and the
# host's HAProxy, whose admin socket the container sees as Debian's /run/haproxy/admin.sock.
bridge=hpa-e2e-br profile=hpa-e2e subnet=10.251.9 haproxy_port=18091
haproxy_dir= haproxy_pid=
key=user.incus-hpa.group
conf=/etc/incus-hpa/desired-state.toml

in_ct() { incus exec "$ct" -- "$@"; }
# One-shot reads in a container go through read_in (asked again when incus exec loses the output).
. scripts/read-in.sh
ct_read() { read_in "$ct" "$@"; }
dump() {
    log "--- journal of incus-hpa in $ct ---"
    in_ct journalctl -u incus-hpa --no-pager -o short-precise -n 200 >&2 || true
    if in_ct test -e /root/hand.log 2>/dev/null; then
        log "--- the daemon run by hand (/root/hand.log) ---"
        in_ct cat /root/hand.log >&2 || true
    fi
    log "--- the lease store ---"
    incus profile show incus-hpa.leases >&2 || true
}
# Managed instances of the test group on the host, exact key match.
managed() {
    incus list -f csv -c n,s "$key=$group" | while IFS=, read -r name status; do
        [ "$(incus config get "$name" "$key")" = "$group" ] && echo "$name,$status"
    done
}
running() { managed | grep -c ',RUNNING$' || true; }
count_is() { [ "$(running)" -eq "$1" ]; }
errs=$(mktemp) # the stderr of until_ok's last check
# until DESCRIPTION SECONDS COMMAND...: polls COMMAND every half second. One check that took
# 10 s or more (one passed after 164 s, twice: `incus exec`, or the daemon, answered late) is
# reported with what it wrote on stderr and the dump, so that it can be read next time
# (`incus-hpa status` gives up after its --timeout of 10 s and says so there).
until_ok() {
    local what=$1 secs=$2 start=$SECONDS tried passed slowest=0 said=""
    shift 2
    while :; do
        tried=$SECONDS
        "$@" >/dev/null 2>"$errs" && passed=1 || passed=0
        if ((SECONDS - tried > slowest)); then
            slowest=$((SECONDS - tried))
            said=$(cat "$errs")
        fi
        ((passed == 0)) || break
        ((SECONDS - start < secs)) || fail "timed out after ${secs}s waiting for: $what"
        sleep 0.5
    done
    log "ok: $what ($((SECONDS - start))s)"
    if ((slowest >= 10)); then
        log "slow: one check took ${slowest}s; it said on stderr: ${said:-nothing}"
        log "what the daemons and the lease store say:"
        dump
    fi
}
cleanup() {
    rm -f "$errs"
    incus delete --force "$ct" >/dev/null 2>&1 || true
    # The HTTPS step's certificate and address (set only if it was not).
    [ -z "${trusted:-}" ] || incus config trust remove "$trusted" >/dev/null 2>&1 || true
    [ -z "${https_set:-}" ] || incus config unset core.https_address >/dev/null 2>&1 || true
    [ -z "${tls_dir:-}" ] || rm -rf "$tls_dir"
    # A daemon killed rather than stopped (the watchdog step) may leave its group's lease.
    incus profile unset incus-hpa.leases "user.incus-hpa.lease.$group" >/dev/null 2>&1 || true
    for g in "$group" "$web"; do
        for n in $(incus list -f csv -c n "$key=$g"); do
            [ "$(incus config get "$n" "$key" 2>/dev/null)" = "$g" ] && incus delete --force "$n" >/dev/null 2>&1
        done
    done
    [ -z "$haproxy_pid" ] || kill "$haproxy_pid" 2>/dev/null || true
    [ -z "$haproxy_dir" ] || rm -rf "$haproxy_dir"
    incus profile delete "$profile" >/dev/null 2>&1 || true
    incus network delete "$bridge" >/dev/null 2>&1 || true
    true
}
# KEEP=1 leaves the container for a look after a failure.
trap '[ -n "${KEEP:-}" ] || cleanup' EXIT

desired() { # min [lines for the [daemon] table] [lines for the group]
    in_ct sh -c "cat > $conf" <<TOML
[daemon]
interval = "2s"
${2:-}

[groups.$group]
min = $1
max = 5
memory_threshold = 80
image = "busybox"
stop_timeout = "1s"
${3:-}

[groups.$group.config]
"limits.memory" = "64MiB"
TOML
}

started=$SECONDS
bash scripts/setup-incus.sh
bash scripts/build-debian-image.sh
deb=$(bash packaging/build-deb.sh)
log "package: $deb"

log "booting $ct"
incus launch incus-hpa-bookworm "$ct" >/dev/null
until_ok "systemd up in the container" 120 in_ct test -S /run/systemd/private
in_ct systemctl is-system-running --wait >/dev/null 2>&1 || true

incus file push -q "$deb" "$ct/tmp/incus-hpa.deb"
in_ct env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq /tmp/incus-hpa.deb >/dev/null 2>&1 ||
    in_ct dpkg -i /tmp/incus-hpa.deb
[ "$(ct_read stat -c %U:%G:%a $conf)" = "root:incus-hpa:640" ] || fail "config file ownership"
ct_read id -nG incus-hpa | grep -qw incus-admin || fail "incus-hpa is not in incus-admin"
for page in man8/incus-hpa.8.gz man5/incus-hpa.toml.5.gz; do
    in_ct test -e /usr/share/man/$page || fail "no man page $page"
done

# The host's socket, owned by the container's incus-admin group.
gid=$(ct_read getent group incus-admin | cut -d: -f3)
in_ct mkdir -p /var/lib/incus
incus config device add "$ct" incus-socket proxy \
    listen=unix:/var/lib/incus/unix.socket connect=unix:/var/lib/incus/unix.socket \
    bind=instance uid=0 gid="$gid" mode=0660 >/dev/null

# Journal queries by field; `grep -c` reads to the end (grep -q would SIGPIPE journalctl).
journal() { ct_read journalctl -u incus-hpa --no-pager "$@"; }

log "enable --now with min = 2"
desired 2
in_ct incus-hpa validate >/dev/null || fail "incus-hpa validate refused the file"
ct_read incus-hpa plan | grep -q "^$group: 0 instance(s)" || fail "incus-hpa plan"
in_ct systemctl enable --now incus-hpa
[ "$(ct_read systemctl is-active incus-hpa)" = active ] || fail "not active after enable --now"
until_ok "2 instances on the host" 60 count_is 2

log "reload with min = 3"
desired 3
in_ct systemctl reload incus-hpa
until_ok "3 instances on the host" 60 count_is 3
before=$(managed | sort)

log "incus-hpa status: as root, as a member of incus-hpa, refused to anyone else"
ct_read incus-hpa status | grep -q "| $group " || fail "incus-hpa status as root"
# The board is written after each pass, from what that pass observed.
until_ok "status --json says current 3" 30 sh -c \
    "incus exec $ct -- incus-hpa status --json | grep -q '\"current\":3'"
in_ct useradd -M -G incus-hpa hpa-member
ct_read runuser -u hpa-member -- incus-hpa status | grep -q "| $group " || fail "status as a member of incus-hpa"
in_ct useradd -M hpa-outsider
if out=$(in_ct runuser -u hpa-outsider -- incus-hpa status 2>&1); then fail "an outsider read the status"; fi
grep -q "permission denied" <<<"$out" || fail "the outsider's message is unclear: $out"

log "each group's history in the unit's StateDirectory, resumed after a restart"
history=/var/lib/incus-hpa/groups/$group
until_ok "the history of $group in $history" 90 in_ct test -s $history/learned.json
[ "$(ct_read stat -c %U:%a $history/passes.csv)" = incus-hpa:600 ] || fail "the history is not the daemon's alone"
in_ct systemctl restart incus-hpa
resumed() { [ "$(journal -o cat | grep -c "$group resumes from its history saved")" -gt 0 ]; }
until_ok "the restarted daemon resumes $group from its history" 30 resumed
until_ok "incus-hpa status $group charts its last hour" 30 sh -c \
    "incus exec $ct -- incus-hpa status $group | grep -q '^  count  *[▁▂▃▄▅▆▇█]'"

log "a daemon run by hand as root beside the packaged unit: never both acting"
# The unit's ProtectProc=invisible hides root's processes from the service: it must wait the
# hand-run daemon's lease out, never take it for dead. Its own file and control socket.
in_ct systemctl stop incus-hpa
in_ct sh -c "sed 's|^\[daemon\]|[daemon]\ncontrol_socket = \"/root/hand.sock\"\nlease = \"3s\"|' $conf > /root/hand.toml && chmod 600 /root/hand.toml"
in_ct sh -c 'setsid incus-hpa run --config /root/hand.toml >/root/hand.log 2>&1 </dev/null & echo $! >/root/hand.pid'
# The daemon on SOCKET acts on the group (one group: its status, past the first pass, has no
# standby).
acts() {
    local doc
    doc=$(in_ct incus-hpa status --json --control-socket "$1") || return 1
    grep -q "\"name\":\"$group\"" <<<"$doc" && ! grep -q '"reason":"pending"' <<<"$doc" &&
        grep -q '"standby":null' <<<"$doc"
}
until_ok "the hand-run daemon acts" 30 acts /root/hand.sock
in_ct systemctl start incus-hpa
stands_by() { in_ct incus-hpa status --json 2>/dev/null | grep -q '"standby":"'; }
until_ok "the service stands by" 30 stands_by
both=0
for _ in $(seq 15); do
    if acts /run/incus-hpa/control.sock && acts /root/hand.sock; then both=$((both + 1)); fi
    sleep 1
done
[ "$both" -eq 0 ] || fail "the service and a daemon run by hand as root both acted ($both of 15 samples)"
in_ct sh -c 'kill -TERM "$(cat /root/hand.pid)"'
until_ok "the service acts once the hand-run daemon stopped" 30 acts /run/incus-hpa/control.sock
[ "$(running)" -eq 3 ] || fail "the hand-over changed the instances"

log "metrics on TCP: refused by the unit's sandbox, served with the packaged drop-in"
desired 3 'metrics_address = "127.0.0.1:9750"'
in_ct systemctl restart incus-hpa
refused() { [ "$(journal -o cat | grep -c 'cannot serve /metrics on 127.0.0.1:9750')" -gt 0 ]; }
until_ok "the daemon says why it cannot serve /metrics on TCP" 30 refused
dropin=/etc/systemd/system/incus-hpa.service.d
in_ct mkdir -p $dropin
in_ct cp /usr/share/doc/incus-hpa/examples/metrics-tcp.conf $dropin/
in_ct systemctl daemon-reload
in_ct systemctl restart incus-hpa
# bash's /dev/tcp: the container's own loopback, no curl needed.
scrape='exec 3<>/dev/tcp/127.0.0.1/9750 && printf "GET /metrics HTTP/1.0\r\n\r\n" >&3 && cat <&3'
until_ok "/metrics on 127.0.0.1:9750 in the container" 30 sh -c \
    "incus exec $ct -- bash -c '$scrape' | grep -q 'incus_hpa_instances{group=\"$group\",project=\"default\",state=\"current\"} 3'"
in_ct rm $dropin/metrics-tcp.conf
in_ct systemctl daemon-reload
desired 3

log "Incus over HTTPS: refused by the unit's sandbox, reached with the packaged drop-in"
# The host's incusd on 127.0.0.1:8443, reached from the container's own 127.0.0.1:8443 through
# a proxy device; a client certificate made here, trusted restricted to the project.
if [ -z "$(incus config get core.https_address)" ]; then
    incus config set core.https_address 127.0.0.1:8443
    https_set=1
fi
port=$(incus config get core.https_address | sed 's/.*://')
tls_dir=$(mktemp -d)
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:secp384r1 -sha384 -nodes -days 2 \
    -subj /CN=incus-hpa-e2e -keyout "$tls_dir/client.key" -out "$tls_dir/client.crt" 2>/dev/null
incus config trust add-certificate "$tls_dir/client.crt" --name "incus-hpa-e2e-$suffix" \
    --restricted --projects default
trusted=$(openssl x509 -in "$tls_dir/client.crt" -noout -fingerprint -sha256 | sed 's/.*=//; s/://g' | tr A-F a-f)
incus file push "$tls_dir/client.crt" "$ct/etc/incus-hpa/client.crt" --mode 0644 >/dev/null
incus file push "$tls_dir/client.key" "$ct/etc/incus-hpa/client.key" --mode 0640 >/dev/null
incus file push /var/lib/incus/server.crt "$ct/etc/incus-hpa/server.crt" --mode 0644 >/dev/null
in_ct chown root:incus-hpa /etc/incus-hpa/client.key
incus config device add "$ct" incus-https proxy listen=tcp:127.0.0.1:8443 \
    connect="tcp:127.0.0.1:$port" bind=instance >/dev/null
desired 3 'incus = "https://127.0.0.1:8443"
tls_client_cert = "/etc/incus-hpa/client.crt"
tls_client_key = "/etc/incus-hpa/client.key"
tls_server_cert = "/etc/incus-hpa/server.crt"'
in_ct incus-hpa validate >/dev/null || fail "validate refused the HTTPS file"
# It waits for Incus, never ready: --no-block.
in_ct systemctl restart --no-block incus-hpa
sandboxed() { [ "$(journal -o cat | grep -c 'https://127.0.0.1:8443: .*allows no network: install .*incus-https.conf')" -gt 0 ]; }
until_ok "HTTPS refused without the drop-in, naming the drop-in" 30 sandboxed
in_ct sh -c "sed 's/^IPAddressAllow=.*/IPAddressAllow=localhost/' \
    /usr/share/doc/incus-hpa/examples/incus-https.conf > $dropin/incus-https.conf"
connected() { journal -o cat | grep -c 'connected to Incus' || true; }
was=$(connected)
in_ct systemctl daemon-reload
in_ct systemctl restart incus-hpa
through() { [ "$(connected)" -gt "$was" ]; }
until_ok "the daemon reaches Incus over HTTPS" 30 through
until_ok "status over HTTPS shows the group" 30 sh -c \
    "incus exec $ct -- incus-hpa status --json | grep -q '\"current\": *3'"
[ "$(running)" -eq 3 ] || fail "the group changed when the daemon moved to HTTPS"
in_ct rm $dropin/incus-https.conf
in_ct systemctl daemon-reload
desired 3
in_ct systemctl restart incus-hpa

log "a broken edit"
in_ct sh -c "printf '[groups.$group]\nmax = 0\n' > $conf"
in_ct systemctl reload incus-hpa
has_error() { [ "$(journal -o json KEY="groups.$group.max" PRIORITY=3 | grep -c MESSAGE)" -gt 0 ]; }
until_ok "the error in the journal" 30 has_error
until_ok "STATUS says the config is invalid" 30 sh -c \
    "incus exec $ct -- systemctl show -p StatusText --value incus-hpa | grep -q 'CONFIG INVALID'"
[ "$(ct_read systemctl is-active incus-hpa)" = active ] || fail "the daemon stopped on a bad edit"
entry=$(journal -o json KEY="groups.$group.max" -n 1)
for field in FILE LINE COLUMN KEY; do
    grep -q "\"$field\"" <<<"$entry" || fail "the error entry has no $field field: $entry"
done
# Two more intervals: nothing changes while the file is broken.
sleep 4
[ "$(managed | sort)" = "$before" ] || fail "instances changed while the config was broken"

log "journal fields"
[ "$(journal -o json ACTION=create GROUP="$group" OUTCOME=ok | grep -c '"INSTANCE"')" -eq 3 ] ||
    fail "not 3 ACTION=create entries with INSTANCE"
[ "$(journal -o json GROUP="$group" REASON=below-min DESIRED=3 | grep -c '"CURRENT":"2"')" -ge 1 ] ||
    fail "no decision entry with CURRENT=2 DESIRED=3"
journal -o json-pretty GROUP="$group" REASON=below-min DESIRED=3 -n 1 >&2
journal -o json-pretty ACTION=create GROUP="$group" -n 1 >&2

log "an external signal: a program of root's run by the packaged unit"
in_ct sh -c 'printf "#!/bin/sh\ncat /etc/incus-hpa/depth\n" > /usr/local/bin/queue-depth &&
    chmod 755 /usr/local/bin/queue-depth && echo 40 > /etc/incus-hpa/depth'
desired 3 '' "scale_down_stabilization = \"0s\"
[[groups.$group.external]]
command = [\"/usr/local/bin/queue-depth\"]
target = 10"
in_ct incus-hpa validate >/dev/null || fail "incus-hpa validate refused the external signal"
in_ct systemctl reload incus-hpa
until_ok "4 instances for a value of 40 at 10 each" 60 count_is 4
[ "$(journal -o json GROUP="$group" REASON=external-above-target | grep -c MESSAGE)" -ge 1 ] ||
    fail "no decision entry with REASON=external-above-target"
ct_read incus-hpa status --json | grep -q '"name":"external 1","value":40' ||
    fail "status --json does not show the external signal"
in_ct sh -c 'echo 30 > /etc/incus-hpa/depth'
until_ok "back to 3 for a value of 30" 60 count_is 3

log "readiness and the HAProxy hook under the packaged unit"
# A group of busybox web servers on a bridge of the test's own, checked by a command run in each
# instance through Incus (no network: the unit has none), published by the packaged hook to a
# real HAProxy on the host. The container sees HAProxy's admin socket where Debian's haproxy.cfg
# puts it, /run/haproxy/admin.sock, owned by root and the haproxy group, mode 660; the group
# stands for the one Debian's haproxy package makes.
bash scripts/build-web-image.sh
command -v socat >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq socat >/dev/null
incus network show "$bridge" >/dev/null 2>&1 ||
    incus network create "$bridge" ipv4.address="$subnet.1/24" ipv4.nat=false ipv6.address=none >/dev/null
if ! incus profile show "$profile" >/dev/null 2>&1; then
    incus profile create "$profile" >/dev/null
    incus profile device add "$profile" eth0 nic name=eth0 network="$bridge" >/dev/null
fi
haproxy_dir=$(mktemp -d)
cat >"$haproxy_dir/haproxy.cfg" <<CFG
global
    stats socket $haproxy_dir/admin.sock mode 600 level admin
defaults
    mode http
    timeout connect 2s
    timeout client 10s
    timeout server 10s
frontend e2e
    bind 127.0.0.1:$haproxy_port
    default_backend web
backend web
    server-template web- 1-4 127.0.0.1:80 disabled
CFG
haproxy -db -f "$haproxy_dir/haproxy.cfg" >"$haproxy_dir/haproxy.log" 2>&1 &
haproxy_pid=$!
ha() { echo "$1" | socat - "UNIX-CONNECT:$haproxy_dir/admin.sock"; }
until_ok "HAProxy answers on its admin socket" 10 sh -c \
    "echo 'show info' | socat - UNIX-CONNECT:$haproxy_dir/admin.sock | grep -q '^Name: HAProxy'"
in_ct groupadd --system haproxy
hgid=$(ct_read getent group haproxy | cut -d: -f3)
in_ct mkdir -p /run/haproxy
incus config device add "$ct" haproxy-socket proxy \
    listen=unix:/run/haproxy/admin.sock connect="unix:$haproxy_dir/admin.sock" \
    bind=instance uid=0 gid="$hgid" mode=0660 >/dev/null
web_group() { # min
    cat <<TOML
[groups.$web]
min = $1
max = 4
image = "busybox-web"
profiles = ["default", "$profile"]
memory_threshold = 80
stop_timeout = "1s"
scale_down_stabilization = "0s"

[groups.$web.ready]
command = ["/bin/busybox", "wget", "-q", "-O", "/dev/null", "http://127.0.0.1/"]
period = "1s"

[groups.$web.endpoints]
port = 80
command = ["/usr/lib/incus-hpa/hooks/haproxy", "--socket", "/run/haproxy/admin.sock", "--backend", "web"]
deregistration_delay = "2s"

[groups.$web.config]
"limits.memory" = "64MiB"
TOML
}
# The web group's tables go in desired's [daemon] lines: its own [groups.…] header follows.
desired_web() { desired 3 "$(web_group "$1")"; }
desired_web 2
in_ct incus-hpa validate >/dev/null || fail "incus-hpa validate refused the web group"
in_ct systemctl reload incus-hpa
# Without the drop-in the daemon's user is not in the socket's group: the command fails, once
# in the journal with why, and nothing reaches HAProxy.
hook_failed() { [ "$(journal -o cat | grep -c "the endpoints command of $web failed: .*ermission denied")" -gt 0 ]; }
until_ok "the hook refused the socket without the drop-in, and said so" 90 hook_failed
# Servers of HAProxy's backend in service on the bridge: an address there, the operational
# state running (2; a slot in maintenance is 0).
in_service() { ha "show servers state web" | awk -v net="$subnet." \
    'index($5, net) == 1 && $6 == 2' | wc -l; }
servers_are() { [ "$(in_service)" -eq "$1" ]; }
servers_are 0 || fail "HAProxy has servers in service although the hook was refused"
in_ct cp /usr/share/doc/incus-hpa/examples/haproxy-hook.conf $dropin/
in_ct systemctl daemon-reload
in_ct systemctl restart incus-hpa
until_ok "2 web servers ready and in HAProxy's backend" 90 servers_are 2
published() { in_ct incus-hpa status --json | tr -d ' \n' | grep -o '"published":\[[^]]*\]' |
    grep -o '"instance"' | wc -l; }
[ "$(published)" -eq 2 ] || fail "status --json does not show 2 published endpoints"
answers() { exec 3<>"/dev/tcp/127.0.0.1/$haproxy_port" && printf 'GET / HTTP/1.0\r\n\r\n' >&3 &&
    head -n 1 <&3 | grep -q ' 200 '; }
for _ in 1 2 3 4; do (answers) || fail "a request through HAProxy did not get 200"; done
# A scale-in takes the instance out of HAProxy first, then stops it deregistration_delay later.
desired_web 1
in_ct systemctl reload incus-hpa
until_ok "1 web server in HAProxy's backend" 60 servers_are 1
for _ in 1 2 3 4; do (answers) || fail "a request through HAProxy failed during the scale-in"; done
left() { [ "$(journal -o json ACTION=deregister GROUP="$web" OUTCOME=ok | grep -c INSTANCE)" -ge 1 ]; }
until_ok "the deregistration in the journal" 30 left
gone=$(journal -o json ACTION=deregister GROUP="$web" -n 1 | grep -o '"INSTANCE":"[^"]*"' | cut -d'"' -f4)
deleted() { [ "$(journal -o json ACTION=delete INSTANCE="$gone" OUTCOME=ok | grep -c MESSAGE)" -ge 1 ]; }
until_ok "$gone deleted after it left the endpoints" 60 deleted
stamp() { journal -o json "$@" -n 1 | grep -o '"__REALTIME_TIMESTAMP":"[0-9]*"' | cut -d'"' -f4; }
gap=$(($(stamp ACTION=delete INSTANCE="$gone") - $(stamp ACTION=deregister INSTANCE="$gone")))
[ "$gap" -ge 2000000 ] || fail "$gone was deleted ${gap} us after it left the endpoints, not 2 s"
log "$gone left HAProxy's backend $((gap / 1000)) ms before it was deleted"
in_ct rm $dropin/haproxy-hook.conf
in_ct systemctl daemon-reload
incus config device remove "$ct" haproxy-socket >/dev/null

log "watchdog: a hung daemon is restarted"
desired 3
in_ct mkdir -p /run/systemd/system/incus-hpa.service.d
in_ct sh -c 'printf "[Service]\nWatchdogSec=4s\n" > /run/systemd/system/incus-hpa.service.d/e2e.conf'
in_ct systemctl daemon-reload
in_ct systemctl restart incus-hpa
pid=$(ct_read systemctl show -p MainPID --value incus-hpa)
in_ct kill -STOP "$pid"
until_ok "restarted by the watchdog" 60 sh -c \
    "test \"\$(incus exec $ct -- systemctl show -p NRestarts --value incus-hpa)\" -ge 1"
until_ok "active again" 60 sh -c "test \"\$(incus exec $ct -- systemctl is-active incus-hpa)\" = active"
[ "$(ct_read journalctl --no-pager -u incus-hpa | grep -ci 'watchdog timeout')" -ge 1 ] || fail "no watchdog line in the journal"

log "stop"
in_ct systemctl stop incus-hpa
[ "$(ct_read systemctl show -p Result --value incus-hpa)" = success ] || fail "stop did not end in Result=success"
[ "$(running)" -eq 3 ] || fail "stopping the daemon changed the instances"

log "a broken file at start: the unit fails (status 78) and is not restarted"
in_ct sh -c "printf '[groups.$group]\nmax = 0\n' > $conf"
if in_ct systemctl start incus-hpa 2>/dev/null; then fail "started on a broken file"; fi
[ "$(ct_read systemctl show -p ExecMainStatus --value incus-hpa)" = 78 ] || fail "exit status is not 78"
restarts=$(ct_read systemctl show -p NRestarts --value incus-hpa)
sleep 6 # longer than RestartSec: no restart may follow
[ "$(ct_read systemctl show -p NRestarts --value incus-hpa)" = "$restarts" ] || fail "restarted on a broken file"
[ "$(journal -o json KEY="groups.$group.max" PRIORITY=3 | grep -c MESSAGE)" -gt 0 ] || fail "start error not in the journal"

log "packaging/install.sh on a second systemd container (no .deb)"
ct2=$ct-src
incus launch incus-hpa-bookworm "$ct2" >/dev/null
cleanup_src() { incus delete --force "$ct2" >/dev/null 2>&1 || true; }
trap '[ -n "${KEEP:-}" ] || { cleanup; cleanup_src; }' EXIT
until_ok "systemd up in $ct2" 120 incus exec "$ct2" -- test -S /run/systemd/private
src=$(mktemp -d)
git archive HEAD systemd packaging README.md docs examples | tar -x -C "$src"
install -Dm0755 target/release/incus-hpa "$src/target/release/incus-hpa"
tar -C "$src" -cf - . | incus exec "$ct2" -- sh -c 'mkdir -p /root/src && tar -x -C /root/src'
rm -rf "$src"
incus exec "$ct2" -- bash /root/src/packaging/install.sh >/dev/null
# No Incus socket in this container: the daemon starts and waits for Incus (not ready yet).
incus exec "$ct2" -- systemctl start --no-block incus-hpa
read_in "$ct2" id -nG incus-hpa | grep -qw incus-admin || fail "install.sh: user not in incus-admin"
[ "$(read_in "$ct2" stat -c %U:%G:%a $conf)" = "root:incus-hpa:640" ] || fail "install.sh: config mode"
read_in "$ct2" systemctl cat incus-hpa | grep -q '^ExecStart=/usr/local/bin/incus-hpa run' ||
    fail "install.sh: unit not installed"
incus exec "$ct2" -- test -e /usr/share/doc/incus-hpa/examples/incus-https.conf ||
    fail "install.sh: the drop-ins the daemon's messages name are not in /usr/share/doc/incus-hpa"
waiting() { [ "$(incus exec "$ct2" -- journalctl -u incus-hpa --no-pager | grep -c 'cannot reach Incus')" -gt 0 ]; }
until_ok "the source-installed daemon runs and waits for Incus" 30 waiting
cleanup_src

log "PASSED in $((SECONDS - started))s"
