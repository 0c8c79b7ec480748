# Shared by the benchmark scripts: error exit, binaries, a temporary directory whose processes
# are stopped on exit, free loopback ports, readiness, and how idle the machine is.
# Source it after `set -euo pipefail`; it expects `repo` to be set by the caller.

failed=0
die() {
    echo "bench: $*" >&2
    failed=1
    exit 1
}

find_bin() {
    local name=$1
    command -v "$name" 2>/dev/null && return 0
    [[ -x /usr/sbin/$name ]] && echo "/usr/sbin/$name" && return 0
    return 1
}

work=$(mktemp -d "${TMPDIR:-/tmp}/upkeep-bench.XXXXXX")
declare -a pids=()

cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    # A failed run keeps its directory: the error message points at the logs in it.
    if [[ ${BENCH_KEEP:-0} == 1 || $failed == 1 ]]; then
        echo "bench: kept $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_port VAR: a free loopback port in VAR, picked at random from 10000-32767 (below Linux's
# ephemeral range, so an outgoing connection cannot take it between this check and the bind)
# among those no socket uses, TIME-WAIT included, and this run has not handed out yet. It
# sets VAR rather than printing, so `taken` survives (no subshell).
declare -A taken=()
free_port() {
    local p i
    for i in $(seq 1 200); do
        p=$((10000 + RANDOM % 22768))
        [[ -n ${taken[$p]:-} ]] && continue
        if ! ss -Htan "( sport = :$p )" | grep -q .; then
            taken[$p]=1
            printf -v "$1" '%s' "$p"
            return 0
        fi
    done
    die "no free port found"
}

# wait_ok PORT NAME [BODY]: waits until http://127.0.0.1:PORT/ answers 200 with body BODY
# (default "ok"), so a proxy really reaches the backend before it is measured; fails after
# 10 s or when the last started process exits.
wait_ok() {
    local port=$1 name=$2 want=${3:-ok} i body
    for i in $(seq 1 100); do
        kill -0 "${pids[-1]}" 2>/dev/null || die "$name exited at start-up (logs in $work/)"
        body=$(curl -s --fail --max-time 1 "http://127.0.0.1:$port/" 2>/dev/null || true)
        [[ $body == "$want" ]] && return 0
        sleep 0.1
    done
    die "$name on port $port did not answer 200 $want within 10 s (logs in $work)"
}

stop() {
    local pid=$1 keep=() p
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for p in "${pids[@]}"; do
        [[ $p != "$pid" ]] && keep+=("$p")
    done
    pids=("${keep[@]}")
}

# Everything shares the machine's CPUs: other load skews req/s and latency (CPU per request
# less), so say how idle the machine was before starting.
idle_pct() {
    local a b
    a=($(awk '/^cpu / { print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat))
    sleep 1
    b=($(awk '/^cpu / { print $5 + $6, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat))
    awk -v i=$((b[0] - a[0])) -v t=$((b[1] - a[1])) 'BEGIN { if (t > 0) printf "%d", 100 * i / t; else print 0 }'
}
report_idle() {
    local idle
    idle=$(idle_pct)
    echo "bench: machine idle before the run: $idle% (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    if ((idle < 90)); then
        echo "bench: warning: other processes are using the CPUs; figures will be lower and noisier" >&2
    fi
}

# upkeep_bin: sets UPKEEP to target/release/upkeep (under CARGO_TARGET_DIR), building it when
# missing, unless UPKEEP is already set.
upkeep_bin() {
    if [[ -z ${UPKEEP:-} ]]; then
        UPKEEP=${CARGO_TARGET_DIR:-$repo/target}/release/upkeep
        if [[ ! -x $UPKEEP ]]; then
            echo "bench: building upkeep (cargo build --release -p upkeep)" >&2
            (cd "$repo" && cargo build --release -p upkeep) || die "build failed"
        fi
    fi
    [[ -x $UPKEEP ]] || die "upkeep binary not found at $UPKEEP"
}

# json_field NAME FILE: a number from the pretty-printed JSON summary of `lab load --json`.
json_field() {
    awk -F': ' -v k="\"$1\"" '$1 ~ k { gsub(/[ ,]/, "", $2); print $2 }' "$2"
}

# lab_backend PORT_VAR: an `upkeep lab backend` answering `ok` on a free loopback port (set in
# PORT_VAR), logging to $work/backend.log; returns once it answers.
lab_backend() {
    free_port "$1"
    "$UPKEEP" lab backend --listen "127.0.0.1:${!1}" --name ok >"$work/backend.log" 2>&1 &
    pids+=($!)
    wait_ok "${!1}" "lab backend"
}

# nginx_proxy_http BACKEND_PORT LISTEN [SERVER_LINES]: the part of an nginx `http` block that
# the benchmarks give every nginx proxy: upstream keep-alive set up the way nginx's docs require
# (HTTP/1.1, a cleared `Connection` header, a keepalive pool) to 127.0.0.1:BACKEND_PORT, and a
# server on `listen LISTEN` with SERVER_LINES (TLS settings, say) passing every request to it.
nginx_proxy_http() {
    cat <<EOF
    upstream backend {
        server 127.0.0.1:$1;
        keepalive 64;
        keepalive_requests 1000000;
    }
    server {
        listen $2;
        ${3:-}
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
EOF
}

# peer_command PROXY PORT BACKEND_PORT [CERT KEY]: the command that runs Debian's haproxy
# (nbthread 1) or nginx (one process, no master) listening on 127.0.0.1:PORT, over TLS with
# ALPN h2 when CERT and KEY are given, and passing every request to 127.0.0.1:BACKEND_PORT over
# HTTP/1.1 with keep-alive, as bench/proxy.sh configures them (its configuration in $work). Sets
# peer_cmd (the command), and version and what for the report.
peer_command() {
    local proxy=$1 port=$2 backend=$3 cert=${4:-} key=${5:-} bind listen tls=""
    case $proxy in
    haproxy)
        HAPROXY=${HAPROXY:-$(find_bin haproxy)} || die "haproxy not found (Debian: apt-get install haproxy)"
        version=$("$HAPROXY" -v | head -1)
        what="nbthread 1"
        bind="127.0.0.1:$port"
        if [[ -n $cert ]]; then
            cat "$cert" "$key" >"$work/both.pem"
            bind="$bind ssl crt $work/both.pem alpn h2,http/1.1"
        fi
        haproxy_cfg "$work/haproxy.cfg" 1 "$bind" "$backend"
        peer_cmd=("$HAPROXY" -db -f "$work/haproxy.cfg")
        ;;
    nginx)
        NGINX=${NGINX:-$(find_bin nginx)} || die "nginx not found (Debian: apt-get install nginx)"
        version=$("$NGINX" -v 2>&1 | head -1)
        what="one process, no master"
        listen="127.0.0.1:$port"
        if [[ -n $cert ]]; then
            listen="$listen ssl http2"
            tls="ssl_certificate $cert; ssl_certificate_key $key; http2_max_requests 1000000;"
        fi
        {
            cat <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $work/nginx.pid;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
EOF
            nginx_proxy_http "$backend" "$listen" "$tls"
            echo "}"
        } >"$work/nginx.conf"
        peer_cmd=("$NGINX" -p "$work" -c "$work/nginx.conf" -e "$work/error.log")
        ;;
    *) die "PROXY is upkeep, haproxy or nginx, not '$proxy'" ;;
    esac
}

# proxy_command PROXY PORT BACKEND_PORT: peer_command, or for PROXY=upkeep `upkeep serve` with
# one serving thread listening on 127.0.0.1:PORT (admin on a free port), the access log off,
# passing every request to 127.0.0.1:BACKEND_PORT.
proxy_command() {
    if [[ $1 == upkeep ]]; then
        version=$("$UPKEEP" --version | head -1)
        what="one serving thread"
        free_port admin_port
        peer_cmd=("$UPKEEP" serve --listen "127.0.0.1:$2" --to "http://127.0.0.1:$3"
            --admin "127.0.0.1:$admin_port" --access-log off --log-level warn --workers 1)
    else
        peer_command "$@"
    fi
}

# need PACKAGES TOOL...: stops, naming the Debian PACKAGES that provide them, unless every TOOL
# is on PATH.
need() {
    local packages=$1 tool
    shift
    for tool in "$@"; do
        command -v "$tool" >/dev/null || die "$tool not found (Debian: apt-get install $packages)"
    done
}

# proxy_before_backend: the set-up of the scripts that measure one proxy (PROXY: upkeep, the
# default, haproxy or nginx) in front of an `upkeep lab backend`: UPKEEP, the backend on
# backend_port, a free proxy_port, and the proxy's command in peer_cmd (proxy_command).
proxy_before_backend() {
    upkeep_bin
    lab_backend backend_port
    free_port proxy_port
    PROXY=${PROXY:-upkeep}
    proxy_command "$PROXY" "$proxy_port" "$backend_port"
}

# callgrind_peer PROXY PORT BACKEND_PORT [CERT KEY]: the proxy of peer_command, started under
# callgrind (output $work/callgrind.out); sets proxy_pid, version and what.
callgrind_peer() {
    peer_command "$@"
    under_callgrind "${peer_cmd[@]}"
}

# under_callgrind COMMAND...: starts COMMAND under callgrind in the background (output
# $work/callgrind.out, its own output in $work/serve.log; CALLGRIND_FLAGS adds options, such as
# --cache-sim=yes --branch-sim=yes); sets proxy_pid.
under_callgrind() {
    # shellcheck disable=SC2086 # CALLGRIND_FLAGS is a list of options
    valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" ${CALLGRIND_FLAGS:-} \
        "$@" >"$work/serve.log" 2>&1 &
    pids+=($!)
    proxy_pid=$!
}

# haproxy_cfg FILE NBTHREAD BIND BACKEND_PORT [LAST] [GLOBAL]: the HAProxy configuration the
# benchmarks run: HTTP mode, `bind BIND`, every request to 127.0.0.1:BACKEND_PORT; LAST ends
# the defaults (empty or absent: `http-reuse always`, connections reused); GLOBAL, one more
# line of the global section (e.g. `cpu-map`).
haproxy_cfg() {
    cat >"$1" <<EOF
global
    nbthread $2
    maxconn 4096
    ${6:-}

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    ${5:-http-reuse always}

frontend fe
    bind $3
    default_backend be

backend be
    server b1 127.0.0.1:$4
EOF
}
