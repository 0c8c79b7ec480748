#!/usr/bin/env bash
# Soak: N minutes of open-loop load through `upkeep serve` while faults cycle (RST blips,
# stalled backends, slow and stalled clients, silent sockets, DNS failures, reloads), printing
# upkeep's RSS and open file descriptors every 30 s. Both must stay flat after warm-up, and
# the load must see no errors: every fault leaves a healthy path (the other backend, the last
# known good addresses, the running config).
#
# Usage: bench/soak.sh            (from the repository root; see docs/benchmarks.md)
# Settings (environment):
#   SOAK_MINUTES    how long                      (default 10)
#   SOAK_RATE       load, requests per second     (default 200)
#   SOAK_SAMPLE     seconds between samples       (default 30)
#   UPKEEP          upkeep binary (default: target/release/upkeep, built when missing)
#   BENCH_KEEP=1    keep the temporary directory (logs, the load's JSON summary)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"

MINUTES=${SOAK_MINUTES:-10}
RATE=${SOAK_RATE:-200}
SAMPLE=${SOAK_SAMPLE:-30}
command -v curl >/dev/null || die "curl not found"
command -v python3 >/dev/null || die "python3 not found"
command -v ss >/dev/null || die "ss not found (Debian: apt-get install iproute2)"
upkeep_bin
total_s=$(awk -v m="$MINUTES" 'BEGIN { printf "%d", m * 60 }')
((total_s >= 30)) || die "SOAK_MINUTES must be at least 0.5"

free_port app_port
free_port dns_port
free_port dns_ctl
free_port dc1_ctl
free_port dc2_ctl
free_port bulk_port
free_port proxy_port
free_port admin_port
mkdir -p "$work/bulk"

cat >"$work/zone.toml" <<ZONE
[names."app.upkeep.test"]
mode = "fixed"
addrs = ["127.0.0.11", "127.0.0.12"]
ttl = 1
ZONE
"$UPKEEP" lab dns --listen "127.0.0.1:$dns_port" --zone "$work/zone.toml" \
    --control "127.0.0.1:$dns_ctl" >"$work/dns.log" 2>&1 &
pids+=($!)
for dc in 1 2; do
    ctl_var=dc${dc}_ctl
    "$UPKEEP" lab backend --listen "127.0.0.1$dc:$app_port" --name "dc$dc" \
        --control "127.0.0.1:${!ctl_var}" >"$work/dc$dc.log" 2>&1 &
    pids+=($!)
done
# Large bodies for the slow and stalled readers: a plain file server on its own route.
head -c $((64 * 1024 * 1024)) /dev/zero >"$work/bulk/big.bin"
(cd "$work" && exec python3 -m http.server "$bulk_port" --bind 127.0.0.1) >"$work/bulk.log" 2>&1 &
pids+=($!)

cat >"$work/upkeep.toml" <<CONF
access_log = "off"
[admin]
listen = "127.0.0.1:$admin_port"
[dns]
servers = ["127.0.0.1:$dns_port"]
[lifecycle]
drain_delay = "0s"
[[listener]]
listen = "127.0.0.1:$proxy_port"
header_read_timeout = "5s"
client_body_timeout = "5s"
send_timeout = "5s"
[[route]]
path = "/bulk/"
group = "bulk"
[[route]]
path = "/"
group = "app"
[groups.app]
endpoints = ["app.upkeep.test:$app_port"]
connect_timeout = "500ms"
try_timeout = "1s"
read_timeout = "5s"
deadline = "10s"
[groups.bulk]
required = false
endpoints = ["127.0.0.1:$bulk_port"]
read_timeout = "5s"
CONF
"$UPKEEP" check "$work/upkeep.toml" >/dev/null 2>&1 || die "soak config refused: $("$UPKEEP" check "$work/upkeep.toml" 2>&1)"
"$UPKEEP" serve --config "$work/upkeep.toml" --log-level warn >"$work/upkeep.log" 2>&1 &
upkeep_pid=$!
pids+=($upkeep_pid)
for i in $(seq 1 100); do
    kill -0 "$upkeep_pid" 2>/dev/null || die "upkeep exited at start-up (logs in $work/)"
    curl -s --fail --max-time 1 "http://127.0.0.1:$proxy_port/" >/dev/null && break
    ((i < 100)) || die "upkeep did not reach the backends within 10 s (logs in $work)"
    sleep 0.1
done

fault() { curl -s -X POST --max-time 2 "http://127.0.0.1:$1/fault?set=$2" >/dev/null || true; }
dns_mode() { curl -s -X POST --max-time 2 "http://127.0.0.1:$dns_ctl/mode?name=app.upkeep.test&mode=$1${2:-}" >/dev/null || true; }

# Clients that misbehave: slow readers (1 KiB/s of a 64 MiB body), stalled readers (never
# read), silent sockets (connect, send nothing). Each lives at most 20 s.
bad_clients() {
    python3 - "$proxy_port" <<'PY' &
import socket, sys, threading, time
port = int(sys.argv[1])
def slow(stall):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"GET /bulk/big.bin HTTP/1.1\r\nHost: soak\r\n\r\n")
    end = time.time() + 20
    try:
        while time.time() < end:
            if not stall and not s.recv(1024):
                break
            time.sleep(1)
    except OSError:
        pass
    s.close()
def silent():
    s = socket.create_connection(("127.0.0.1", port))
    try:
        s.settimeout(20)
        s.recv(1)
    except OSError:
        pass
    s.close()
ts = [threading.Thread(target=slow, args=(i % 2 == 0,)) for i in range(20)]
ts += [threading.Thread(target=silent) for _ in range(20)]
for t in ts: t.start()
for t in ts: t.join()
PY
}

# One fault per step, in a cycle: each leaves a healthy path for the load.
step=0
apply_fault() {
    case $((step % 5)) in
    0) fault "$dc1_ctl" refuse; sleep 2; fault "$dc1_ctl" none ;;             # RST blip
    1) fault "$dc2_ctl" stall; sleep 3; fault "$dc2_ctl" none ;;              # stalled backend
    2) bad_clients ;;                                                         # slow/stalled clients
    3) dns_mode servfail; sleep 4; dns_mode nxdomain; sleep 4                 # DNS failures
       dns_mode fixed "&addrs=127.0.0.11,127.0.0.12" ;;
    4) "$UPKEEP" reload --admin "127.0.0.1:$admin_port" >/dev/null 2>&1 || echo "bench: reload refused" >&2 ;;
    esac
    step=$((step + 1))
}

sample() {
    local rss fds open
    rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$upkeep_pid/status")
    fds=$(ls "/proc/$upkeep_pid/fd" | wc -l)
    open=$(curl -s --max-time 2 "http://127.0.0.1:$admin_port/metrics" |
        awk '/^upkeep_downstream_connections_open / { print $2 }')
    printf '%6s %10s %8s %10s   %s\n' "$1" "$((rss / 1024))" "$fds" "${open:-?}" "$2"
}

report_idle
echo "bench: soak ${MINUTES} min at $RATE req/s through upkeep ($UPKEEP), faults cycling every 10 s"
"$UPKEEP" lab load "http://127.0.0.1:$proxy_port/" --rate "$RATE" --duration "${total_s}s" \
    --records "$work/records.jsonl" --json >"$work/load.json" 2>"$work/load.stderr" &
load_pid=$!
pids+=($load_pid)
printf '\n%6s %10s %8s %10s   %s\n' t_s rss_mib fds conns "last fault"
start=$(date +%s)
next_sample=0
last=none
names=("rst blip dc1" "stall dc2" "slow+stalled clients" "dns servfail+nxdomain" "reload")
while kill -0 "$load_pid" 2>/dev/null; do
    now=$(($(date +%s) - start))
    if ((now >= next_sample)); then
        sample "$now" "$last"
        next_sample=$((next_sample + SAMPLE))
    fi
    if ((now + 10 < total_s)); then
        last=${names[$((step % 5))]}
        apply_fault
    fi
    sleep 10
done
wait "$load_pid" || die "lab load failed (see $work/load.stderr)"
sleep 6 # the last misbehaving clients are cut by the 5 s timeouts
sample "$(($(date +%s) - start))" "end"
echo
echo "bench: load: requests $(json_field requests "$work/load.json"), errors $(json_field errors "$work/load.json"), p50 $(json_field p50_ms "$work/load.json") ms, p99 $(json_field p99_ms "$work/load.json") ms"
# Errors by status or client error and upkeep's cause, with the fault running when they began.
python3 - "$work/records.jsonl" <<'PY'
import collections, json, sys
by = collections.Counter()
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("error") is not None or (r.get("status") or 0) >= 500:
        by[(r.get("status"), str(r.get("error")), r.get("cause"))] += 1
for (status, error, cause), n in by.most_common():
    print(f"bench: errors: {n} status={status} error={error} cause={cause}")
PY
curl -s "http://127.0.0.1:$admin_port/metrics" | grep -E '^upkeep_(timeouts_total|downstream_connections_refused_total|peer_ejections_total|retries_total)' | sed 's/^/bench: /'
