#!/usr/bin/env bash
# Runs the benchmark (docs/performance.md) against a fresh nats-server and a release-built
# gateway (BENCH_PROFILE=dev: the test build's gateway and benchmark, as built by
# `cargo build --all-targets`, for a quick report such as CI's), and BullMQ against a fresh
# redis-server, all started here and stopped again afterwards:
#
#   scripts/bench.sh [flags of examples/bench/, e.g. --scenarios memory]
#
# NATS_SERVER_BIN picks the nats-server (else scripts/ensure-nats.sh finds one);
# BENCH_NATS_PORT (default 14222), BENCH_HTTP_PORT (default 18080), BENCH_GRPC_PORT (default
# 19090, the gateway's gRPC binding, for `e2e-grpc`) and BENCH_REDIS_PORT (default 16379)
# the ports; OJS_API_KEY (at least 32 characters) runs the gateway with that
# API key, and every request of the benchmark carries it. BENCH_BULLMQ=0 leaves BullMQ out;
# otherwise what it needs is installed when missing: Debian's redis-server and node (apt),
# and the driver's node modules (npm ci in examples/bench/bullmq). Redis runs with an
# append-only file fsynced every second and no snapshots (docs/performance.md §1).
# BENCH_LEADER_DELAY_US (e.g. 500) then measures the `leader` scenario once more, with a
# second gateway whose NATS connection passes a proxy that holds each chunk that long each
# way (a 1 ms round trip for 500), in a namespace of its own.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# shellcheck source=scripts/lib.sh
source "$repo/scripts/lib.sh"
nats_port="${BENCH_NATS_PORT:-14222}"
http_port="${BENCH_HTTP_PORT:-18080}"
grpc_port="${BENCH_GRPC_PORT:-19090}"
redis_port="${BENCH_REDIS_PORT:-16379}"
bullmq="${BENCH_BULLMQ:-1}"
case "${BENCH_PROFILE:-release}" in
    release) build=(--release) bin="${CARGO_TARGET_DIR:-target}/release" ;;
    dev) build=() bin="${CARGO_TARGET_DIR:-target}/debug" ;;
    *) echo "bench: BENCH_PROFILE is release or dev, not ${BENCH_PROFILE}" >&2; exit 1 ;;
esac

# apt_install PACKAGE...: Debian packages, through sudo when not root.
apt_install() {
    local -a sudo=()
    if [[ "$(id -u)" -ne 0 ]]; then
        sudo=(sudo)
    fi
    echo "bench: installing $* (apt-get)" >&2
    "${sudo[@]}" apt-get update >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y "$@" >&2
}

cargo build "${build[@]}" --bin ojs-jetstream --example bench >&2
nats_bin="$(scripts/ensure-nats.sh | tail -n 1)"
ports=("$nats_port" "$http_port" "$grpc_port")
if [[ "$bullmq" != 0 ]]; then
    command -v redis-server >/dev/null 2>&1 || apt_install redis-server
    command -v node >/dev/null 2>&1 || apt_install nodejs npm
    if [[ ! -d examples/bench/bullmq/node_modules ]]; then
        echo "bench: installing the BullMQ driver's node modules (npm ci)" >&2
        (cd examples/bench/bullmq && npm ci --no-audit --no-fund >&2)
    fi
    ports+=("$redis_port")
fi

work="$(mktemp -d)"
nats_pid=""
gateway_pid=""
redis_pid=""
proxy_pid=""
# shellcheck disable=SC2317  # called from a trap
cleanup() {
    stop_process "$gateway_pid"
    stop_process "$nats_pid"
    stop_process "$redis_pid"
    stop_process "$proxy_pid"
    rm -rf "$work"
}
trap cleanup EXIT

for port in "${ports[@]}"; do
    if port_open 127.0.0.1 "$port"; then
        echo "bench: port $port is in use; stop what listens there or set BENCH_NATS_PORT/BENCH_HTTP_PORT/BENCH_GRPC_PORT/BENCH_REDIS_PORT" >&2
        exit 1
    fi
done

"$nats_bin" -js -a 127.0.0.1 -p "$nats_port" -sd "$work/nats" >"$work/nats.log" 2>&1 &
nats_pid=$!
wait_until nats-server "$nats_pid" "$work/nats.log" 10 port_open 127.0.0.1 "$nats_port"

# OJS_API_KEY set: the gateway asks for that key and the benchmark sends it (auth on).
OJS_NATS_URL="nats://127.0.0.1:$nats_port" OJS_LISTEN="127.0.0.1:$http_port" \
    OJS_GRPC_LISTEN="127.0.0.1:$grpc_port" OJS_API_KEYS="${OJS_API_KEY:-}" "$bin/ojs-jetstream" serve >"$work/gateway.log" 2>&1 &
gateway_pid=$!
wait_until gateway "$gateway_pid" "$work/gateway.log" 30 http_ok "http://127.0.0.1:$http_port/ojs/v1/health"

bullmq_flags=()
if [[ "$bullmq" != 0 ]]; then
    mkdir -p "$work/redis"
    redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$work/redis" \
        --appendonly yes --appendfsync everysec --save '' >"$work/redis.log" 2>&1 &
    redis_pid=$!
    wait_until redis-server "$redis_pid" "$work/redis.log" 10 port_open 127.0.0.1 "$redis_port"
    bullmq_flags=(--bullmq "redis://127.0.0.1:$redis_port")
    echo "bench: $(redis-server --version | cut -d ' ' -f 1-3), node $(node --version)" >&2
fi

echo "bench: $("$nats_bin" --version), $(nproc) cores, gateway pid $gateway_pid, ${BENCH_PROFILE:-release} build" >&2
"$bin/examples/bench" --url "http://127.0.0.1:$http_port" --grpc "http://127.0.0.1:$grpc_port" \
    --nats "nats://127.0.0.1:$nats_port" --gateway-pid "$gateway_pid" --nats-pid "$nats_pid" \
    "${bullmq_flags[@]}" "$@"

if [[ -n "${BENCH_LEADER_DELAY_US:-}" ]]; then
    proxy_port=$((nats_port + 1))
    delayed_port=$((http_port + 1))
    stop_process "$gateway_pid"
    "$bin/examples/bench" --delay-proxy "127.0.0.1:$proxy_port" \
        --upstream "127.0.0.1:$nats_port" --delay-us "$BENCH_LEADER_DELAY_US" \
        >"$work/proxy.log" 2>&1 &
    proxy_pid=$!
    wait_until delay-proxy "$proxy_pid" "$work/proxy.log" 10 port_open 127.0.0.1 "$proxy_port"
    OJS_NATS_URL="nats://127.0.0.1:$proxy_port" OJS_LISTEN="127.0.0.1:$delayed_port" OJS_GRPC_LISTEN= \
        OJS_NAMESPACE=delayed OJS_API_KEYS="${OJS_API_KEY:-}" "$bin/ojs-jetstream" serve \
        >"$work/delayed-gateway.log" 2>&1 &
    gateway_pid=$!
    wait_until gateway "$gateway_pid" "$work/delayed-gateway.log" 60 http_ok "http://127.0.0.1:$delayed_port/ojs/v1/health"
    echo "bench: the leader once more, NATS $BENCH_LEADER_DELAY_US µs away each way" >&2
    "$bin/examples/bench" --url "http://127.0.0.1:$delayed_port" \
        --nats "nats://127.0.0.1:$nats_port" --namespace delayed \
        --gateway-pid "$gateway_pid" --nats-pid "$nats_pid" --scenarios leader
fi
