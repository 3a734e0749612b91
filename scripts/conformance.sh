#!/usr/bin/env bash
# Runs the official OJS conformance suites against a freshly started ojs-jetstream:
#
#   scripts/conformance.sh level-0-core [level-1-reliable ...]
#
# Each argument is a suite directory under $OJS_SHARED_DIR/conformance/suites (default
# shared dir: ../shared beside the repo) or a path to one. A private nats-server (JetStream,
# temp store, free loopback port) and a gateway (admin reset enabled, repo
# config ignored) are started, the runner is pointed at them, and both are stopped
# afterwards, whatever happens. Exits with the runner's status.
# NATS_SERVER_BIN picks the nats-server; otherwise scripts/ensure-nats.sh finds one.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shared="${OJS_SHARED_DIR:-$repo/../shared}"
suites_root="$shared/conformance/suites"
runner="$shared/tools/ojs_conformance.py"

if [[ $# -eq 0 ]]; then
    echo "usage: $0 LEVEL_DIR... (e.g. level-0-core; directories under $suites_root)" >&2
    exit 2
fi
if [[ ! -f "$runner" ]]; then
    echo "conformance: runner not found at $runner (set OJS_SHARED_DIR)" >&2
    exit 2
fi

suite_args=()
for level in "$@"; do
    if [[ -d "$suites_root/$level" ]]; then
        suite_args+=(--suites "$suites_root/$level")
    elif [[ -d "$level" ]]; then
        suite_args+=(--suites "$level")
    else
        echo "conformance: no suite directory $suites_root/$level" >&2
        exit 2
    fi
done

cd "$repo"
# shellcheck source=scripts/lib.sh
source "$repo/scripts/lib.sh"
# All targets, so features unify as in `cargo test`: after a test run this build has
# nothing left to do.
echo "conformance: building the gateway" >&2
cargo build --all-targets
gateway_bin="${CARGO_TARGET_DIR:-$repo/target}/debug/ojs-jetstream"

nats_bin="${NATS_SERVER_BIN:-}"
if [[ -z "$nats_bin" || ! -x "$nats_bin" ]]; then
    nats_bin="$("$repo/scripts/ensure-nats.sh" | tail -n 1)"
fi
echo "conformance: nats-server $nats_bin ($("$nats_bin" --version 2>&1 | head -n 1))" >&2

work="$(mktemp -d "${TMPDIR:-/tmp}/ojs-conformance.XXXXXX")"
stop_stack_on_exit "$work"

# Test ids in OJS_CONFORMANCE_SKIP (space-separated) are left out of the run, loudly: the
# suites are copied without those files. Only for cases that no correct server can pass;
# each skip is explained where it is set (.ci/run).
if [[ -n "${OJS_CONFORMANCE_SKIP:-}" ]]; then
    filtered=()
    for ((i = 1; i < ${#suite_args[@]}; i += 2)); do
        src="${suite_args[$i]}"
        dst="$work/suites/$(basename "$src")"
        mkdir -p "$dst"
        cp -r "$src/." "$dst/"
        for id in $OJS_CONFORMANCE_SKIP; do
            { grep -rlE "\"test_id\"[[:space:]]*:[[:space:]]*\"$id\"" "$dst" || true; } | while read -r file; do
                echo "conformance: SKIPPING $id ($file)" >&2
                rm -f "$file"
            done
        done
        filtered+=(--suites "$dst")
    done
    suite_args=("${filtered[@]}")
fi

start_nats "$nats_bin" "$work"
start_gateway conformance "$gateway_bin" "$work" "$NATS_PORT" OJS_ALLOW_RESET=true
base="$GATEWAY_URL"

status=0
python3 "$runner" --url "$base" "${suite_args[@]}" --reset-url "$base/ojs/v1/admin/reset" || status=$?

if [[ "$status" -ne 0 ]]; then
    echo "conformance: runner exited with $status; last 200 lines of the gateway log:" >&2
    tail -n 200 "$work/gateway.log" >&2
fi
exit "$status"
