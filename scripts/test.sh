#!/usr/bin/env bash
# Runs every ojs-jetstream test (unit, integration, doc tests):
#
#   scripts/test.sh [cargo test args]
#
# Integration tests start their own nats-server; NATS_SERVER_BIN tells them which one
# (an existing NATS_SERVER_BIN is kept, otherwise one is found or installed).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

NATS_SERVER_BIN="$("$repo/scripts/ensure-nats.sh" | tail -n 1)"
export NATS_SERVER_BIN
echo "test: using $NATS_SERVER_BIN ($("$NATS_SERVER_BIN" --version 2>&1 | head -n 1))" >&2

exec cargo test "$@"
