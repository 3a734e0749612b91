# Helpers shared by the scripts that start a nats-server and a gateway (serve.sh,
# bench.sh, conformance.sh, browser-test.sh). Sourced, not run: `source "$repo/scripts/lib.sh"`.
# Bash only (its /dev/tcp), so they need neither curl nor nc.

# True when something accepts TCP connections on HOST PORT.
port_open() {
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

# True when GET URL (plain http://host:port/path) answers 200.
http_ok() {
    local rest="${1#http://}"
    local authority="${rest%%/*}" path="/${rest#*/}"
    (
        exec 3<>"/dev/tcp/${authority%:*}/${authority##*:}" || exit 1
        printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$path" "$authority" >&3
        local status_line
        IFS= read -r -t 5 status_line <&3 || exit 1
        [[ "$status_line" == HTTP/1.?" 200 "* ]]
    ) 2>/dev/null
}

# A free loopback port, as chosen by the kernel.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# True while PID runs (an exited child that was not reaped yet counts as gone).
process_alive() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    [[ "$(awk '{print $1}' <<<"${stat##*)}")" != Z ]]
}

# wait_until NAME PID LOG SECONDS CHECK...: runs CHECK until it succeeds. Fails, printing
# LOG, when process PID (named NAME in the message) exits first or SECONDS pass.
wait_until() {
    local name="$1" pid="$2" log="$3" seconds="$4"
    shift 4
    local deadline=$((SECONDS + seconds))
    until "$@"; do
        if ! process_alive "$pid"; then
            echo "$name exited during start-up; its log ($log):" >&2
            cat "$log" >&2
            return 1
        fi
        if ((SECONDS >= deadline)); then
            echo "$name: no success from '$*' within $seconds s; its log ($log):" >&2
            cat "$log" >&2
            return 1
        fi
        sleep 0.1
    done
}

# Stops a process started by the calling script: TERM, up to 5 s of grace (nats-server
# flushes its store, the gateway finishes its requests), then KILL; reaps it. An empty
# PID is ignored, so cleanup traps can call it for processes not started yet.
stop_process() {
    local pid="$1"
    [[ -n "$pid" ]] || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do
            process_alive "$pid" || break
            sleep 0.1
        done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
}

# start_nats BIN DIR: starts nats-server BIN with JetStream on a free loopback port, its
# store in DIR/nats and its log in DIR/nats.log, and waits up to 30 s until it accepts
# connections. Sets NATS_PID (as soon as it runs, for the caller's cleanup) and NATS_PORT.
start_nats() {
    local bin="$1" dir="$2"
    NATS_PORT="$(free_port)"
    mkdir -p "$dir/nats"
    "$bin" -js -sd "$dir/nats" -a 127.0.0.1 -p "$NATS_PORT" >"$dir/nats.log" 2>&1 &
    NATS_PID=$!
    wait_until nats-server "$NATS_PID" "$dir/nats.log" 30 port_open 127.0.0.1 "$NATS_PORT"
}

# start_gateway NAME BIN DIR NATS_PORT [VAR=VALUE...]: starts `BIN serve` on a free loopback
# port against the nats-server on NATS_PORT, namespace ojs, with the built-in defaults and
# the given OJS_* settings only (OJS_CONFIG names a file that does not exist; OJS_SHARED_DIR
# is dropped, as every OJS_* variable is read as a setting), its log in DIR/gateway.log, and
# waits up to 60 s for its health endpoint (NAME prefixes the message). Sets GATEWAY_PID (as
# soon as it runs) and GATEWAY_URL.
start_gateway() {
    local name="$1" bin="$2" dir="$3" nats_port="$4"
    shift 4
    local port
    port="$(free_port)"
    GATEWAY_URL="http://127.0.0.1:$port"
    env -u OJS_SHARED_DIR \
        OJS_CONFIG="$dir/no-config.toml" \
        OJS_NATS_URL="nats://127.0.0.1:$nats_port" \
        OJS_LISTEN="127.0.0.1:$port" OJS_GRPC_LISTEN= \
        OJS_NAMESPACE=ojs \
        "$@" \
        "$bin" serve >"$dir/gateway.log" 2>&1 &
    GATEWAY_PID=$!
    echo "$name: waiting for $GATEWAY_URL/ojs/v1/health" >&2
    wait_until gateway "$GATEWAY_PID" "$dir/gateway.log" 60 http_ok "$GATEWAY_URL/ojs/v1/health"
}

# stop_stack_on_exit DIR: when the calling script exits (or is interrupted), stops the
# gateway and then the nats-server that start_gateway and start_nats started, and removes
# DIR. Call it before starting them.
stop_stack_on_exit() {
    STACK_DIR="$1"
    NATS_PID=""
    GATEWAY_PID=""
    trap stop_stack EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

# shellcheck disable=SC2317  # called from a trap
stop_stack() {
    # Gateway first, so it never sees its NATS server disappear under it.
    stop_process "$GATEWAY_PID"
    stop_process "$NATS_PID"
    rm -rf "$STACK_DIR"
}
