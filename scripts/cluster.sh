#!/usr/bin/env bash
# A real three-member Incus cluster on this machine, for incus-hpa's cluster tests (run as root,
# after scripts/setup-incus.sh). Each member is an unprivileged, nested system container of the
# host's Incus running its own incusd (image: scripts/build-member-image.sh); see
# /work/shared/notes/incus-cluster.md for why it takes what it takes.
#
#   cluster.sh up              builds what is missing and forms the cluster, idempotently:
#                                bridge hpa-cm-br (10.250.77.1/24, no NAT, no IPv6: nothing leaves it),
#                                members hpa-cm1..3 (10.250.77.11..13, cluster names m1..m3,
#                                API on IP:8443, a `dir` pool `default`, offline after 11 s),
#                                cluster group hpa-two = {m2, m3}, the host's `busybox` image,
#                                a trusted client certificate for the host;
#                              then prints on stdout, and only there, shell-sourceable lines:
#                                CLUSTER_URL=  CLUSTER_CERT=  CLUSTER_KEY=  CLUSTER_SERVER_CERT=
#   cluster.sh down [--purge]  deletes the members and the bridge; --purge also the member image,
#                              its cached tarball and .debs, and the client certificate
#   cluster.sh exec mN CMD...  runs CMD in member mN (e.g. `cluster.sh exec m1 incus cluster list`)
#   cluster.sh read mN CMD...  the same for a CMD that only reads: an empty answer is asked
#                              again, as incus exec now and then loses the output (read-in.sh)
#   cluster.sh stop-member mN [--with-instances]
#                              stops mN's incusd (its instances keep running, unless
#                              --with-instances: then incus-startup shuts them down first) and
#                              waits until the others see it OFFLINE (cluster.offline_threshold
#                              11 s: it takes 9-12 s)
#   cluster.sh start-member mN starts it again and waits until the cluster sees it ONLINE
# Everything it makes is named hpa-cm*; it touches nothing else of the host's Incus. Logs go to
# stderr. Caches live in /var/cache/incus-hpa (the client certificate in .../cluster).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=/var/cache/incus-hpa
certs=$cache/cluster
bridge=hpa-cm-br
image=hpa-cm-member
subnet=10.250.77
members=(1 2 3)
offline_threshold=11
log() { printf 'cluster: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
    sed -n '/^#   cluster.sh/,/^# Everything/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
}

# member_read N CMD...: the output of CMD, which only reads, in hpa-cmN (read_in: asked again
# when incus exec loses it).
. "$here/read-in.sh"
member_read() {
    local n=$1
    shift
    read_in "hpa-cm$n" "$@"
}

# member_index mN|N|hpa-cmN: N (1..3).
member_index() {
    local n=${1#hpa-cm}
    n=${n#m}
    case $n in 1 | 2 | 3) printf '%s' "$n" ;; *) die "no member '$1' (m1, m2 or m3)" ;; esac
}

# in_member N CMD...: runs CMD in hpa-cmN.
in_member() {
    local n=$1
    shift
    incus exec "hpa-cm$n" -- "$@"
}

# wait_incusd N: waits until hpa-cmN's incusd answers, starting it if stop-member stopped it.
wait_incusd() {
    local n=$1
    for _ in $(seq 120); do
        in_member "$n" incus admin waitready --timeout 2 >/dev/null 2>&1 && return 0
        in_member "$n" systemctl start incus.socket incus.service >/dev/null 2>&1 || true
        sleep 1
    done
    die "incusd in hpa-cm$n is not ready after 2 minutes"
}

ensure_bridge() {
    incus network show "$bridge" >/dev/null 2>&1 && return
    log "creating bridge $bridge ($subnet.1/24, no NAT)"
    incus network create "$bridge" ipv4.address="$subnet.1/24" ipv4.nat=false ipv6.address=none >/dev/null
}

ensure_members() {
    local n pids=()
    for n in "${members[@]}"; do
        incus info "hpa-cm$n" >/dev/null 2>&1 && continue
        log "creating hpa-cm$n"
        incus init "$image" "hpa-cm$n" --network "$bridge" \
            -c security.nesting=true -c limits.memory=1GiB >/dev/null &
        pids+=($!)
    done
    for n in "${pids[@]}"; do wait "$n" || die "could not create a member"; done
    for n in "${members[@]}"; do
        if [ "$(incus list "^hpa-cm$n\$" -c s -f csv)" != RUNNING ]; then
            log "starting hpa-cm$n"
            incus start "hpa-cm$n"
        fi
    done
    for n in "${members[@]}"; do wait_incusd "$n"; done
}

# clustered N: whether hpa-cmN's incusd is a cluster member.
clustered() {
    member_read "$1" incus query /1.0/cluster 2>/dev/null | grep -q '"enabled": true'
}

ensure_cluster() {
    local n token
    if ! clustered 1; then
        log "bootstrapping the cluster on m1"
        in_member 1 incus admin init --preseed <<PRESEED
config:
  core.https_address: $subnet.11:8443
cluster:
  server_name: m1
  enabled: true
storage_pools:
- name: default
  driver: dir
profiles:
- name: default
  devices:
    root:
      path: /
      pool: default
      type: disk
PRESEED
    fi
    for n in "${members[@]}"; do
        [ "$n" = 1 ] && continue
        clustered "$n" && continue
        log "joining m$n"
        in_member 1 incus cluster revoke-token "m$n" >/dev/null 2>&1 || true
        token=$(in_member 1 incus cluster add "m$n" | tail -n 1)
        in_member "$n" incus admin init --preseed <<PRESEED
cluster:
  server_name: m$n
  enabled: true
  server_address: $subnet.1$n:8443
  cluster_token: $token
  member_config:
  - entity: storage-pool
    name: default
    key: source
    value: ""
PRESEED
    done
    # Only once clustered: Incus 6.0.4 answers every later PUT /1.0 of a standalone server that
    # has cluster.offline_threshold set by closing the connection (EOF).
    if [ "$(member_read 1 incus config get cluster.offline_threshold)" != "$offline_threshold" ]; then
        log "setting cluster.offline_threshold to $offline_threshold s"
        in_member 1 incus config set cluster.offline_threshold "$offline_threshold"
    fi
    if ! in_member 1 incus cluster group show hpa-two >/dev/null 2>&1; then
        log "creating cluster group hpa-two (m2, m3)"
        in_member 1 incus cluster group create hpa-two >/dev/null
    fi
    for n in 2 3; do
        member_read 1 incus query "/1.0/cluster/members/m$n" | grep -q '"hpa-two"' ||
            in_member 1 incus cluster group assign "m$n" default,hpa-two >/dev/null
    done
}

ensure_busybox() {
    in_member 1 incus image show busybox >/dev/null 2>&1 && return
    "$here/build-busybox-image.sh"
    local tmp
    tmp=$(mktemp -d)
    log "copying the host's busybox image to the cluster"
    incus image export busybox "$tmp/busybox" >/dev/null
    incus file push "$tmp"/busybox* hpa-cm1/root/busybox.tar.gz >/dev/null
    rm -rf "$tmp"
    in_member 1 incus image import /root/busybox.tar.gz --alias busybox >/dev/null
    in_member 1 rm -f /root/busybox.tar.gz
}

ensure_client_cert() {
    local fingerprint
    mkdir -p "$certs"
    if [ ! -s "$certs/client.crt" ] || [ ! -s "$certs/client.key" ]; then
        log "generating the host's client certificate"
        (umask 077 && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:secp384r1 -nodes \
            -sha384 -days 3650 -subj /CN=incus-hpa-cluster-client \
            -keyout "$certs/client.key" -out "$certs/client.crt" 2>/dev/null)
    fi
    chmod 0600 "$certs/client.key"
    chmod 0644 "$certs/client.crt"
    fingerprint=$(openssl x509 -in "$certs/client.crt" -noout -fingerprint -sha256 | sed 's/.*=//; s/://g' | tr A-F a-f)
    # Trusted as the README advises: restricted to the project the tests use.
    if ! member_read 1 incus query "/1.0/certificates/$fingerprint" 2>/dev/null | grep -q '"restricted": true'; then
        log "trusting the host's client certificate (restricted to the project default)"
        in_member 1 incus config trust remove "$fingerprint" >/dev/null 2>&1 || true
        incus file push "$certs/client.crt" hpa-cm1/root/hpa-cm-client.crt >/dev/null
        in_member 1 incus config trust add-certificate /root/hpa-cm-client.crt --name hpa-cm-host \
            --restricted --projects default >/dev/null
        in_member 1 rm -f /root/hpa-cm-client.crt
    fi
    # What a client pins: a cluster member presents the cluster certificate on 8443.
    incus file pull hpa-cm1/var/lib/incus/cluster.crt "$certs/server.crt.tmp" >/dev/null
    mv "$certs/server.crt.tmp" "$certs/server.crt"
}

# wait_online: waits until m1 sees every member ONLINE (a member whose incusd was just started
# again is OFFLINE until its next heartbeat).
wait_online() {
    local n ok
    for _ in $(seq 60); do
        ok=1
        for n in "${members[@]}"; do
            [ "$(member_status "$n")" = ONLINE ] || ok=''
        done
        [ -n "$ok" ] && return 0
        sleep 1
    done
    die "not every member is ONLINE after a minute: $(member_read 1 incus cluster list -f csv -c n,s | tr '\n' ' ')"
}

# server_pin: base64 SHA-256 of the cluster certificate's public key (curl --pinnedpubkey sha256//…).
server_pin() {
    openssl x509 -in "$certs/server.crt" -noout -pubkey | openssl pkey -pubin -outform der |
        openssl dgst -sha256 -binary | base64
}

up() {
    [ "$(id -u)" -eq 0 ] || die "run me as root"
    incus admin waitready --timeout 5 >/dev/null 2>&1 || die "the host's incusd is not running (scripts/setup-incus.sh)"
    local tool
    for tool in curl openssl; do
        command -v "$tool" >/dev/null || {
            log "installing $tool"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$tool" >/dev/null
        }
    done
    "$here/build-member-image.sh" "$image"
    ensure_bridge
    ensure_members
    ensure_cluster
    wait_online
    ensure_busybox
    ensure_client_cert
    # The cluster certificate names hpa-cm1, 127.0.0.1 and ::1, not the members' addresses: a
    # client pins it (its key here) rather than verifying a host name against it.
    curl -sfk --pinnedpubkey "sha256//$(server_pin)" --cert "$certs/client.crt" --key "$certs/client.key" \
        "https://$subnet.11:8443/1.0" | grep -q '"auth":"trusted"' ||
        die "the host's client certificate is not trusted by https://$subnet.11:8443"
    log "up: $(member_read 1 incus cluster list -f csv -c n,s | tr '\n' ' ')"
    printf 'CLUSTER_URL=https://%s.11:8443\n' "$subnet"
    printf 'CLUSTER_CERT=%s\n' "$certs/client.crt"
    printf 'CLUSTER_KEY=%s\n' "$certs/client.key"
    printf 'CLUSTER_SERVER_CERT=%s\n' "$certs/server.crt"
}

down() {
    local purge='' n
    case ${1:-} in
    --purge) purge=1 ;;
    '') ;;
    *) usage ;;
    esac
    for n in "${members[@]}"; do
        if incus info "hpa-cm$n" >/dev/null 2>&1; then
            log "deleting hpa-cm$n"
            incus delete --force "hpa-cm$n" >/dev/null
        fi
    done
    if incus network show "$bridge" >/dev/null 2>&1; then
        log "deleting bridge $bridge"
        incus network delete "$bridge" >/dev/null
    fi
    if [ -n "$purge" ]; then
        if incus image show "$image" >/dev/null 2>&1; then
            log "deleting image $image"
            incus image delete "$image" >/dev/null
        fi
        log "deleting the cached member image and client certificate"
        rm -rf "$cache/hpa-cm-member.tar.zst" "$cache/member-debs" "$certs"
    fi
}

# member_status N: mN's status as m1 (or, when m1 is the one asked about, m2) sees it.
member_status() {
    local n=$1 via=1
    [ "$n" = 1 ] && via=2
    member_read "$via" incus cluster list -f csv -c n,s 2>/dev/null | awk -F, -v m="m$n" '$1 == m {print $2}'
}

stop_member() {
    local n start units=incus.service
    n=$(member_index "${1:-}")
    case ${2:-} in
    --with-instances) units="incus-startup.service incus.socket incus.service" ;;
    '') ;;
    *) usage ;;
    esac
    # Stopping incus.socket also stops incus-startup.service, whose ExecStop shuts the member's
    # instances down; incus.service alone leaves them running (a local `incus` call in the member
    # would start incusd again through the socket, nothing from outside does).
    log "stopping $units in m$n"
    start=$(date +%s)
    # shellcheck disable=SC2086
    in_member "$n" systemctl stop $units
    for _ in $(seq 120); do
        [ "$(member_status "$n")" = OFFLINE ] && {
            log "m$n is OFFLINE after $(($(date +%s) - start)) s"
            return
        }
        sleep 1
    done
    die "m$n is not OFFLINE after 2 minutes"
}

start_member() {
    local n start
    n=$(member_index "${1:-}")
    log "starting incusd in m$n"
    start=$(date +%s)
    in_member "$n" systemctl start incus.socket incus.service incus-startup.service
    wait_incusd "$n"
    for _ in $(seq 120); do
        [ "$(member_status "$n")" = ONLINE ] && {
            log "m$n is ONLINE after $(($(date +%s) - start)) s"
            return
        }
        sleep 1
    done
    die "m$n is not ONLINE after 2 minutes"
}

case ${1:-} in
up) up ;;
down) shift; down "$@" ;;
exec)
    [ $# -ge 3 ] || usage
    n=$(member_index "$2")
    shift 2
    in_member "$n" "$@"
    ;;
read)
    [ $# -ge 3 ] || usage
    n=$(member_index "$2")
    shift 2
    member_read "$n" "$@"
    ;;
stop-member) stop_member "${2:-}" "${3:-}" ;;
start-member) start_member "${2:-}" ;;
*) usage ;;
esac
