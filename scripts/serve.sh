#!/usr/bin/env bash
# Runs the ojs-jetstream HTTP gateway from this checkout:
#
#   scripts/serve.sh [extra args for `ojs-jetstream serve`]
#
# Settings come from config/ojs-jetstream.toml (or $OJS_CONFIG) and OJS_* variables.
# Without OJS_NATS_URL, a local JetStream-enabled nats-server is used on 127.0.0.1:4222:
# an already running one is reused; otherwise one is started with its store in
# ./data/nats and stopped again when the gateway exits.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The default config path (config/ojs-jetstream.toml) is relative to the working directory.
cd "$repo"

# shellcheck source=scripts/lib.sh
source "$repo/scripts/lib.sh"

if [[ -n "${OJS_NATS_URL:-}" ]]; then
    exec cargo run --release -- serve "$@"
fi

if port_open 127.0.0.1 4222; then
    echo "serve: reusing the NATS server already listening on 127.0.0.1:4222 (it needs JetStream enabled)" >&2
    exec cargo run --release -- serve "$@"
fi

nats_bin="$("$repo/scripts/ensure-nats.sh" | tail -n 1)"
mkdir -p data/nats
nats_log="$repo/data/nats-server.log"
echo "serve: starting $nats_bin on 127.0.0.1:4222, store in data/nats, log in data/nats-server.log" >&2
# In a session of its own, so that Ctrl-C in the terminal does not reach it: nats-server
# handles SIGINT even when started in the background, and would stop while the gateway is
# still finishing its requests. The EXIT trap stops it after the gateway. (A background
# command of this script is no process group leader, so setsid execs in place and $! is
# the nats-server's pid.)
setsid "$nats_bin" -js -sd "$repo/data/nats" -a 127.0.0.1 -p 4222 >>"$nats_log" 2>&1 &
nats_pid=$!

trap 'stop_process "$nats_pid"' EXIT
wait_until nats-server "$nats_pid" "$nats_log" 10 port_open 127.0.0.1 4222

# Not exec: the EXIT trap must stop nats-server after the gateway stops. The gateway runs
# in the background so that Ctrl-C or TERM reaching this script is passed on to it as TERM
# (a background command ignores SIGINT); `cargo run` execs the binary, so the pid is the
# gateway's own.
cargo run --release -- serve "$@" &
gateway_pid=$!
trap 'kill -TERM "$gateway_pid" 2>/dev/null || true' INT TERM
status=0
wait "$gateway_pid" || status=$?
# A trapped signal interrupts `wait`; keep waiting until the gateway has really exited.
while kill -0 "$gateway_pid" 2>/dev/null; do
    status=0
    wait "$gateway_pid" || status=$?
done
exit "$status"
