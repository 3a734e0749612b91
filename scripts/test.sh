#!/usr/bin/env bash
# Runs every ojs-jetstream test (unit, integration, doc tests):
#
#   scripts/test.sh [test filters and cargo-nextest / cargo test args]
#
# Integration tests start their own nats-server; NATS_SERVER_BIN tells them which one
# (an existing NATS_SERVER_BIN is kept, otherwise one is found or installed).
#
# With cargo-nextest installed, each test runs in its own process, side by side (the
# integration tests mostly wait on NATS, and one slow test holds up no other); doc tests
# then run with `cargo test --doc`. Without it, `cargo test` runs all.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

NATS_SERVER_BIN="$("$repo/scripts/ensure-nats.sh" | tail -n 1)"
export NATS_SERVER_BIN
echo "test: using $NATS_SERVER_BIN ($("$NATS_SERVER_BIN" --version 2>&1 | head -n 1))" >&2

if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test: cargo-nextest not found, running cargo test" >&2
    exec cargo test "$@"
fi
# Two tests per core: they mostly wait on NATS and timers, so the suite took 186 s instead
# of about 300 s on two cores against nats-server 2.15.1. The tests that time the leader
# hold a machine-wide lock (`common::measuring`), and the three-node cluster tests run one
# at a time (.config/nextest.toml). NEXTEST_TEST_THREADS set by the caller wins.
export NEXTEST_TEST_THREADS="${NEXTEST_TEST_THREADS:-$(($(nproc) * 2))}"
cargo nextest run --no-fail-fast "$@"
# Doc tests only on a whole run: a filtered run asked for particular tests.
if [[ $# -eq 0 ]]; then
    cargo test --doc
fi
