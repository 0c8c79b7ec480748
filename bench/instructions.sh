#!/usr/bin/env bash
# Instructions per proxied request: user-space instructions of `upkeep serve` (one serving
# thread; or of HAProxy or nginx, PROXY below) counted by callgrind over a fixed number of
# GETs from `upkeep lab load` through it to an `upkeep lab backend`. Unlike req/s on a shared
# 2-core machine, the count repeats run to run whatever else the machine does, so small
# changes to the request path can be compared.
# It leaves out kernel time (system calls, TCP on loopback); bench/proxy.sh measures that.
#
# Two counts: GETs with only `Host` (the figure docs/benchmarks.md follows), and GETs with the
# fields a browser sends (`browser` below).
#
# Usage: bench/instructions.sh      (from the repository root; see docs/benchmarks.md)
# Settings (environment):
#   REQUESTS   measured requests (default 1000), sent at RATE per second (default 50)
#   UPKEEP     upkeep binary (default: target/release/upkeep, built when missing)
#   LOAD       the binary whose `lab load` sends the requests (default: UPKEEP; set it to
#              measure an older build that lacks `lab load -H`)
#   PROXY      the proxy counted: upkeep (default), haproxy or nginx (Debian's packages; one
#              thread or worker, the same backend with upstream keep-alive), so upkeep's count
#              can be set beside theirs
#   HAPROXY, NGINX  their binaries (default: from PATH, then /usr/sbin)
#   CALLGRIND_FLAGS  more callgrind options (e.g. --cache-sim=yes --branch-sim=yes; the
#              counts of misses are then in the kept output, BENCH_KEEP=1)
#   BENCH_KEEP=1  keep the temporary directory (callgrind output, logs)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"

REQUESTS=${REQUESTS:-1000}
RATE=${RATE:-50}
need "valgrind curl iproute2" valgrind callgrind_control callgrind_annotate curl ss
proxy_before_backend
LOAD=${LOAD:-$UPKEEP}
under_callgrind "${peer_cmd[@]}"
wait_ok "$proxy_port" "$PROXY under callgrind"

# A navigation request as a browser sends it (HTTP/1.1, 11 fields besides Host): the request
# shape of real traffic, where per-field work counts; `lab load` alone sends only `Host`.
browser=(
    -H "User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
    -H "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    -H "Accept-Language: en-US,en;q=0.5"
    -H "Accept-Encoding: gzip, deflate, br"
    -H "Referer: http://app.test/start"
    -H "Cookie: session=4f1c2a9e7b3d; theme=dark"
    -H "Upgrade-Insecure-Requests: 1"
    -H "Sec-Fetch-Dest: document"
    -H "Sec-Fetch-Mode: navigate"
    -H "Sec-Fetch-Site: same-origin"
    -H "Connection: keep-alive"
)

# measure NAME [lab load arguments]: warms up (connections open, lazy initialisation done),
# then counts only the measured run; sets `per_request`.
measure() {
    local name=$1
    shift
    "$LOAD" lab load "http://127.0.0.1:$proxy_port/" "$@" --rate "$RATE" --duration 2s >/dev/null 2>&1
    callgrind_control -z "$proxy_pid" >/dev/null 2>&1
    secs=$(awk -v n="$REQUESTS" -v r="$RATE" 'BEGIN { printf "%.3f", n / r }')
    "$LOAD" lab load "http://127.0.0.1:$proxy_port/" "$@" --rate "$RATE" --duration "${secs}s" --json \
        >"$work/load-$name.json" 2>"$work/load-$name.log" || die "lab load failed (see $work/load-$name.log)"
    callgrind_control --dump="$name" "$proxy_pid" >/dev/null 2>&1
    sleep 1
    dump=$(ls -t "$work"/callgrind.out.* 2>/dev/null | head -1)
    [[ -n $dump ]] || die "callgrind wrote no dump"
    total=$(callgrind_annotate "$dump" | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
    requests=$(json_field requests "$work/load-$name.json")
    errors=$(json_field errors "$work/load-$name.json")
    ((errors == 0)) || die "$errors of $requests requests failed; a count over failures is not a result"
    per_request=$(awk -v t="$total" -v n="$requests" 'BEGIN { printf "%.1f", t / n / 1000 }')
    echo "bench: $name: $total instructions in $PROXY, ${per_request}k per request"
}

echo "bench: $version, $what, $REQUESTS GETs at $RATE/s each"
measure host-only
measure browser-fields "${browser[@]}"
