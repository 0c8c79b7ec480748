#!/usr/bin/env bash
# Instructions per proxied request: user-space instructions of `upkeep serve` (one serving
# thread) counted by callgrind over a fixed number of GETs from `upkeep lab load` through it to
# an `upkeep lab backend`. Unlike req/s on a shared 2-core machine, the count repeats run to
# run whatever else the machine does, so small changes to the request path can be compared.
# It leaves out kernel time (system calls, TCP on loopback); bench/proxy.sh measures that.
#
# Usage: bench/instructions.sh      (from the repository root; see docs/benchmarks.md)
# Settings (environment):
#   REQUESTS   measured requests (default 1000), sent at RATE per second (default 50)
#   UPKEEP     upkeep binary (default: target/release/upkeep, built when missing)
#   BENCH_KEEP=1  keep the temporary directory (callgrind output, logs)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"

REQUESTS=${REQUESTS:-1000}
RATE=${RATE:-50}
for tool in valgrind callgrind_control callgrind_annotate curl ss; do
    command -v "$tool" >/dev/null || die "$tool not found (Debian: apt-get install valgrind curl iproute2)"
done
upkeep_bin

lab_backend backend_port
free_port proxy_port
free_port admin_port
valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" \
    "$UPKEEP" serve --listen "127.0.0.1:$proxy_port" --to "http://127.0.0.1:$backend_port" \
    --admin "127.0.0.1:$admin_port" --access-log off --log-level warn --workers 1 \
    >"$work/serve.log" 2>&1 &
pids+=($!)
proxy_pid=$!
wait_ok "$proxy_port" "upkeep serve under callgrind"

# Warm up (connections open, lazy initialisation done), then count only the measured run.
"$UPKEEP" lab load "http://127.0.0.1:$proxy_port/" --rate "$RATE" --duration 2s >/dev/null 2>&1
callgrind_control -z "$proxy_pid" >/dev/null 2>&1
secs=$(awk -v n="$REQUESTS" -v r="$RATE" 'BEGIN { printf "%.3f", n / r }')
"$UPKEEP" lab load "http://127.0.0.1:$proxy_port/" --rate "$RATE" --duration "${secs}s" --json \
    >"$work/load.json" 2>"$work/load.log" || die "lab load failed (see $work/load.log)"
callgrind_control -d "$proxy_pid" >/dev/null 2>&1
sleep 1
dump=$(ls -S "$work"/callgrind.out.* 2>/dev/null | head -1)
[[ -n $dump ]] || die "callgrind wrote no dump"
total=$(callgrind_annotate "$dump" | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
requests=$(json_field requests "$work/load.json")
errors=$(json_field errors "$work/load.json")
((errors == 0)) || die "$errors of $requests requests failed; a count over failures is not a result"
echo "bench: $("$UPKEEP" --version | head -1), one serving thread, $requests GETs at $RATE/s"
awk -v t="$total" -v n="$requests" \
    'BEGIN { printf "bench: %d instructions in upkeep serve, %.1fk per request\n", t, t / n / 1000 }'
