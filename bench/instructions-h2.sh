#!/usr/bin/env bash
# Instructions per proxied HTTP/2 request: user-space instructions of `upkeep serve` (one
# serving thread, TLS listener, ALPN h2; or of HAProxy or nginx, PROXY below) counted by
# callgrind while h2load sends GETs through it to an `upkeep lab backend` over HTTP/1.1.
# Every h2load run opens its connections anew (a TLS handshake each, about 11M instructions
# with the RSA-2048 key made here), so two runs with the same connections and different
# request counts are measured and the difference is divided by the difference in requests:
# what is left is the cost of a request, without the handshakes. Like bench/instructions.sh,
# the count repeats run to run on a busy machine.
#
# Usage: bench/instructions-h2.sh      (from the repository root; see docs/benchmarks.md)
# Settings (environment):
#   REQUESTS   requests of the longer run (default 4000; the shorter one sends a quarter)
#   CLIENTS    h2load connections (default 4), STREAMS per connection (default 8)
#   UPKEEP     upkeep binary (default: target/release/upkeep, built when missing)
#   PROXY      the proxy counted: upkeep (default), haproxy or nginx (Debian's packages; one
#              thread or worker, the same backend over HTTP/1.1 with keep-alive), so upkeep's
#              count can be set beside theirs
#   HAPROXY, NGINX  their binaries (default: from PATH, then /usr/sbin)
#   UPSTREAM   how upkeep reaches the backend: http1 (default: `upkeep lab backend` over
#              HTTP/1.1) or h2c (Debian's nginx answering `ok` over HTTP/2 by prior knowledge,
#              the group set to `protocol = "http2"`: an HTTP/2 client's request to an HTTP/2
#              upstream, as gRPC's go). PROXY=upkeep only
#   CALLGRIND_FLAGS  more callgrind options (as in bench/instructions.sh)
#   BENCH_KEEP=1  keep the temporary directory (callgrind output, logs)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"

REQUESTS=${REQUESTS:-4000}
CLIENTS=${CLIENTS:-4}
STREAMS=${STREAMS:-8}
need "valgrind curl iproute2 openssl nghttp2-client" \
    valgrind callgrind_control callgrind_annotate curl ss openssl h2load
upkeep_bin

openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=bench.test \
    -keyout "$work/key.pem" -out "$work/cert.pem" >/dev/null 2>&1
PROXY=${PROXY:-upkeep}
UPSTREAM=${UPSTREAM:-http1}
protocol_line=""
case $UPSTREAM in
http1) lab_backend backend_port ;;
h2c)
    [[ $PROXY == upkeep ]] || die "UPSTREAM=h2c counts upkeep only"
    NGINX=${NGINX:-$(find_bin nginx)} || die "nginx not found (Debian: apt-get install nginx-light)"
    # Plain HTTP/1.1 on one port (to know it answers), h2c on the other (what upkeep uses).
    free_port ready_port
    free_port backend_port
    mkdir -p "$work/h2c"
    cat >"$work/h2c/nginx.conf" <<NGINX
daemon off;
master_process off;
worker_processes 1;
pid $work/h2c/nginx.pid;
error_log $work/h2c/error.log warn;
events { worker_connections 1024; }
http {
    client_body_temp_path $work/h2c/body;
    proxy_temp_path $work/h2c/proxy;
    fastcgi_temp_path $work/h2c/fastcgi;
    uwsgi_temp_path $work/h2c/uwsgi;
    scgi_temp_path $work/h2c/scgi;
    keepalive_requests 1000000;
    access_log off;
    server {
        listen 127.0.0.1:$ready_port;
        listen 127.0.0.1:$backend_port http2;
        location / { default_type text/plain; return 200 "ok"; }
    }
}
NGINX
    "$NGINX" -p "$work/h2c" -c "$work/h2c/nginx.conf" >"$work/backend.log" 2>&1 &
    pids+=($!)
    wait_ok "$ready_port" "h2c backend nginx"
    protocol_line='protocol = "http2"'
    ;;
*) die "UPSTREAM is http1 or h2c, not $UPSTREAM" ;;
esac
free_port proxy_port
free_port admin_port
if [[ $PROXY == upkeep ]]; then
cat >"$work/upkeep.toml" <<TOML
[admin]
listen = "127.0.0.1:$admin_port"

[[listener]]
listen = "127.0.0.1:$proxy_port"
tls = { cert = "$work/cert.pem", key = "$work/key.pem" }

[[route]]
group = "backend"

[groups.backend]
endpoints = ["127.0.0.1:$backend_port"]
$protocol_line
TOML
    version=$("$UPKEEP" --version | head -1)
    what="one serving thread"
    [[ $UPSTREAM == h2c ]] && what="$what, h2c upstream (nginx)"
    under_callgrind "$UPKEEP" serve --config "$work/upkeep.toml" --access-log off \
        --log-level warn --workers 1
else
    callgrind_peer "$PROXY" "$proxy_port" "$backend_port" "$work/cert.pem" "$work/key.pem"
fi
for i in $(seq 1 150); do
    kill -0 "$proxy_pid" 2>/dev/null || die "$PROXY exited at start-up (logs in $work/)"
    [[ $(curl -sk --http2 --max-time 2 "https://127.0.0.1:$proxy_port/" 2>/dev/null) == ok ]] && break
    ((i < 150)) || die "$PROXY under callgrind did not answer within 30 s (logs in $work/)"
    sleep 0.2
done

# h2load RUN N: N requests over CLIENTS new connections, counted from zero; prints the
# instructions of the run.
h2load_run() {
    local run=$1 n=$2 out dump
    out="$work/h2load-$run.txt"
    callgrind_control -z "$proxy_pid" >/dev/null 2>&1
    h2load -c "$CLIENTS" -m "$STREAMS" -n "$n" "https://127.0.0.1:$proxy_port/" >"$out"
    grep -q "^status codes: $n 2xx" "$out" || die "not every request of run $run got a 2xx (see $out)"
    callgrind_control -d "$run" "$proxy_pid" >/dev/null 2>&1
    sleep 1
    dump=$(ls -t "$work"/callgrind.out.* | head -1)
    callgrind_annotate "$dump" | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
}

# Warm up (lazy initialisation, the upstream connections), then the two measured runs.
h2load -c "$CLIENTS" -m "$STREAMS" -n "$((REQUESTS / 4))" "https://127.0.0.1:$proxy_port/" >/dev/null
short=$((REQUESTS / 4))
i_short=$(h2load_run short "$short")
i_long=$(h2load_run long "$REQUESTS")
echo "bench: $version, $what, h2load -c$CLIENTS -m$STREAMS over TLS"
echo "bench: $short requests: $i_short instructions; $REQUESTS requests: $i_long instructions"
awk -v a="$i_short" -v b="$i_long" -v na="$short" -v nb="$REQUESTS" -v c="$CLIENTS" 'BEGIN {
    per = (b - a) / (nb - na)
    printf "bench: %.1fk instructions per HTTP/2 request; %.1fM per run of %d connections besides\n", per / 1000, (a - per * na) / 1e6, c
}'
