# Helpers shared by the scripts that start a nats-server and a gateway (serve.sh,
# bench.sh, conformance.sh). Sourced, not run: `source "$repo/scripts/lib.sh"`.
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
