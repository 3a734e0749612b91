#!/usr/bin/env bash
# Runs the benchmark (docs/performance.md) against a fresh nats-server and a release-built
# gateway, both started here and stopped again afterwards:
#
#   scripts/bench.sh [flags of examples/bench/, e.g. --scenarios memory]
#
# NATS_SERVER_BIN picks the nats-server (else scripts/ensure-nats.sh finds one);
# BENCH_NATS_PORT (default 14222) and BENCH_HTTP_PORT (default 18080) the ports.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
nats_port="${BENCH_NATS_PORT:-14222}"
http_port="${BENCH_HTTP_PORT:-18080}"

cargo build --release --bin ojs-jetstream --example bench >&2
nats_bin="$(scripts/ensure-nats.sh | tail -n 1)"

port_open() {
    # bash's /dev/tcp: a successful connect means something listens there.
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

work="$(mktemp -d)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

for port in "$nats_port" "$http_port"; do
    if port_open "$port"; then
        echo "bench: port $port is in use; stop what listens there or set BENCH_NATS_PORT/BENCH_HTTP_PORT" >&2
        exit 1
    fi
done

"$nats_bin" -js -a 127.0.0.1 -p "$nats_port" -sd "$work/nats" >"$work/nats.log" 2>&1 &
nats_pid=$!
pids+=("$nats_pid")
for _ in $(seq 100); do
    port_open "$nats_port" && break
    sleep 0.1
done

OJS_NATS_URL="nats://127.0.0.1:$nats_port" OJS_LISTEN="127.0.0.1:$http_port" \
    target/release/ojs-jetstream serve >"$work/gateway.log" 2>&1 &
gateway_pid=$!
pids+=("$gateway_pid")
for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$http_port/ojs/v1/health" >/dev/null 2>&1 && break
    sleep 0.1
done

echo "bench: $("$nats_bin" --version), $(nproc) cores, gateway pid $gateway_pid" >&2
target/release/examples/bench --url "http://127.0.0.1:$http_port" \
    --nats "nats://127.0.0.1:$nats_port" --gateway-pid "$gateway_pid" --nats-pid "$nats_pid" "$@"
