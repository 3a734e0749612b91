#!/usr/bin/env bash
# Runs the dashboard's browser test (tests/browser/dashboard.mjs) against a freshly started
# ojs-jetstream:
#
#   scripts/browser-test.sh
#
# A private nats-server (JetStream, temp store, free loopback port) and the gateway
# (${OJS_GATEWAY_BIN:-target/debug/ojs-jetstream}; this script does not build it) are
# started, the gateway with an API key so that the test also covers the dashboard's key
# field, and both are stopped afterwards, whatever happens. Needs node and Chromium
# (/usr/bin/chromium, or CHROMIUM_BIN); the test's node modules are installed with `npm ci`
# when missing. NATS_SERVER_BIN picks the nats-server; otherwise scripts/ensure-nats.sh finds
# one. Screenshots land in docs/screenshots/. Exits with the test's status.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# shellcheck source=scripts/lib.sh
source "$repo/scripts/lib.sh"

gateway_bin="${OJS_GATEWAY_BIN:-target/debug/ojs-jetstream}"
if [[ ! -x "$gateway_bin" ]]; then
    echo "browser-test: no gateway binary at $gateway_bin: run 'cargo build' or set OJS_GATEWAY_BIN" >&2
    exit 2
fi
if ! command -v node >/dev/null 2>&1; then
    echo "browser-test: node is not installed (apt-get install nodejs npm)" >&2
    exit 2
fi
chromium_bin="${CHROMIUM_BIN:-/usr/bin/chromium}"
if [[ ! -x "$chromium_bin" ]]; then
    echo "browser-test: no Chromium at $chromium_bin (apt-get install chromium, or set CHROMIUM_BIN)" >&2
    exit 2
fi

if [[ ! -d tests/browser/node_modules ]]; then
    echo "browser-test: installing the test's node modules (npm ci)" >&2
    (cd tests/browser && npm ci --no-audit --no-fund)
fi

nats_bin="${NATS_SERVER_BIN:-}"
if [[ -z "$nats_bin" || ! -x "$nats_bin" ]]; then
    nats_bin="$("$repo/scripts/ensure-nats.sh" | tail -n 1)"
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/ojs-browser-test.XXXXXX")"
stop_stack_on_exit "$work"

# A key for this run only: the gateway asks every request for it.
api_key="$(python3 -c 'import secrets; print(secrets.token_hex(32))')"

start_nats "$nats_bin" "$work"
start_gateway browser-test "$gateway_bin" "$work" "$NATS_PORT" OJS_API_KEYS="$api_key"

status=0
OJS_URL="$GATEWAY_URL" OJS_API_KEY="$api_key" CHROMIUM_BIN="$chromium_bin" \
    node tests/browser/dashboard.mjs || status=$?

if [[ "$status" -ne 0 ]]; then
    echo "browser-test: the test exited with $status; last 100 lines of the gateway log:" >&2
    tail -n 100 "$work/gateway.log" >&2
fi
exit "$status"
