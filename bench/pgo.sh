#!/usr/bin/env bash
# The profile-guided build: compiles upkeep with instrumentation, runs a mixed workload through
# it, and compiles it again with the counts it recorded (rustc's -Cprofile-generate and
# -Cprofile-use), so the compiler lays the request path out as it runs: hot code together and
# inlined, cold paths out of its way. Same sources, same release profile; only the code layout
# and inlining differ. docs/benchmarks.md, "The profile-guided build", has the figures.
#
# The workload passes through every part of the request path the benchmarks and most
# deployments use, not only the benchmarks' GET: HTTP/1.1 GETs with a bare `Host` and with a
# browser's fields at 64 and 256 connections, Content-Length and chunked uploads, HTTP/2 over
# TLS and h2c from clients, an HTTP/2 (h2c) upstream from HTTP/1.1 and HTTP/2 clients, TLS
# handshakes, the access log on and off, retries past a refusing peer, and requests refused
# with a 4xx or answered 502. Code that none of it runs (gRPC limits, WebSocket tunnels, the
# lab, the doctor) is compiled as rarely used: correct as ever, a little slower.
#
# Usage: bench/pgo.sh               (from the repository root; about twice a release build)
# Prints the binary's path: target/pgo/release/upkeep (under CARGO_TARGET_DIR), whose
# `--version` says "(profile-guided build)". Use it as `UPKEEP=... bench/proxy.sh`, or beside the
# plain build with `UPKEEP_PGO=... bench/proxy.sh` (rows upkeep-pgo and upkeep-pgo-h2).
# Settings (environment):
#   PGO_DURATION   how long each load of the workload runs (default 3s)
#   LLVM_PROFDATA  llvm-profdata of rustc's LLVM version (default: from `rustup component add
#                  llvm-tools`, then llvm-profdata-N or llvm-profdata on PATH)
#   BENCH_KEEP=1   keep the temporary directory (raw profiles, logs)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
source "$repo/bench/lib.sh"

DURATION=${PGO_DURATION:-3s}
need "wrk" wrk
need "nghttp2-client" h2load
need "curl openssl iproute2" curl openssl ss

# llvm-profdata must read the raw profiles of rustc's own LLVM: the same major version.
llvm_major=$(rustc -vV | awk '/^LLVM version:/ { split($3, v, "."); print v[1] }')
[[ -n $llvm_major ]] || die "cannot tell rustc's LLVM version (rustc -vV)"
if [[ -z ${LLVM_PROFDATA:-} ]]; then
    sysroot=$(rustc --print sysroot)
    for cand in "$sysroot"/lib/rustlib/*/bin/llvm-profdata "llvm-profdata-$llvm_major" llvm-profdata; do
        if command -v "$cand" >/dev/null 2>&1 &&
            "$cand" --version 2>/dev/null | grep -q "LLVM version $llvm_major\."; then
            LLVM_PROFDATA=$cand
            break
        fi
    done
fi
[[ -n ${LLVM_PROFDATA:-} ]] ||
    die "no llvm-profdata for LLVM $llvm_major (rustc's): run 'rustup component add llvm-tools', or set LLVM_PROFDATA"

target=${CARGO_TARGET_DIR:-$repo/target}
profiles=$work/profiles
mkdir -p "$profiles" "$work/other"

# 1. The instrumented build, in its own target directory (other flags, other artefacts). Its
# flags name a fixed directory, so a second run rebuilds only what changed; where the profiles
# go is set per process below (LLVM_PROFILE_FILE).
echo "bench: building the instrumented binary (target/pgo-generate)" >&2
(cd "$repo" && RUSTFLAGS="-Cprofile-generate=$target/pgo-generate/profiles" \
    cargo build --release -p upkeep --target-dir "$target/pgo-generate") || die "instrumented build failed"
gen=$target/pgo-generate/release/upkeep

# 2. The workload. Only the proxy under test writes into $profiles; the backends run the same
# binary but write elsewhere, so the lab backend's code does not count as the proxy's.
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=pgo.test \
    -keyout "$work/key.pem" -out "$work/cert.pem" >/dev/null 2>&1
# `exec`: started with `&`, the function's subshell becomes the binary, so the PID recorded for
# the cleanup on exit is the process to stop.
helper() { LLVM_PROFILE_FILE="$work/other/%p.profraw" exec "$gen" "$@"; }
free_port backend_port
helper lab backend --listen "127.0.0.1:$backend_port" --name ok >"$work/backend.log" 2>&1 &
pids+=($!)
wait_ok "$backend_port" "lab backend"
free_port h2c_port
free_port h2c_admin
helper serve --listen "127.0.0.1:$h2c_port" --to "http://127.0.0.1:$backend_port" \
    --admin "127.0.0.1:$h2c_admin" --access-log off --log-level warn >"$work/h2c.log" 2>&1 &
pids+=($!)
wait_ok "$h2c_port" "h2c backend"
free_port refused_port # nothing listens there: connections to it are refused
free_port http_port
free_port tls_port
free_port admin_port
cat >"$work/upkeep.toml" <<TOML
[admin]
listen = "127.0.0.1:$admin_port"

[[listener]]
listen = "127.0.0.1:$http_port"

[[listener]]
listen = "127.0.0.1:$tls_port"
tls = { cert = "$work/cert.pem", key = "$work/key.pem" }

[[route]]
host = "h2up.test"
group = "h2up"

[[route]]
host = "retry.test"
group = "retry"

[[route]]
host = "down.test"
group = "down"

[[route]]
group = "backend"

[groups.backend]
endpoints = ["127.0.0.1:$backend_port"]

[groups.h2up]
endpoints = ["127.0.0.1:$h2c_port"]
protocol = "http2"

[groups.retry]
endpoints = ["127.0.0.1:$refused_port", "127.0.0.1:$backend_port"]

[groups.down]
endpoints = ["127.0.0.1:$refused_port"]
TOML
cat >"$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = string.rep("x", 2000)
wrk.headers["Content-Type"] = "application/octet-stream"
LUA
browser=(-H "User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"
    -H "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    -H "Accept-Language: en-US,en;q=0.5" -H "Accept-Encoding: gzip, deflate, br"
    -H "Cookie: session=4f2a9c0e7d1b; theme=dark" -H "Referer: http://127.0.0.1/start")
secs=${DURATION%s}
http=http://127.0.0.1:$http_port
https=https://127.0.0.1:$tls_port

# run_load LOG: the loads, one after another, against the proxy started with access log LOG.
run_load() {
    wrk -t2 -c64 -d"$DURATION" "$http/" >>"$work/load.log"
    wrk -t2 -c256 -d"$DURATION" "$http/" >>"$work/load.log"
    wrk -t2 -c64 -d"$DURATION" "${browser[@]}" "$http/path/to/page?q=1" >>"$work/load.log"
    wrk -t2 -c32 -d"$DURATION" -s "$work/post.lua" "$http/upload" >>"$work/load.log"
    wrk -t2 -c64 -d"$DURATION" -H "Host: h2up.test" "$http/" >>"$work/load.log"
    h2load -c16 -m8 -D "$secs" "$https/" >>"$work/load.log"
    h2load -c16 -m8 -D "$secs" -H ":authority: h2up.test" "$https/" >>"$work/load.log"
    h2load -c8 -m8 -D "$secs" "$http/" >>"$work/load.log" # h2c by prior knowledge
    h2load -c4 -m4 -n 4000 -d "$work/cert.pem" "$https/upload" >>"$work/load.log"
    h2load -c64 -n 640 "$https/" >>"$work/load.log" # a TLS handshake every ten requests
    local i
    for i in $(seq 200); do
        curl -s -o /dev/null -H "Transfer-Encoding: chunked" --data-binary @"$work/cert.pem" "$http/chunked"
        curl -s -o /dev/null -H "Host: retry.test" "$http/"
        ((i % 10)) || curl -s -o /dev/null -H "Host: down.test" "$http/"
        ((i % 10)) || curl -s -o /dev/null --path-as-is "$http/a/%zz/../x"
        ((i % 10)) || curl -s -o /dev/null -H "Content-Length: 1" -H "Content-Length: 2" "$http/"
    done
}

for log in off "$work/access.log"; do
    echo "bench: workload through the instrumented proxy, access log $([[ $log == off ]] && echo off || echo on)" >&2
    LLVM_PROFILE_FILE="$profiles/upkeep-%p.profraw" "$gen" serve --config "$work/upkeep.toml" \
        --access-log "$log" --log-level warn >>"$work/serve.log" 2>&1 &
    pids+=($!)
    wait_ok "$http_port" "instrumented upkeep"
    run_load
    # A graceful stop: the profile is written as the process exits.
    stop "${pids[-1]}"
done
grep -q "Requests/sec" "$work/load.log" || die "the workload did not run (logs in $work)"
if grep -E "^requests: " "$work/load.log" | awk '$8 == 0 { bad = 1 } END { exit !bad }'; then
    die "an HTTP/2 load got no answer (logs in $work)"
fi
ls "$profiles"/upkeep-*.profraw >/dev/null 2>&1 || die "the instrumented proxy wrote no profile (logs in $work)"
"$LLVM_PROFDATA" merge -o "$work/upkeep.profdata" "$profiles"/upkeep-*.profraw ||
    die "llvm-profdata merge failed"
# Named by its contents: cargo rebuilds when its flags change, and a new profile is new flags.
mkdir -p "$target/pgo"
rm -f "$target/pgo"/upkeep-*.profdata
profdata=$target/pgo/upkeep-$(sha256sum "$work/upkeep.profdata" | cut -c1-16).profdata
cp "$work/upkeep.profdata" "$profdata"

# 3. The build that uses the profile. UPKEEP_PGO marks it in `upkeep --version`.
echo "bench: building with the profile (target/pgo)" >&2
(cd "$repo" && UPKEEP_PGO=1 RUSTFLAGS="-Cprofile-use=$profdata" \
    cargo build --release -p upkeep --target-dir "$target/pgo") || die "profile-guided build failed"
version=$("$target/pgo/release/upkeep" --version)
[[ $version == *"(profile-guided build)"* ]] || die "the new binary does not say it is the profile-guided build: $version"
echo "bench: $version" >&2
echo "$target/pgo/release/upkeep"
