#!/usr/bin/env bash
# A Docker engine for building and running the worker's image on this machine.
#
#   scripts/image/engine.sh start   the engine at DOCKER_HOST when one answers there; otherwise this
#                                   project's own (started if it is not running, and left running).
#                                   Last line: DOCKER_HOST=unix://...; the line before it says
#                                   `engine: started` when this call started it.
#   scripts/image/engine.sh stop    stops this project's own engine (by its pid), if it runs.
#
# This project's engine keeps its images in VLLM_WORKER_IMAGE_CACHE/docker (default
# /var/cache/vllm-worker-image/docker), outside the clone, so the base built once is found by the
# next run. It needs root and Debian's docker.io (installed here when missing): no registry is
# reachable, no bridge or iptables are set up, and containers run with --network host.
set -euo pipefail

CACHE="${VLLM_WORKER_IMAGE_CACHE:-/var/cache/vllm-worker-image}"
RUN_DIR="${VLLM_WORKER_DOCKER_RUN:-/run/vllm-worker-image}"
SOCK="$RUN_DIR/docker.sock"
PIDFILE="$RUN_DIR/dockerd.pid"
DOCKER=/usr/bin/docker

say() { printf 'engine: %s\n' "$*" >&2; }

install_docker() {
    if [[ -x /usr/sbin/dockerd && -x /usr/bin/docker ]] && command -v debootstrap >/dev/null; then
        return
    fi
    say "installing Debian's docker.io and debootstrap (apt)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends docker.io debootstrap >&2
}

answers() { DOCKER_HOST="$1" timeout 10 "$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1; }

own_pid() {
    local pid
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

start() {
    install_docker
    if [[ -n "${DOCKER_HOST:-}" ]] && answers "$DOCKER_HOST"; then
        say "using the engine at $DOCKER_HOST"
        echo "DOCKER_HOST=$DOCKER_HOST"
        return
    fi
    mkdir -p "$CACHE/docker" "$RUN_DIR"
    exec 7>"$RUN_DIR/.start.lock"
    flock 7
    if answers "unix://$SOCK"; then
        say "using this project's engine (already running)"
        echo "DOCKER_HOST=unix://$SOCK"
        return
    fi
    say "starting dockerd (data root $CACHE/docker, log $CACHE/dockerd.log)"
    rm -f "$SOCK"
    setsid /usr/sbin/dockerd --iptables=false --ip6tables=false --bridge=none --storage-driver=overlay2 \
        --data-root "$CACHE/docker" --exec-root "$RUN_DIR/exec" --pidfile "$PIDFILE" \
        --host "unix://$SOCK" </dev/null >>"$CACHE/dockerd.log" 2>&1 7>&- &
    for _ in $(seq 1 120); do
        if answers "unix://$SOCK"; then
            say "started"
            echo "DOCKER_HOST=unix://$SOCK"
            return
        fi
        sleep 0.5
    done
    say "dockerd did not answer within 60 s; its log:"
    tail -n 30 "$CACHE/dockerd.log" >&2
    exit 1
}

stop() {
    local pid
    pid="$(own_pid || true)"
    if [[ -z "$pid" ]]; then
        say "this project's engine is not running"
        return
    fi
    # Containers first, so none outlives its engine.
    DOCKER_HOST="unix://$SOCK" "$DOCKER" ps -q | xargs -r env DOCKER_HOST="unix://$SOCK" "$DOCKER" rm -f >/dev/null 2>&1 || true
    kill -TERM "$pid"
    for _ in $(seq 1 60); do
        if ! kill -0 "$pid" 2>/dev/null; then
            # dockerd leaves its default network namespace mounted.
            mountpoint -q "$RUN_DIR/exec/netns/default" 2>/dev/null && umount "$RUN_DIR/exec/netns/default"
            say "stopped"
            return
        fi
        sleep 0.5
    done
    kill -KILL "$pid" 2>/dev/null || true
    say "killed (it did not stop within 30 s)"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
