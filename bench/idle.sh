#!/usr/bin/env bash
# Memory per idle downstream connection: RSS of `upkeep serve` (VmRSS, one serving thread)
# before and while N keep-alive HTTP/1.1 connections that each made one GET sit idle, for a
# small response ("ok\n") and a 64 KiB one, from an `upkeep lab backend`.
#
# Usage: bench/idle.sh      (from the repository root; see docs/benchmarks.md)
# Settings (environment):
#   CONNS      idle connections (default 2000)
#   HOLD       seconds the clients stay idle (default 3; RSS is read after the first)
#   UPKEEP     upkeep binary (default: target/release/upkeep, built when missing)
#   BENCH_KEEP=1  keep the temporary directory (logs)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"

CONNS=${CONNS:-2000}
HOLD=${HOLD:-3}
need "curl iproute2 python3" curl ss python3
((CONNS + 100 <= $(ulimit -n))) || ulimit -n $((CONNS + 100)) 2>/dev/null ||
    die "CONNS=$CONNS needs more open files than ulimit -n allows ($(ulimit -n))"
upkeep_bin

# Opens CONNS connections to 127.0.0.1:PORT, one GET on each (response read whole), holds
# them open and idle for HOLD seconds, then closes them. Writes "ready" to FILE once all are
# idle. Loopback only, bounded: every socket operation times out after 10 s.
cat >"$work/idle.py" <<'EOF'
import socket, sys, time
port, conns, hold, ready = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
req = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"

def one(s):
    s.sendall(req)
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d:
            raise SystemExit("closed before the response head")
        buf += d
    head, body = buf.split(b"\r\n\r\n", 1)
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit("not 200: %r" % head[:40])
    length = None
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while (len(body) < length) if length is not None else not body.endswith(b"0\r\n\r\n"):
        d = s.recv(65536)
        if not d:
            raise SystemExit("closed inside the response body")
        body += d

socks = []
for _ in range(conns):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    one(s)
    socks.append(s)
open(ready, "w").write("ready\n")
time.sleep(hold)
for s in socks:
    s.close()
EOF

# wait_body PORT NAME BYTES: waits until http://127.0.0.1:PORT/ answers 200 with a body of
# BYTES bytes; fails after 10 s or when the last started process exits.
wait_body() {
    local port=$1 name=$2 want=$3 i size
    for i in $(seq 1 100); do
        kill -0 "${pids[-1]}" 2>/dev/null || die "$name exited at start-up (logs in $work/)"
        size=$(curl -s --fail --max-time 1 -o /dev/null -w '%{size_download}' "http://127.0.0.1:$port/" 2>/dev/null || true)
        [[ $size == "$want" ]] && return 0
        sleep 0.1
    done
    die "$name on port $port did not answer 200 with $want bytes within 10 s (logs in $work)"
}

rss_kib() {
    awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"
}

# measure NAME BACKEND_PORT BODY_BYTES: one `upkeep serve` in front of the backend, RSS before and with
# CONNS idle connections; prints a result line.
measure() {
    local name=$1 backend_port=$2 proxy_port admin_port serve_pid client_pid before during i
    free_port proxy_port
    free_port admin_port
    "$UPKEEP" serve --listen "127.0.0.1:$proxy_port" --to "http://127.0.0.1:$backend_port" \
        --admin "127.0.0.1:$admin_port" --access-log off --log-level warn --workers 1 \
        >"$work/serve-$name.log" 2>&1 &
    pids+=($!)
    serve_pid=$!
    wait_body "$proxy_port" "upkeep serve" "$3"
    # Warm up (lazy initialisation, the upstream connection pooled) before the first reading.
    python3 "$work/idle.py" "$proxy_port" 20 0 "$work/warm-$name" ||
        die "warm-up clients failed"
    sleep 0.5
    before=$(rss_kib "$serve_pid")
    rm -f "$work/ready-$name"
    python3 "$work/idle.py" "$proxy_port" "$CONNS" "$HOLD" "$work/ready-$name" \
        >"$work/clients-$name.log" 2>&1 &
    pids+=($!)
    client_pid=$!
    for i in $(seq 1 600); do
        [[ -e $work/ready-$name ]] && break
        kill -0 "$client_pid" 2>/dev/null || die "idle clients failed (see $work/clients-$name.log)"
        sleep 0.1
    done
    [[ -e $work/ready-$name ]] || die "idle clients not ready within 60 s"
    sleep 1
    during=$(rss_kib "$serve_pid")
    ss -Htn state established "( sport = :$proxy_port )" | wc -l >"$work/established-$name"
    wait "$client_pid" || die "idle clients failed (see $work/clients-$name.log)"
    stop "$client_pid"
    stop "$serve_pid"
    awk -v n="$name" -v c="$CONNS" -v b="$before" -v d="$during" -v e="$(cat "$work/established-$name")" \
        'BEGIN { printf "bench: %-14s RSS %d KiB before, %d KiB with %d idle connections (%d established): %.1f KiB per idle connection\n", n, b, d, c, e, (d - b) / c }'
}

# The lab backend also sends its name in a header, so it cannot answer 64 KiB: a small
# HTTP/1.1 keep-alive backend serves that body, on loopback, for this run only.
cat >"$work/large.py" <<'EOF'
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
body = b"x" * 65536
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
EOF

free_port small_port
free_port large_port
"$UPKEEP" lab backend --listen "127.0.0.1:$small_port" --name ok >"$work/backend-small.log" 2>&1 &
pids+=($!)
wait_ok "$small_port" "lab backend"
python3 "$work/large.py" "$large_port" >"$work/backend-large.log" 2>&1 &
pids+=($!)
wait_body "$large_port" "64 KiB backend" 65536

echo "bench: $("$UPKEEP" --version | head -1), one serving thread, $CONNS idle keep-alive connections"
measure 3B-body "$small_port" 3
measure 64KiB-body "$large_port" 65536
