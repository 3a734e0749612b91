#!/usr/bin/env bash
# Runs the benchmark (docs/performance.md) against a fresh nats-server and a release-built
# gateway, both started here and stopped again afterwards:
#
#   scripts/bench.sh [flags of examples/bench/, e.g. --scenarios memory]
#
# NATS_SERVER_BIN picks the nats-server (else scripts/ensure-nats.sh finds one);
# BENCH_NATS_PORT (default 14222) and BENCH_HTTP_PORT (default 18080) the ports;
# OJS_API_KEY (at least 32 characters) runs the gateway with that API key, and every
# request of the benchmark carries it.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# shellcheck source=scripts/lib.sh
source "$repo/scripts/lib.sh"
nats_port="${BENCH_NATS_PORT:-14222}"
http_port="${BENCH_HTTP_PORT:-18080}"

cargo build --release --bin ojs-jetstream --example bench >&2
nats_bin="$(scripts/ensure-nats.sh | tail -n 1)"

work="$(mktemp -d)"
nats_pid=""
gateway_pid=""
# shellcheck disable=SC2317  # called from a trap
cleanup() {
    stop_process "$gateway_pid"
    stop_process "$nats_pid"
    rm -rf "$work"
}
trap cleanup EXIT

for port in "$nats_port" "$http_port"; do
    if port_open 127.0.0.1 "$port"; then
        echo "bench: port $port is in use; stop what listens there or set BENCH_NATS_PORT/BENCH_HTTP_PORT" >&2
        exit 1
    fi
done

"$nats_bin" -js -a 127.0.0.1 -p "$nats_port" -sd "$work/nats" >"$work/nats.log" 2>&1 &
nats_pid=$!
wait_until nats-server "$nats_pid" "$work/nats.log" 10 port_open 127.0.0.1 "$nats_port"

# OJS_API_KEY set: the gateway asks for that key and the benchmark sends it (auth on).
OJS_NATS_URL="nats://127.0.0.1:$nats_port" OJS_LISTEN="127.0.0.1:$http_port" \
    OJS_API_KEYS="${OJS_API_KEY:-}" target/release/ojs-jetstream serve >"$work/gateway.log" 2>&1 &
gateway_pid=$!
wait_until gateway "$gateway_pid" "$work/gateway.log" 30 http_ok "http://127.0.0.1:$http_port/ojs/v1/health"

echo "bench: $("$nats_bin" --version), $(nproc) cores, gateway pid $gateway_pid" >&2
target/release/examples/bench --url "http://127.0.0.1:$http_port" \
    --nats "nats://127.0.0.1:$nats_port" --gateway-pid "$gateway_pid" --nats-pid "$nats_pid" "$@"
