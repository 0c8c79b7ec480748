#!/usr/bin/env bash
# Load generator benchmark: the open-loop rates `upkeep lab load` holds with send-lag p99 under
# 1 ms, "alone" (generator and one `upkeep lab backend`) and "shared" (the same, through
# `upkeep serve` in front of that backend, everything on the same CPUs), with wrk's
# closed-loop figure on the same two targets in the same run for scale.
#
# Usage: bench/load.sh            (from the repository root; see docs/lab.md)
# Settings (environment):
#   LOAD_RATES      rates to try, ascending      (default: 2000 5000 8000 10000 15000 20000)
#   LOAD_DURATION   each measured run            (default 8s)
#   LOAD_REPEATS    runs per rate and setup      (default 2)
#   LOAD_SETUPS     setups to run                (default: alone shared)
#   UPKEEP          upkeep binary (default: target/release/upkeep, built when missing)
#   WRK             wrk binary (default: from PATH); without it the wrk rows are skipped
#   BENCH_KEEP=1    keep the temporary directory (logs, JSON of every run)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"

RATES=${LOAD_RATES:-2000 5000 8000 10000 15000 20000}
DURATION=${LOAD_DURATION:-8s}
REPEATS=${LOAD_REPEATS:-2}
SETUPS=${LOAD_SETUPS:-alone shared}

command -v curl >/dev/null || die "curl not found"
command -v ss >/dev/null || die "ss not found (Debian: apt-get install iproute2)"
WRK=${WRK:-$(find_bin wrk || true)}
upkeep_bin

free_port backend_port
mkdir -p "$work/backend" "$work/proxy"
"$UPKEEP" lab backend --listen "127.0.0.1:$backend_port" --name ok \
    >"$work/backend/stdout" 2>"$work/backend/stderr" &
pids+=($!)
wait_ok "$backend_port" "lab backend"
free_port proxy_port
free_port admin_port
"$UPKEEP" serve --listen "127.0.0.1:$proxy_port" --to "http://127.0.0.1:$backend_port" \
    --admin "127.0.0.1:$admin_port" --log-level warn \
    >"$work/proxy/stdout" 2>"$work/proxy/stderr" &
pids+=($!)
wait_ok "$proxy_port" "upkeep serve"

report_idle
echo "bench: upkeep lab load --mode pooled --duration $DURATION, $REPEATS runs per rate, $(nproc) CPUs"
printf '\n%-7s %7s %4s %8s %10s %10s %10s %8s\n' setup rate run errors lag_p99_ms lag_max_ms p99_ms held
declare -A best=()
for setup in $SETUPS; do
    case $setup in
    alone) port=$backend_port ;;
    shared) port=$proxy_port ;;
    *) die "unknown setup $setup (alone or shared)" ;;
    esac
    best[$setup]=none
    for rate in $RATES; do
        all_held=1
        for run in $(seq 1 "$REPEATS"); do
            out=$work/$setup-$rate-$run.json
            "$UPKEEP" lab load "http://127.0.0.1:$port/" --rate "$rate" --duration "$DURATION" \
                --json >"$out" 2>"$out.stderr" || die "lab load failed (see $out.stderr)"
            errors=$(json_field errors "$out")
            lag=$(json_field lag_p99_ms "$out")
            held=$(awk -v l="$lag" -v e="$errors" 'BEGIN { print (l < 1.0 && e == 0) ? "yes" : "no" }')
            [[ $held == yes ]] || all_held=0
            printf '%-7s %7s %4s %8s %10s %10s %10s %8s\n' "$setup" "$rate" "$run" "$errors" \
                "$lag" "$(json_field lag_max_ms "$out")" "$(json_field p99_ms "$out")" "$held"
        done
        ((all_held)) && best[$setup]=$rate
    done
done

echo
for setup in $SETUPS; do
    echo "bench: $setup: highest rate with send-lag p99 < 1 ms and no errors in every run: ${best[$setup]} req/s"
done
if [[ -n $WRK ]]; then
    for setup in $SETUPS; do
        port=$backend_port
        [[ $setup == shared ]] && port=$proxy_port
        rps=$("$WRK" -t2 -c64 -d"$DURATION" "http://127.0.0.1:$port/" | awk '/^Requests\/sec:/ { print $2 }')
        echo "bench: $setup: wrk -t2 -c64 (closed loop, same target): $rps req/s"
    done
else
    echo "bench: wrk not found; wrk figures skipped (Debian: apt-get install wrk)"
fi
