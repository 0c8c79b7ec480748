#!/usr/bin/env bash
# Proxy benchmark: one small-response backend, driven by wrk directly, through upkeep, through
# nginx and through HAProxy, with the same threads, connections and duration for every target.
# Prints req/s, p50, p99, the proxy's CPU time per request, and the ratios of each row to
# direct and to nginx (upkeep/direct, upkeep/nginx), at each concurrency (64 and 256 by
# default), then the goal verdicts as PASS/FAIL lines (see docs/benchmarks.md).
#
# Usage: bench/proxy.sh            (from the repository root; see docs/benchmarks.md)
# Settings (environment):
#   BENCH_DURATION     measured wrk run per target         (default 10s)
#   BENCH_WARMUP       unmeasured wrk run before each one  (default 2s)
#   BENCH_THREADS      wrk threads                         (default 2)
#   BENCH_CONNECTIONS  wrk connections, one table section per value (default "64 256")
#   BENCH_TARGETS      rows at the first concurrency, in order (default: direct upkeep upkeep-log
#                      nginx nginx-log haproxy upkeep-unpinned nginx-pinned haproxy-pinned).
#                      upkeep holds each serving thread to its own CPU by default
#                      (`--cpu-affinity auto`); upkeep-unpinned runs it with `--cpu-affinity off`,
#                      nginx-pinned with `worker_cpu_affinity auto`, haproxy-pinned with `cpu-map`:
#                      the same choice made both ways for every proxy
#   BENCH_HIGH_TARGETS rows at the other concurrencies (default: direct upkeep nginx haproxy)
#   BENCH_UPKEEP_WORKERS  space-separated `--workers` counts; adds one upkeep row per count at
#                         the first concurrency (default "1 2"; the plain upkeep row runs one
#                         serving thread per CPU)
#   UPKEEP             upkeep binary (default: target/release/upkeep under CARGO_TARGET_DIR,
#                      built with `cargo build --release -p upkeep` when missing)
#   UPKEEP_PGO         a second upkeep binary to measure beside it, the profile-guided build
#                      (bench/pgo.sh prints its path): adds an upkeep-pgo row at every
#                      concurrency and an upkeep-pgo-h2 row, and judges them against the same
#                      goals in lines of their own ("pgo: ...")
#   NGINX, HAPROXY, WRK  binaries (default: from PATH, then /usr/sbin)
#   BENCH_KEEP=1       keep the temporary directory (configs, logs, raw wrk output)
#   BENCH_WS           WebSocket rows after the HTTP table, in order (default: ws-direct
#                      ws-upkeep ws-nginx ws-haproxy; empty: none). A Python `websockets` echo
#                      server behind each proxy, a Python client doing back-to-back echoes
#                      (bench/ws.py); needs python3 with `websockets`
#   BENCH_WS_CONNECTIONS  WebSocket connections (default 16)
#   BENCH_H2_TARGETS   HTTP/2 rows: h2load over TLS (ALPN h2) to each proxy, the same HTTP/1.1
#                      backend behind (default: upkeep-h2 nginx-h2 haproxy-h2 upkeep-h2-h2up
#                      haproxy-h2-h2up; the last two speak h2c to the backend); empty: none.
#                      Needs h2load (Debian: nghttp2-client) and openssl.
#   BENCH_H2_CLIENTS   h2load clients (connections)          (default 16)
#   BENCH_H2_STREAMS   h2load streams per connection         (default 8)
#   BENCH_PROXY_CPUS   CPUs for the proxy under test alone, as taskset lists them ("2-3"): every
#                      proxy runs there, with as many workers or threads as the list has CPUs,
#                      and wrk, h2load, the backend and the WebSocket programs on the other CPUs
#                      this script may use. Unset (the default): all share every CPU
#   BENCH_ROUNDS       rounds of every HTTP/1.1 and HTTP/2 row (default 1). With N > 1 the rows
#                      of one table section are measured in turn N times, each round starting
#                      one row later in the list, and each row shows the median of its rounds
#                      (errors added up; the notes give the range of req/s): the goals are then
#                      judged on medians, not on where in a drifting run a row fell
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"

DURATION=${BENCH_DURATION:-10s}
WARMUP=${BENCH_WARMUP:-2s}
THREADS=${BENCH_THREADS:-2}
CONNECTION_LIST=${BENCH_CONNECTIONS:-64 256}
CONNECTIONS=${CONNECTION_LIST%% *}
# expand_cpus LIST: the CPUs of a taskset-style LIST ("0-2,5"), one a line.
expand_cpus() {
    tr ',' '\n' <<<"$1" | while IFS=- read -r a b; do seq "$a" "${b:-$a}"; done
}
# The CPUs this script may run on, as the kernel lists them and one a line (read before
# BENCH_PROXY_CPUS narrows them).
allowed_list=$(awk '/^Cpus_allowed_list/ { print $2 }' /proc/self/status)
ALLOWED_CPUS=$(expand_cpus "$allowed_list")

# BENCH_PROXY_CPUS: the proxies on those CPUs (`on_proxy_cpus` before each one's command),
# everything else on the rest (this shell's own affinity, which its other children inherit).
# PROXY_CPUS: the proxies' CPUs, one a line; NGINX_WORKERS and PROXY_THREADS: the proxies'
# worker processes and threads (nginx `auto` and two HAProxy threads when unset, as always).
on_proxy_cpus=()
PROXY_CPUS=$ALLOWED_CPUS
NGINX_WORKERS=auto
PROXY_THREADS=2
if [[ -n ${BENCH_PROXY_CPUS:-} ]]; then
    command -v taskset >/dev/null || die "taskset not found (Debian: apt-get install util-linux)"
    [[ $BENCH_PROXY_CPUS =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] ||
        die "BENCH_PROXY_CPUS: a CPU list such as 2-3 or 2,3, not '$BENCH_PROXY_CPUS'"
    PROXY_CPUS=$(expand_cpus "$BENCH_PROXY_CPUS" | sort -nu)
    for c in $PROXY_CPUS; do
        grep -qx "$c" <<<"$ALLOWED_CPUS" ||
            die "BENCH_PROXY_CPUS: CPU $c is not one this script may run on ($allowed_list)"
    done
    # grep finds no line (fails) when the proxies would have every CPU.
    load_cpus=$({ grep -vxF -f <(printf '%s\n' "$PROXY_CPUS") <<<"$ALLOWED_CPUS" || true; } | paste -sd,)
    [[ -n $load_cpus ]] ||
        die "BENCH_PROXY_CPUS: no CPU left for wrk and the backend (allowed: $allowed_list)"
    taskset -pc "$load_cpus" $$ >/dev/null
    on_proxy_cpus=(taskset -c "$(paste -sd, <<<"$PROXY_CPUS")")
    NGINX_WORKERS=$(wc -l <<<"$PROXY_CPUS")
    PROXY_THREADS=$NGINX_WORKERS
fi
# cpu_mask: the proxies' CPUs as the bit mask nginx's `worker_cpu_affinity auto MASK` takes
# (the lowest CPU rightmost).
cpu_mask() {
    local c top mask=""
    top=$(tail -1 <<<"$PROXY_CPUS")
    for ((c = top; c >= 0; c--)); do
        if grep -qx "$c" <<<"$PROXY_CPUS"; then mask+=1; else mask+=0; fi
    done
    echo "$mask"
}

TARGETS=${BENCH_TARGETS:-direct upkeep upkeep-log nginx nginx-log haproxy upkeep-unpinned nginx-pinned haproxy-pinned}
# HAProxy's threads held to CPUs need as many CPUs to hold them to.
if [[ -z ${BENCH_TARGETS:-} && $(wc -l <<<"$PROXY_CPUS") -lt $PROXY_THREADS ]]; then
    echo "bench: haproxy-pinned left out: fewer CPUs for the proxies than its $PROXY_THREADS threads" >&2
    TARGETS=${TARGETS% haproxy-pinned}
fi
HIGH_TARGETS=${BENCH_HIGH_TARGETS-direct upkeep nginx haproxy}
for n in ${BENCH_UPKEEP_WORKERS-1 2}; do
    TARGETS="$TARGETS upkeep-w$n"
done
H2_TARGETS=${BENCH_H2_TARGETS-upkeep-h2 nginx-h2 haproxy-h2 upkeep-h2-h2up haproxy-h2-h2up}
H2_CLIENTS=${BENCH_H2_CLIENTS:-16}
H2_STREAMS=${BENCH_H2_STREAMS:-8}
if [[ -n ${UPKEEP_PGO:-} ]]; then
    [[ -x $UPKEEP_PGO ]] || die "UPKEEP_PGO: no binary at $UPKEEP_PGO (bench/pgo.sh builds one)"
    TARGETS="$TARGETS upkeep-pgo"
    # Only the sections that are run at all get the row.
    if [[ -n $HIGH_TARGETS ]]; then
        HIGH_TARGETS="$HIGH_TARGETS upkeep-pgo"
    fi
    if [[ -n $H2_TARGETS ]]; then
        H2_TARGETS="$H2_TARGETS upkeep-pgo-h2"
    fi
fi
ROUNDS=${BENCH_ROUNDS:-1}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "BENCH_ROUNDS must be a positive number, not '$ROUNDS'"

WRK=${WRK:-$(find_bin wrk)} || die "wrk not found (Debian: apt-get install wrk)"
NGINX=${NGINX:-$(find_bin nginx)} || die "nginx not found (Debian: apt-get install nginx-light)"
HAPROXY=${HAPROXY:-$(find_bin haproxy)} || die "haproxy not found (Debian: apt-get install haproxy)"
command -v curl >/dev/null || die "curl not found"
command -v ss >/dev/null && command -v pgrep >/dev/null || die "ss or pgrep not found (Debian: apt-get install iproute2 procps)"

upkeep_bin
if [[ -n $H2_TARGETS ]]; then
    H2LOAD=${H2LOAD:-$(find_bin h2load)} || die "h2load not found (Debian: apt-get install nghttp2-client; or BENCH_H2_TARGETS=)"
    command -v openssl >/dev/null || die "openssl not found"
fi

# nginx refuses to start without writable temp paths; keep them all in the run's directory.
nginx_common() {
    local dir=$1
    cat <<EOF
daemon off;
master_process on;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
EOF
}

nginx_http_common() {
    local dir=$1
    cat <<EOF
    client_body_temp_path $dir/body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    # One request per connection setup is not what is measured: wrk and the proxies keep
    # their connections for the whole run.
    keepalive_requests 1000000;
EOF
}

free_port backend_port
free_port backend_h2_port
start_backend() {
    local dir=$work/backend
    mkdir -p "$dir"
    {
        nginx_common "$dir"
        # One worker: the backend must leave CPU for wrk and the proxy on a small machine.
        echo "worker_processes 1;"
        echo "http {"
        nginx_http_common "$dir"
        cat <<EOF
    access_log off;
    server {
        listen 127.0.0.1:$backend_port;
        # The same server over h2c (prior knowledge), for the *-h2-h2up rows.
        listen 127.0.0.1:$backend_h2_port http2;
        location / { default_type text/plain; return 200 "ok"; }
    }
}
EOF
    } >"$dir/nginx.conf"
    "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" >"$dir/stdout" 2>&1 &
    pids+=($!)
    backend_pid=$!
    wait_ok "$backend_port" "backend nginx"
}

# start_nginx DIR PORT LOG [PINNED]: nginx 1.22 as a reverse proxy with upstream keep-alive
# set up the way its docs require (HTTP/1.1, cleared Connection header, keepalive pool);
# PINNED=on holds each worker to its own CPU (`worker_cpu_affinity auto`).
start_nginx() {
    local dir=$1 port=$2 log=$3 pinned=${4:-off}
    mkdir -p "$dir"
    local access="access_log off;"
    [[ $log == on ]] && access="access_log $dir/access.log;"
    {
        nginx_common "$dir"
        echo "worker_processes $NGINX_WORKERS;"
        [[ $pinned == on ]] && echo "worker_cpu_affinity auto $(cpu_mask);"
        echo "http {"
        nginx_http_common "$dir"
        echo "    $access"
        nginx_proxy_http "$backend_port" "127.0.0.1:$port"
        echo "}"
    } >"$dir/nginx.conf"
    "${on_proxy_cpus[@]}" "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" >"$dir/stdout" 2>&1 &
    pids+=($!)
    wait_ok "$port" "nginx"
}

# start_haproxy DIR PORT [PINNED]: two threads; PINNED=on holds each to its own CPU (`cpu-map`,
# the first two CPUs this script may run on).
start_haproxy() {
    local dir=$1 port=$2 pinned=${3:-off}
    mkdir -p "$dir"
    local cpu_map=
    if [[ $pinned == on ]]; then
        local cpus
        cpus=$(head -"$PROXY_THREADS" <<<"$PROXY_CPUS" | paste -sd,)
        [[ $(wc -l <<<"$PROXY_CPUS") -ge $PROXY_THREADS ]] ||
            die "haproxy-pinned needs $PROXY_THREADS CPUs (allowed: $(paste -sd, <<<"$PROXY_CPUS"))"
        cpu_map="cpu-map auto:1/1-$PROXY_THREADS $cpus"
    fi
    haproxy_cfg "$dir/haproxy.cfg" "$PROXY_THREADS" "127.0.0.1:$port" "$backend_port" "" "$cpu_map"
    "${on_proxy_cpus[@]}" "$HAPROXY" -db -f "$dir/haproxy.cfg" >"$dir/stdout" 2>&1 &
    pids+=($!)
    wait_ok "$port" "haproxy"
}

# start_upkeep DIR PORT ADMIN LOG WORKERS [AFFINITY] [BIN] (BIN: default $UPKEEP)
start_upkeep() {
    local dir=$1 port=$2 admin=$3 log=$4 workers=$5 affinity=${6:-} bin=${7:-$UPKEEP}
    mkdir -p "$dir"
    local dest=off
    [[ $log == on ]] && dest=$dir/access.log
    local extra=()
    [[ -n $workers ]] && extra=(--workers "$workers")
    [[ -n $affinity ]] && extra+=(--cpu-affinity "$affinity")
    "${on_proxy_cpus[@]}" "$bin" serve --listen "127.0.0.1:$port" \
        --to "http://127.0.0.1:$backend_port" --admin "127.0.0.1:$admin" \
        --access-log "$dest" --log-level warn "${extra[@]}" >"$dir/stdout" 2>"$dir/stderr" &
    pids+=($!)
    wait_ok "$port" "upkeep"
}

# Converts a wrk latency ("812.00us", "1.23ms", "1.01s", "2.00m") to milliseconds.
to_ms() {
    awk -v v="$1" 'BEGIN {
        n = v + 0; u = v; sub(/^[0-9.]+/, "", u)
        if (u == "us") n /= 1000; else if (u == "s") n *= 1000; else if (u == "m") n *= 60000
        printf "%.3f", n
    }'
}

declare -A rps=() p50=() p99=() errs=() notes=() requests=() cpu=() newconns=()
# Per request, for the ceiling line at the end: the proxy's user-space CPU, and what wrk and
# the backend spent (all in microseconds).
declare -A cpu_user=() cpu_wrk=() cpu_backend=()

# cpu_ticks PID [user|system]: CPU time (user + system, or one of them; clock ticks) used so
# far by PID, its threads and its direct children (nginx workers).
cpu_ticks() {
    local pid=$1 which=${2:-both} p total=0 t
    for p in "$pid" $(pgrep -P "$pid" || true); do
        # Fields 14 and 15 of /proc/PID/stat; the command name (field 2) may hold spaces, so
        # count from after its closing parenthesis.
        t=$(awk -v w="$which" '{ sub(/^.*\) /, ""); print (w == "user" ? $12 : w == "system" ? $13 : $12 + $13) }' \
            "/proc/$p/stat" 2>/dev/null || echo 0)
        total=$((total + t))
    done
    echo "$total"
}

# children_seconds VAR: user + system CPU seconds of this shell's finished children (bash
# `times`, which must run in this shell, not in a `$(...)` subshell) into VAR.
children_seconds() {
    times >"$work/times.txt"
    printf -v "$1" '%s' "$(awk 'NR == 2 {
        s = 0
        for (i = 1; i <= 2; i++) { split($i, a, "m"); sub(/s$/, "", a[2]); s += a[1] * 60 + a[2] }
        printf "%.3f", s
    }' "$work/times.txt")"
}
TICKS_PER_SEC=$(getconf CLK_TCK)

# per_request TICKS N: CPU microseconds a request, TICKS of CPU time spread over N requests.
per_request() {
    awk -v t="$1" -v hz="$TICKS_PER_SEC" -v n="$2" \
        'BEGIN { if (n > 0) printf "%.1f", t / hz * 1e6 / n; else print "-" }'
}

# measure NAME PORT PID: warm-up run, then the measured run; parses wrk's --latency output and
# charges the CPU time PID (the proxy, or the backend for `direct`) used to the requests served.
# CPU per request depends less than req/s on what else the machine is running.
measure() {
    local name=$1 port=$2 pid=$3 out=$work/wrk-$1.txt c0 c1
    "$WRK" -t "$THREADS" -c "$CONNECTIONS" -d "$WARMUP" "http://127.0.0.1:$port/" >"$out.warmup"
    local u0 b0 w0 u1 b1 w1
    c0=$(cpu_ticks "$pid")
    u0=$(cpu_ticks "$pid" user)
    b0=$(cpu_ticks "$backend_pid")
    children_seconds w0
    "$WRK" -t "$THREADS" -c "$CONNECTIONS" -d "$DURATION" --latency \
        "http://127.0.0.1:$port/" >"$out"
    c1=$(cpu_ticks "$pid")
    u1=$(cpu_ticks "$pid" user)
    b1=$(cpu_ticks "$backend_pid")
    children_seconds w1
    local n
    n=$(awk '/requests in/ { print $1 }' "$out")
    cpu[$name]=$(per_request $((c1 - c0)) "$n")
    cpu_user[$name]=$(per_request $((u1 - u0)) "$n")
    cpu_backend[$name]=$(per_request $((b1 - b0)) "$n")
    cpu_wrk[$name]=$(awk -v a="$w0" -v b="$w1" -v n="$n" 'BEGIN { if (n > 0) printf "%.1f", (b - a) * 1e6 / n; else print "-" }')
    rps[$name]=$(awk '/^Requests\/sec:/ { print $2 }' "$out")
    p50[$name]=$(to_ms "$(awk '$1 == "50%" { print $2 }' "$out")")
    p99[$name]=$(to_ms "$(awk '$1 == "99%" { print $2 }' "$out")")
    # Socket errors and non-2xx answers: a fast run full of errors is not a result.
    local socket non2xx
    socket=$(awk '/Socket errors:/ { gsub(",", ""); print $4 + $6 + $8 + $10 }' "$out")
    non2xx=$(awk '/Non-2xx or 3xx responses:/ { print $5 }' "$out")
    errs[$name]=$((${socket:-0} + ${non2xx:-0}))
    # Every request this target saw (warm-up, measured run, the readiness check), to compare
    # with its access-log line count.
    requests[$name]=$(cat "$out.warmup" "$out" | awk '/requests in/ { s += $1 } END { print s + 1 }')
}

# After an upkeep run: how many upstream connections it opened and reused (keep-alive
# working is part of the result), and whether the access log kept every line.
upkeep_notes() {
    local name=$1 admin=$2 dir=$3 log=$4 m new reused lines
    m=$(curl -s --max-time 2 "http://127.0.0.1:$admin/metrics" || true)
    new=$(awk '/^upkeep_pool_connections_total/ && /event="new"/ { s += $NF } END { print s + 0 }' <<<"$m")
    reused=$(awk '/^upkeep_pool_connections_total/ && /event="reused"/ { s += $NF } END { print s + 0 }' <<<"$m")
    notes[$name]="upstream conns new=$new reused=$reused"
    newconns[$name]=$new
    if [[ $log == on ]]; then
        lines=$(wc -l <"$dir/access.log")
        notes[$name]+="; access log lines=$lines of ${requests[$name]} requests"
    fi
}

nginx_notes() {
    local name=$1 dir=$2 log=$3
    if [[ $log == on ]]; then
        notes[$name]="access log lines=$(wc -l <"$dir/access.log") of ${requests[$name]} requests"
    fi
}

# run_target TARGET NAME: one row, recorded under NAME (TARGET@cN).
run_target() {
    local t=$1 name=$2 port admin dir=$work/$2
    case $t in
    direct)
        measure "$name" "$backend_port" "$backend_pid"
        ;;
    upkeep | upkeep-log | upkeep-w* | upkeep-unpinned | upkeep-pgo)
        free_port port
        free_port admin
        local log=off workers= affinity= bin=$UPKEEP
        [[ $t == upkeep-log ]] && log=on
        [[ $t == upkeep-w* ]] && workers=${t#upkeep-w}
        [[ $t == upkeep-unpinned ]] && affinity=off
        [[ $t == upkeep-pgo ]] && bin=$UPKEEP_PGO
        start_upkeep "$dir" "$port" "$admin" "$log" "$workers" "$affinity" "$bin"
        measure "$name" "$port" "${pids[-1]}"
        upkeep_notes "$name" "$admin" "$dir" "$log"
        stop "${pids[-1]}"
        ;;
    nginx | nginx-log | nginx-pinned)
        free_port port
        local log=off pinned=off
        [[ $t == nginx-log ]] && log=on
        [[ $t == nginx-pinned ]] && pinned=on
        start_nginx "$dir" "$port" "$log" "$pinned"
        measure "$name" "$port" "${pids[-1]}"
        stop "${pids[-1]}"
        nginx_notes "$name" "$dir" "$log"
        ;;
    haproxy | haproxy-pinned)
        free_port port
        local pinned=off
        [[ $t == haproxy-pinned ]] && pinned=on
        start_haproxy "$dir" "$port" "$pinned"
        measure "$name" "$port" "${pids[-1]}"
        stop "${pids[-1]}"
        ;;
    *) die "unknown target $t" ;;
    esac
}

# A self-signed certificate for the HTTP/2 rows (the load generator does not verify it).
make_cert() {
    [[ -f $work/tls/cert.pem ]] && return
    mkdir -p "$work/tls"
    openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=bench.test \
        -keyout "$work/tls/key.pem" -out "$work/tls/cert.pem" >/dev/null 2>&1
    cat "$work/tls/cert.pem" "$work/tls/key.pem" >"$work/tls/both.pem"
}

# wait_h2 PORT NAME: until an HTTP/2 request over TLS gets a 2xx (10 s at most).
wait_h2() {
    local port=$1 name=$2 i
    for i in $(seq 100); do
        if "$H2LOAD" -n 1 -c 1 "https://127.0.0.1:$port/" 2>/dev/null | grep -q " 1 succeeded"; then
            return
        fi
        sleep 0.1
    done
    die "$name did not answer HTTP/2 over TLS on $port"
}

# start_upkeep_h2 DIR PORT ADMIN PROTOCOL [BIN]: a TLS listener (ALPN h2), the backend over
# HTTP/1.1 (`http1`) or h2c (`http2`).
start_upkeep_h2() {
    local dir=$1 port=$2 admin=$3 protocol=$4 bin=${5:-$UPKEEP} to=$backend_port
    [[ $protocol == http2 ]] && to=$backend_h2_port
    mkdir -p "$dir"
    cat >"$dir/upkeep.toml" <<EOF
[admin]
listen = "127.0.0.1:$admin"

[[listener]]
listen = "127.0.0.1:$port"
tls = { cert = "$work/tls/cert.pem", key = "$work/tls/key.pem" }

[[route]]
group = "backend"

[groups.backend]
endpoints = ["127.0.0.1:$to"]
protocol = "$protocol"
EOF
    "${on_proxy_cpus[@]}" "$bin" serve --config "$dir/upkeep.toml" --access-log off --log-level warn \
        >"$dir/stdout" 2>"$dir/stderr" &
    pids+=($!)
    wait_h2 "$port" "upkeep"
}

start_nginx_h2() {
    local dir=$1 port=$2
    mkdir -p "$dir"
    {
        nginx_common "$dir"
        echo "worker_processes $NGINX_WORKERS;"
        echo "http {"
        nginx_http_common "$dir"
        echo "    access_log off;"
        nginx_proxy_http "$backend_port" "127.0.0.1:$port ssl http2" \
            "ssl_certificate $work/tls/cert.pem; ssl_certificate_key $work/tls/key.pem; http2_max_requests 1000000;"
        echo "}"
    } >"$dir/nginx.conf"
    "${on_proxy_cpus[@]}" "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" >"$dir/stdout" 2>&1 &
    pids+=($!)
    wait_h2 "$port" "nginx"
}

# start_haproxy_h2 DIR PORT [SERVER]: HAProxy over TLS with ALPN h2 in front of SERVER (the
# rest of its `server` line after 127.0.0.1:, default the HTTP/1.1 backend).
start_haproxy_h2() {
    local dir=$1 port=$2 server=${3:-$backend_port}
    mkdir -p "$dir"
    haproxy_cfg "$dir/haproxy.cfg" "$PROXY_THREADS" "127.0.0.1:$port ssl crt $work/tls/both.pem alpn h2,http/1.1" "$server"
    "${on_proxy_cpus[@]}" "$HAPROXY" -db -f "$dir/haproxy.cfg" >"$dir/stdout" 2>&1 &
    pids+=($!)
    wait_h2 "$port" "haproxy"
}

# measure_h2 NAME PORT PID: like `measure`, with h2load. h2load gives the mean and the max time
# per request (no percentiles); they take the p50 and p99 slots of its own table.
measure_h2() {
    local name=$1 port=$2 pid=$3 out=$work/h2load-$1.txt c0 c1 u0 u1 n non2xx
    local args=(-c "$H2_CLIENTS" -m "$H2_STREAMS" -t "$THREADS")
    "$H2LOAD" "${args[@]}" -D "$WARMUP" "https://127.0.0.1:$port/" >"$out.warmup"
    c0=$(cpu_ticks "$pid")
    u0=$(cpu_ticks "$pid" user)
    "$H2LOAD" "${args[@]}" -D "$DURATION" "https://127.0.0.1:$port/" >"$out"
    c1=$(cpu_ticks "$pid")
    u1=$(cpu_ticks "$pid" user)
    n=$(awk '/^requests:/ { print $8 }' "$out")
    cpu[$name]=$(per_request $((c1 - c0)) "$n")
    cpu_user[$name]=$(per_request $((u1 - u0)) "$n")
    rps[$name]=$(awk '/^finished in/ { print $4 }' "$out")
    p50[$name]=$(to_ms "$(awk '/^time for request:/ { print $6 }' "$out")")
    p99[$name]=$(to_ms "$(awk '/^time for request:/ { print $5 }' "$out")")
    non2xx=$(awk '/^status codes:/ { print $5 + $7 + $9 }' "$out")
    errs[$name]=$(($(awk '/^requests:/ { print $10 + $12 }' "$out") + ${non2xx:-0}))
}

# run_h2_target TARGET NAME: one HTTP/2 row, recorded under NAME.
run_h2_target() {
    local t=$1 name=$2 port admin dir=$work/$2
    make_cert
    free_port port
    case $t in
    upkeep-h2 | upkeep-h2-h2up | upkeep-pgo-h2)
        free_port admin
        local protocol=http1 bin=$UPKEEP
        [[ $t == upkeep-h2-h2up ]] && protocol=http2
        [[ $t == upkeep-pgo-h2 ]] && bin=$UPKEEP_PGO
        start_upkeep_h2 "$dir" "$port" "$admin" "$protocol" "$bin"
        measure_h2 "$name" "$port" "${pids[-1]}"
        upkeep_notes "$name" "$admin" "$dir" off
        stop "${pids[-1]}"
        ;;
    nginx-h2)
        start_nginx_h2 "$dir" "$port"
        measure_h2 "$name" "$port" "${pids[-1]}"
        stop "${pids[-1]}"
        ;;
    haproxy-h2 | haproxy-h2-h2up)
        local server=$backend_port
        [[ $t == haproxy-h2-h2up ]] && server="$backend_h2_port proto h2"
        start_haproxy_h2 "$dir" "$port" "$server"
        measure_h2 "$name" "$port" "${pids[-1]}"
        stop "${pids[-1]}"
        ;;
    *) die "unknown HTTP/2 target $t" ;;
    esac
}

ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'
}

report_idle
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "bench: wrk -t$THREADS -c{${CONNECTION_LIST// /,}} -d$DURATION (warm-up $WARMUP) on 127.0.0.1, $(wc -l <<<"$ALLOWED_CPUS") CPUs, $ROUNDS round(s)"
if [[ -n ${BENCH_PROXY_CPUS:-} ]]; then
    echo "bench: the proxies on CPUs $(paste -sd, <<<"$PROXY_CPUS") (nginx: worker_processes $NGINX_WORKERS; HAProxy: nbthread $PROXY_THREADS; upkeep: a serving thread a CPU); wrk, h2load and the backend on CPUs $load_cpus"
fi
echo "bench: $("$NGINX" -v 2>&1 | head -1); $("$HAPROXY" -v | head -1 | cut -d' ' -f1-3); $("$UPKEEP" --version | head -1)"
if [[ -n ${UPKEEP_PGO:-} ]]; then
    echo "bench: upkeep-pgo rows: $("$UPKEEP_PGO" --version | head -1)"
fi
start_backend
# Steal time (ticks the hypervisor gave to others) over the run, for the goals' header line.
steal_ticks() { awk '/^cpu / { print $9 }' /proc/stat; }
steal_before=$(steal_ticks)
steal_since=$SECONDS
# median V...: the median of the numbers given ("-" and empty ones left out; "-" if none).
median() {
    printf '%s\n' "$@" | awk '$1 != "" && $1 != "-"' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# combine NAME: with several rounds, the row NAME from its rounds NAME#1..NAME#N: each figure
# the median of the rounds' (upstream connections opened too), errors added up, the range of
# req/s and the notes of the last round.
combine() {
    local name=$1 r arr vals lo hi
    for arr in rps p50 p99 cpu cpu_user cpu_wrk cpu_backend newconns; do
        # A name reference is bound when declared: bind it anew for each array.
        unset -n a
        local -n a=$arr
        vals=()
        for r in $(seq "$ROUNDS"); do vals+=("${a[$name#$r]:-}"); done
        a[$name]=$(median "${vals[@]}")
    done
    errs[$name]=0
    vals=()
    for r in $(seq "$ROUNDS"); do
        errs[$name]=$((errs[$name] + ${errs[$name#$r]:-0}))
        vals+=("${rps[$name#$r]:-}")
    done
    lo=$(printf '%s\n' "${vals[@]}" | sort -g | head -1)
    hi=$(printf '%s\n' "${vals[@]}" | sort -g | tail -1)
    notes[$name]="median of $ROUNDS rounds, req/s $lo-$hi${notes[$name#$ROUNDS]:+; last round: ${notes[$name#$ROUNDS]}}"
}

# run_rows KIND LABEL TARGET...: every target once (one round), or ROUNDS times in turn, each
# round starting one target later (so no target is always measured first), then combined.
run_rows() {
    local kind=$1 label=$2 r i n t
    shift 2
    local list=("$@")
    n=${#list[@]}
    for r in $(seq "$ROUNDS"); do
        for i in $(seq 0 $((n - 1))); do
            t=${list[$(((i + r - 1) % n))]}
            if ((ROUNDS == 1)); then
                echo "bench: running $t$label" >&2
                "$kind" "$t" "$t${label/ at /@}"
            else
                echo "bench: running $t$label, round $r of $ROUNDS" >&2
                "$kind" "$t" "$t${label/ at /@}#$r"
            fi
        done
    done
    if ((ROUNDS > 1)); then
        for t in "${list[@]}"; do combine "$t${label/ at /@}"; done
    fi
}

rows=()
list=$TARGETS
for c in $CONNECTION_LIST; do
    CONNECTIONS=$c
    # shellcheck disable=SC2086 # the target lists are space-separated words
    run_rows run_target " at c$c" $list
    for t in $list; do rows+=("$t@c$c"); done
    list=$HIGH_TARGETS
done
if [[ -n $H2_TARGETS ]]; then
    # shellcheck disable=SC2086
    run_rows run_h2_target "" $H2_TARGETS
fi

# The nginx row a row is compared with: same concurrency, same access-log setting (HAProxy
# logs nothing here).
nginx_ref() {
    case $1 in
    *-log@*) echo "nginx-log@${1#*@}" ;;
    *) echo "nginx@${1#*@}" ;;
    esac
}

printf '\n%-17s %10s %8s %8s %6s %7s %10s %10s %9s %9s %9s  %s\n' \
    target req/s p50_ms p99_ms errors cpu_us rps/direct p99/direct rps/nginx p99/nginx cpu/nginx notes
for t in "${rows[@]}"; do
    ref=$(nginx_ref "$t")
    printf '%-17s %10s %8s %8s %6s %7s %10s %10s %9s %9s %9s  %s\n' "$t" "${rps[$t]}" "${p50[$t]}" \
        "${p99[$t]}" "${errs[$t]}" "${cpu[$t]}" \
        "$(ratio "${rps[$t]}" "${rps[direct@${t#*@}]:-}")" "$(ratio "${p99[$t]}" "${p99[direct@${t#*@}]:-}")" \
        "$(ratio "${rps[$t]}" "${rps[$ref]:-}")" "$(ratio "${p99[$t]}" "${p99[$ref]:-}")" \
        "$(ratio "${cpu[$t]}" "${cpu[$ref]:-}")" "${notes[$t]:-}"
done
echo
if [[ -n $H2_TARGETS ]]; then
    echo
    echo "HTTP/2 over TLS: h2load -c$H2_CLIENTS -m$H2_STREAMS -t$THREADS -D$DURATION (warm-up $WARMUP); the backend is HTTP/1.1"
    echo "(*-h2-h2up: h2c to the same backend). h2load reports mean and max, not percentiles."
    printf '%-15s %10s %8s %8s %6s %7s %9s %9s  %s\n' target req/s mean_ms max_ms errors cpu_us rps/nginx cpu/nginx notes
    for t in $H2_TARGETS; do
        printf '%-15s %10s %8s %8s %6s %7s %9s %9s  %s\n' "$t" "${rps[$t]}" "${p50[$t]}" "${p99[$t]}" \
            "${errs[$t]}" "${cpu[$t]}" "$(ratio "${rps[$t]}" "${rps[nginx-h2]:-}")" \
            "$(ratio "${cpu[$t]}" "${cpu[nginx-h2]:-}")" "${notes[$t]:-}"
    done
fi
echo
echo "cpu_us: CPU microseconds (user + system) the proxy spent per request; for direct, the backend's."
echo "ratios: rps/x > 1, p99/x < 1 and cpu/x < 1 mean better than x; each row compares with the"
echo "nginx row that has the same access-log setting (upkeep-log with nginx-log)."

# WebSocket echo round trips: one Python `websockets` echo server, reached directly and through
# each proxy (upgrade forwarded, then a tunnel); the same Python client for every row.
WS_TARGETS=${BENCH_WS-ws-direct ws-upkeep ws-nginx ws-haproxy}
WS_CONNECTIONS=${BENCH_WS_CONNECTIONS:-16}
if [[ -n $WS_TARGETS ]] && ! python3 -c "import websockets.asyncio.client" 2>/dev/null; then
    echo "bench: WebSocket rows skipped: python3 with websockets is not installed (pip install websockets)"
    WS_TARGETS=
fi
ws_seconds=$(awk -v d="$DURATION" 'BEGIN { n = d + 0; if (d ~ /m$/) n *= 60; print n }')
declare -A ws_result=() ws_cpu=()
if [[ -n $WS_TARGETS ]]; then
    mkdir -p "$work/ws"
    python3 "$repo/bench/ws.py" serve >"$work/ws/port" 2>"$work/ws/stderr" &
    pids+=($!)
    ws_pid=$!
    for _ in $(seq 1 100); do [[ -s $work/ws/port ]] && break; sleep 0.1; done
    ws_port=$(head -1 "$work/ws/port")
    [[ -n $ws_port ]] || die "WebSocket echo server did not start (logs in $work/ws)"
fi

# ws_measure NAME PORT PID: a 1 s warm-up, then the measured run; CPU of PID per round trip.
ws_measure() {
    local name=$1 port=$2 pid=$3 out=$work/ws/$1.json c0 c1
    python3 "$repo/bench/ws.py" load "ws://127.0.0.1:$port/" "$WS_CONNECTIONS" 1 >/dev/null
    c0=$(cpu_ticks "$pid")
    python3 "$repo/bench/ws.py" load "ws://127.0.0.1:$port/" "$WS_CONNECTIONS" "$ws_seconds" >"$out"
    c1=$(cpu_ticks "$pid")
    ws_result[$name]=$(cat "$out")
    ws_cpu[$name]=$(python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
n = r["round_trips"]
print("%.1f" % (int(sys.argv[2]) / int(sys.argv[3]) * 1e6 / n) if n else "-")' "$out" $((c1 - c0)) "$TICKS_PER_SEC")
}

# wait_listen PORT: until something listens on PORT (the WebSocket rows have no plain GET).
wait_listen() {
    for _ in $(seq 1 100); do
        kill -0 "${pids[-1]}" 2>/dev/null || die "a WebSocket target exited at start-up (logs in $work/)"
        ss -Htln "( sport = :$1 )" | grep -q . && return 0
        sleep 0.1
    done
    die "nothing listens on $1 after 10 s (logs in $work)"
}

for t in $WS_TARGETS; do
    echo "bench: running $t" >&2
    dir=$work/$t
    mkdir -p "$dir"
    case $t in
    ws-direct)
        ws_measure "$t" "$ws_port" "$ws_pid"
        ;;
    ws-upkeep)
        free_port port
        free_port admin
        "${on_proxy_cpus[@]}" "$UPKEEP" serve --listen "127.0.0.1:$port" --to "http://127.0.0.1:$ws_port" \
            --admin "127.0.0.1:$admin" --access-log off --log-level warn >"$dir/stdout" 2>"$dir/stderr" &
        pids+=($!)
        wait_listen "$port"
        ws_measure "$t" "$port" "${pids[-1]}"
        stop "${pids[-1]}"
        ;;
    ws-nginx)
        free_port port
        {
            nginx_common "$dir"
            echo "worker_processes $NGINX_WORKERS;"
            echo "http {"
            nginx_http_common "$dir"
            cat <<EOF
    access_log off;
    server {
        listen 127.0.0.1:$port;
        location / {
            proxy_pass http://127.0.0.1:$ws_port;
            proxy_http_version 1.1;
            proxy_set_header Upgrade \$http_upgrade;
            proxy_set_header Connection "upgrade";
            proxy_read_timeout 3600s;
        }
    }
}
EOF
        } >"$dir/nginx.conf"
        "${on_proxy_cpus[@]}" "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" >"$dir/stdout" 2>&1 &
        pids+=($!)
        wait_listen "$port"
        ws_measure "$t" "$port" "${pids[-1]}"
        stop "${pids[-1]}"
        ;;
    ws-haproxy)
        free_port port
        haproxy_cfg "$dir/haproxy.cfg" "$PROXY_THREADS" "127.0.0.1:$port" "$ws_port" "timeout tunnel 1h"
        "${on_proxy_cpus[@]}" "$HAPROXY" -db -f "$dir/haproxy.cfg" >"$dir/stdout" 2>&1 &
        pids+=($!)
        wait_listen "$port"
        ws_measure "$t" "$port" "${pids[-1]}"
        stop "${pids[-1]}"
        ;;
    *) die "unknown WebSocket target $t" ;;
    esac
done

ws_get() {
    [[ -n $1 ]] || return 0
    python3 -c 'import json, sys; print(round(json.loads(sys.argv[1])[sys.argv[2]], 3))' "$1" "$2"
}
if [[ -n $WS_TARGETS ]]; then
    echo
    echo "WebSocket echo: $WS_CONNECTIONS connections, 64-byte text messages back to back, ${ws_seconds}s"
    printf '%-12s %12s %8s %8s %6s %7s %9s %9s\n' target round_trips/s p50_ms p99_ms errors cpu_us rt/nginx p99/nginx
    ref=${ws_result[ws-nginx]:-}
    for t in $WS_TARGETS; do
        r=${ws_result[$t]}
        printf '%-12s %12s %8s %8s %6s %7s %9s %9s\n' "$t" "$(ws_get "$r" per_s)" "$(ws_get "$r" p50_ms)" \
            "$(ws_get "$r" p99_ms)" "$(ws_get "$r" errors)" "${ws_cpu[$t]}" \
            "$(ratio "$(ws_get "$r" per_s)" "$(ws_get "$ref" per_s)")" \
            "$(ratio "$(ws_get "$r" p99_ms)" "$(ws_get "$ref" p99_ms)")"
    done
    echo "cpu_us: CPU microseconds the proxy spent per round trip (ws-direct: the Python echo server's)."
    echo "The Python client and server bound the rate; the rows show what each proxy adds."
fi

# The goals of docs/benchmarks.md ("Goal verdicts"), judged from this run only: ratios against
# nginx and HAProxy measured minutes apart on the same machine, never against figures of another
# day.
# verdict NAME A OP B [DETAIL]: PASS when A OP B holds (ge or le), SKIP when a row is missing.
verdict() {
    local name=$1 a=$2 op=$3 b=$4 detail=${5:-} ok
    if [[ -z $a || -z $b || $a == - || $b == - ]]; then
        printf 'SKIP  %-52s (a row is missing)\n' "$name"
        return
    fi
    ok=$(awk -v a="$a" -v b="$b" -v op="$op" 'BEGIN { print (op == "ge" ? a + 0 >= b + 0 : a + 0 <= b + 0) ? "PASS" : "FAIL" }')
    printf '%s  %-52s %s\n' "$ok" "$name" "$detail"
}
# min_of A B: the smaller of two numbers, ignoring empty ones.
min_of() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "") print b; else if (b == "") print a; else print (a + 0 < b + 0 ? a : b) }'
}
lo=${CONNECTION_LIST%% *}
hi=${CONNECTION_LIST##* }
echo
steal=$(awk -v a="$steal_before" -v b="$(steal_ticks)" -v hz="$TICKS_PER_SEC" -v n="$(nproc)" -v s="$((SECONDS - steal_since))" \
    'BEGIN { if (s > 0) printf "%.1f", (b - a) / hz / (s * n) * 100; else print "?" }')
echo "Goals (this run; load average before: ${load_before:-?}, after: $(cut -d' ' -f1-3 /proc/loadavg); CPU time stolen by the hypervisor: ~${steal}%)"
# judge PREFIX ROW H2ROW: the goals for one build of upkeep, its rows named ROW@cN and H2ROW,
# each verdict's name after PREFIX.
judge() {
    local pre=$1 row=$2 h2=$3 u need best
    u=$row@c$lo
    need=$(awk -v n="${rps[nginx@c$lo]:-}" 'BEGIN { if (n != "") printf "%.0f", n * 1.2 }')
    verdict "${pre}c$lo req/s >= 1.2x nginx" "${rps[$u]:-}" ge "$need" \
        "upkeep ${rps[$u]:-?} vs 1.2 x nginx ${rps[nginx@c$lo]:-?} ($(ratio "${rps[$u]:-}" "${rps[nginx@c$lo]:-}")x)"
    best=$(min_of "${p99[nginx@c$lo]:-}" "${p99[haproxy@c$lo]:-}")
    verdict "${pre}c$lo p99 <= best peer's" "${p99[$u]:-}" le "$best" "upkeep ${p99[$u]:-?} ms vs $best ms"
    verdict "${pre}c$lo CPU/req <= nginx's" "${cpu[$u]:-}" le "${cpu[nginx@c$lo]:-}" \
        "upkeep ${cpu[$u]:-?} us vs nginx ${cpu[nginx@c$lo]:-?} us"
    if [[ $hi != "$lo" ]]; then
        u=$row@c$hi
        verdict "${pre}c$hi req/s >= HAProxy" "${rps[$u]:-}" ge "${rps[haproxy@c$hi]:-}" \
            "upkeep ${rps[$u]:-?} vs HAProxy ${rps[haproxy@c$hi]:-?} ($(ratio "${rps[$u]:-}" "${rps[haproxy@c$hi]:-}")x)"
        best=$(min_of "${p99[nginx@c$hi]:-}" "${p99[haproxy@c$hi]:-}")
        verdict "${pre}c$hi p99 <= best peer's" "${p99[$u]:-}" le "$best" "upkeep ${p99[$u]:-?} ms vs $best ms"
        verdict "${pre}c$hi upstream connections opened <= 2x concurrency" "${newconns[$u]:-}" le $((2 * hi)) \
            "${newconns[$u]:-?} opened (warm-up included) for $hi connections"
    fi
    verdict "${pre}h2 req/s >= HAProxy" "${rps[$h2]:-}" ge "${rps[haproxy-h2]:-}" \
        "upkeep ${rps[$h2]:-?} vs HAProxy ${rps[haproxy-h2]:-?} ($(ratio "${rps[$h2]:-}" "${rps[haproxy-h2]:-}")x)"
}
judge "" upkeep upkeep-h2
if [[ -n ${UPKEEP_PGO:-} ]]; then
    judge "pgo: " upkeep-pgo upkeep-pgo-h2
fi
# Where the HTTP/2 rows' CPU a request goes: user space (TLS, HTTP/2 framing and HPACK, the
# proxying) and the kernel (loopback TCP, wake-ups), for each proxy measured.
split=""
for t in upkeep-h2 upkeep-pgo-h2 haproxy-h2 nginx-h2; do
    [[ -n ${cpu[$t]:-} && ${cpu[$t]} != - && -n ${cpu_user[$t]:-} ]] || continue
    split+="${split:+, }$t $(awk -v c="${cpu[$t]}" -v u="${cpu_user[$t]}" 'BEGIN { printf "%.1f + %.1f", u, c - u }')"
done
if [[ -n $split ]]; then
    printf 'INFO  %-52s %s\n' "h2 CPU us/req, user + kernel" "$split"
fi
if [[ -n ${rps[upkeep-h2-h2up]:-} && -n ${rps[haproxy-h2-h2up]:-} ]]; then
    printf 'INFO  %-52s %s\n' "h2 with an h2c upstream vs HAProxy" \
        "upkeep ${rps[upkeep-h2-h2up]} req/s ${cpu[upkeep-h2-h2up]} us/req, HAProxy ${rps[haproxy-h2-h2up]} req/s ${cpu[haproxy-h2-h2up]} us/req ($(ratio "${rps[upkeep-h2-h2up]}" "${rps[haproxy-h2-h2up]}")x)"
fi
# What the machine allows at all: were the proxy's user-space time zero (its kernel time left
# as nginx's), the CPU that wrk, the backend and nginx's kernel time take per request would
# still cap the rate here. A goal above this ratio cannot be met on this machine.
# With the proxies on CPUs of their own (BENCH_PROXY_CPUS) wrk and the backend take none of
# theirs; what the other CPUs allow is the `direct` row.
n=nginx@c$lo
if [[ -n ${BENCH_PROXY_CPUS:-} ]]; then
    printf 'INFO  %-52s %s\n' "c$lo ceiling with zero proxy user time" \
        "none: the proxies had CPUs $(paste -sd, <<<"$PROXY_CPUS") to themselves (wrk and the backend alone: the direct row)"
elif [[ -n ${cpu[$n]:-} && ${cpu[$n]} != - && -n ${cpu_wrk[$n]:-} ]]; then
    printf 'INFO  %-52s %s\n' "c$lo ceiling with zero proxy user time" "$(awk \
        -v r="${rps[$n]}" -v p="${cpu[$n]}" -v pu="${cpu_user[$n]}" -v w="${cpu_wrk[$n]}" \
        -v b="${cpu_backend[$n]}" 'BEGIN {
            t = w + b + p; c = r * t / (t - pu)
            printf "%.0f req/s = %.2fx nginx (per request: wrk %.1f us, backend %.1f us, nginx %.1f us of which user %.1f)", c, c / r, w, b, p, pu }')"
fi
# The same CPU choice made for every proxy: upkeep (its threads on their own CPUs by default)
# against nginx and HAProxy held to their CPUs the same way, and upkeep left to the scheduler.
ul=upkeep@c$lo pn=${rps[nginx-pinned@c$lo]:-} ph=${rps[haproxy-pinned@c$lo]:-}
if [[ -n ${rps[$ul]:-} && (-n $pn || -n $ph) ]]; then
    bestp=$(awk -v a="$pn" -v b="$ph" 'BEGIN { print (a + 0 > b + 0 ? a : b) }')
    printf 'INFO  %-52s %s\n' "c$lo vs peers held to CPUs too" \
        "upkeep ${rps[$ul]:-?} req/s p99 ${p99[$ul]:-?} ms; nginx-pinned ${pn:--} p99 ${p99[nginx-pinned@c$lo]:--}; haproxy-pinned ${ph:--} p99 ${p99[haproxy-pinned@c$lo]:--} ($(ratio "${rps[$ul]:-}" "$bestp")x the faster)"
fi
if [[ -n ${rps[upkeep-unpinned@c$lo]:-} ]]; then
    printf 'INFO  %-52s %s\n' "c$lo upkeep --cpu-affinity off" \
        "${rps[upkeep-unpinned@c$lo]} req/s p99 ${p99[upkeep-unpinned@c$lo]} ms (auto: ${rps[$ul]:-?} req/s p99 ${p99[$ul]:-?} ms)"
fi
w1=${rps[upkeep-w1@c$lo]:-} w2=${rps[upkeep-w2@c$lo]:-}
if [[ -n $w1 && -n $w2 ]]; then
    printf 'INFO  %-52s %s\n' "c$lo --workers 1 vs 2" \
        "w1 ${w1} req/s ${cpu[upkeep-w1@c$lo]} us/req, w2 ${w2} req/s ${cpu[upkeep-w2@c$lo]} us/req (w2/w1 $(ratio "$w2" "$w1")x)"
fi
