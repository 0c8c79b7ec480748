#!/usr/bin/env bash
# System calls per proxied request: `strace -f -c` attached to the proxy (`upkeep serve` with
# one serving thread; or Debian's HAProxy or nginx with one thread or worker, PROXY below) for
# one wrk run through it to an `upkeep lab backend`, divided by the requests wrk completed.
# The proxy is slower under strace, so its req/s mean nothing here; the calls a request costs
# do not depend on the speed, apart from `epoll_wait`, which a busier proxy makes fewer of.
# The kernel's work for each call (loopback TCP, wake-ups) is most of a proxied request's CPU
# time (bench/proxy.sh).
#
# Usage: bench/syscalls.sh      (from the repository root; see docs/benchmarks.md)
# Settings (environment):
#   PROXY        the proxy counted: upkeep (default), haproxy or nginx
#   CONNECTIONS  wrk connections (default 64)
#   DURATION     the counted wrk run (default 5s), after a warm-up of 1 s without strace
#   UPKEEP       upkeep binary (default: target/release/upkeep, built when missing)
#   HAPROXY, NGINX  their binaries (default: from PATH, then /usr/sbin)
#   BENCH_KEEP=1 keep the temporary directory (strace's summary, wrk's output, logs)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"

CONNECTIONS=${CONNECTIONS:-64}
DURATION=${DURATION:-5s}
need "strace wrk curl iproute2" strace wrk curl ss
proxy_before_backend
"${peer_cmd[@]}" >"$work/serve.log" 2>&1 &
pids+=($!)
proxy_pid=$!
wait_ok "$proxy_port" "$PROXY"

url="http://127.0.0.1:$proxy_port/"
# Upstream connections open and lazy initialisation done before counting.
wrk -t2 -c"$CONNECTIONS" -d1s "$url" >/dev/null
strace -f -c -o "$work/strace.txt" -p "$proxy_pid" 2>"$work/strace.log" &
strace_pid=$!
sleep 0.5
wrk -t2 -c"$CONNECTIONS" -d"$DURATION" "$url" >"$work/wrk.txt"
kill -INT "$strace_pid"
wait "$strace_pid" || true
[[ -s $work/strace.txt ]] || die "strace wrote no summary (see $work/strace.log)"
if grep -qE "Non-2xx|Socket errors" "$work/wrk.txt"; then
    die "wrk saw errors; a count over failures is not a result (see $work/wrk.txt)"
fi
requests=$(awk '/requests in/ { print $1 }' "$work/wrk.txt")
((requests > 0)) || die "wrk completed no request (see $work/wrk.txt)"

echo "bench: $version, $what, wrk -c$CONNECTIONS for $DURATION under strace: $requests requests"
# strace -c: % time, seconds, usecs/call, calls, [errors,] syscall; the last line is the total.
awk -v n="$requests" '
    $NF == "total" { total = $4; next }
    $1 ~ /^[0-9.]+$/ && NF >= 5 {
        errors = (NF == 6) ? $5 : 0
        printf "bench: %-14s %7.3f per request", $NF, $4 / n
        if (errors / n >= 0.001) printf " (%.3f of them failed, EAGAIN and the like)", errors / n
        printf "\n"
    }
    END { printf "bench: all system calls %.2f per request\n", total / n }
' "$work/strace.txt"
