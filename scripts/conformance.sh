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
nats_pid=""
gateway_pid=""

# shellcheck disable=SC2317  # called from a trap
stop() {
    # Stops one process started here: TERM, a short grace period, then KILL.
    local pid="$1"
    [[ -n "$pid" ]] || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}
# shellcheck disable=SC2317  # called from a trap
cleanup() {
    # Gateway first, so it never sees its NATS server disappear under it.
    stop "$gateway_pid"
    stop "$nats_pid"
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

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

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

nats_port="$(free_port)"
mkdir -p "$work/nats"
"$nats_bin" -js -sd "$work/nats" -a 127.0.0.1 -p "$nats_port" >"$work/nats.log" 2>&1 &
nats_pid=$!

# Wait for NATS to accept connections, so a broken server is reported as such.
for _ in $(seq 1 300); do
    (exec 3<>"/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null && break
    if ! kill -0 "$nats_pid" 2>/dev/null; then
        break
    fi
    sleep 0.1
done
if ! (exec 3<>"/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null; then
    echo "conformance: nats-server did not start on 127.0.0.1:$nats_port; its log:" >&2
    cat "$work/nats.log" >&2
    exit 1
fi

gateway_port="$(free_port)"
base="http://127.0.0.1:$gateway_port"
# OJS_CONFIG names a file that does not exist, so only defaults and these variables apply.
# OJS_SHARED_DIR is dropped: every OJS_* variable is read as a gateway setting.
env -u OJS_SHARED_DIR \
    OJS_CONFIG="$work/no-config.toml" \
    OJS_NATS_URL="nats://127.0.0.1:$nats_port" \
    OJS_LISTEN="127.0.0.1:$gateway_port" \
    OJS_ALLOW_RESET=true \
    OJS_NAMESPACE=ojs \
    "$gateway_bin" serve >"$work/gateway.log" 2>&1 &
gateway_pid=$!

echo "conformance: waiting for $base/ojs/v1/health" >&2
if ! python3 - "$base/ojs/v1/health" "$gateway_pid" <<'PY'
import os, sys, time, urllib.request, urllib.error

url, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as stat:
            exited = stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        exited = True
    if exited:
        print("conformance: the gateway exited during start-up", file=sys.stderr)
        sys.exit(1)
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            if response.status == 200:
                sys.exit(0)
    except (urllib.error.URLError, OSError):
        pass
    time.sleep(0.2)
print("conformance: no 200 from the health endpoint within 60 s", file=sys.stderr)
sys.exit(1)
PY
then
    echo "conformance: gateway log:" >&2
    cat "$work/gateway.log" >&2
    exit 1
fi

status=0
python3 "$runner" --url "$base" "${suite_args[@]}" --reset-url "$base/ojs/v1/admin/reset" || status=$?

if [[ "$status" -ne 0 ]]; then
    echo "conformance: runner exited with $status; last 200 lines of the gateway log:" >&2
    tail -n 200 "$work/gateway.log" >&2
fi
exit "$status"
