#!/usr/bin/env bash
# Memory a proxied request touches: callgrind's cache simulation of the proxy (`upkeep serve`
# with one serving thread; or Debian's HAProxy or nginx with one thread or worker, PROXY
# below) over one `wrk -t1` run through it to an `upkeep lab backend`, at each connection
# count in CONNECTIONS, divided by the requests wrk completed. The simulated last-level cache
# is 1 MiB, 8-way (LL below), about one core's L2 on current server processors: a line that
# misses there came from memory, or from the shared L3, on real hardware. With more
# connections in flight, more of each one's state must stay in cache between its requests;
# the LL misses per request say how much of it did not.
# Like bench/instructions.sh it counts user space only, and the counts repeat run to run
# whatever else the machine does (to a few per cent: the requests that share a pass of the
# event loop vary); req/s under valgrind mean nothing.
#
# Usage: bench/cache.sh      (from the repository root; see docs/benchmarks.md)
# Settings (environment):
#   PROXY        the proxy measured: upkeep (default), haproxy or nginx
#   CONNECTIONS  space-separated wrk connection counts (default "64 256")
#   DURATION     each counted wrk run (default 10s), after a 3 s warm-up at the same count
#   LL           the simulated last-level cache, size,associativity,line (default 1048576,8,64)
#   UPKEEP       upkeep binary (default: target/release/upkeep, built when missing)
#   HAPROXY, NGINX  their binaries (default: from PATH, then /usr/sbin)
#   CALLGRIND_FLAGS  more callgrind options
#   BENCH_KEEP=1 keep the temporary directory (callgrind dumps, wrk's output, logs)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"

CONNECTIONS=${CONNECTIONS:-64 256}
DURATION=${DURATION:-10s}
LL=${LL:-1048576,8,64}
need "valgrind wrk curl iproute2" valgrind callgrind_control callgrind_annotate wrk curl ss
proxy_before_backend
CALLGRIND_FLAGS="--cache-sim=yes --LL=$LL ${CALLGRIND_FLAGS:-}" under_callgrind "${peer_cmd[@]}"
wait_ok "$proxy_port" "$PROXY under callgrind"

url="http://127.0.0.1:$proxy_port/"
echo "bench: $version, $what, wrk -t1 for $DURATION per count, simulated LL cache $LL"
printf '%-12s %9s %11s %14s %10s %10s %10s\n' connections requests "instr/req" "data refs/req" "L1 miss" \
    "LL miss" "of them rd"
for c in $CONNECTIONS; do
    # Connections (downstream and upstream) open, buffers and pools at their working size.
    wrk -t1 -c"$c" -d3s --timeout 30s "$url" >/dev/null
    callgrind_control -z "$proxy_pid" >/dev/null 2>&1
    # Under valgrind a pass over 256 connections can take longer than wrk's default 2 s timeout.
    wrk -t1 -c"$c" -d"$DURATION" --timeout 30s "$url" >"$work/wrk-$c.txt"
    callgrind_control --dump="c$c" "$proxy_pid" >/dev/null 2>&1
    sleep 1
    if grep -qE "Non-2xx|Socket errors" "$work/wrk-$c.txt"; then
        die "wrk saw errors at $c connections; a count over failures is not a result (see $work/wrk-$c.txt)"
    fi
    requests=$(awk '/requests in/ { print $1 }' "$work/wrk-$c.txt")
    ((requests > 0)) || die "wrk completed no request (see $work/wrk-$c.txt)"
    dump=$(ls -t "$work"/callgrind.out.* 2>/dev/null | head -1)
    [[ -n $dump ]] || die "callgrind wrote no dump"
    # PROGRAM TOTALS in the order asked for (Ir Dr Dw D1mr D1mw DLmr DLmw), each followed by
    # its share in parentheses, which goes. The instructions are those of a request with this
    # many in flight, where bench/instructions.sh sends one at a time.
    callgrind_annotate --show=Ir,Dr,Dw,D1mr,D1mw,DLmr,DLmw "$dump" 2>/dev/null |
        awk -v n="$requests" -v c="$c" '/PROGRAM TOTALS/ {
            gsub(/\([^)]*\)/, ""); $0 = $0
            for (i = 1; i <= 7; i++) gsub(",", "", $i)
            printf "%-12s %9d %11.0f %14.0f %10.1f %10.1f %10.1f\n", c, n, $1 / n,
                ($2 + $3) / n, ($4 + $5) / n, ($6 + $7) / n, $6 / n
        }'
done
