#!/usr/bin/env bash
# `make compose`: the images, then docker-compose.yml's verdict (`up --exit-code-from check`), then `down`. It uses
# the Docker daemon that answers (DOCKER_HOST, or the default socket); where none does, or with --own-daemon, it
# runs one of its own for the while, away from the host's firewall and state: no iptables rules, no default bridge,
# no forwarding change, its data root, exec root and socket in a temporary directory (docs/lab.md).
set -euo pipefail
cd "$(dirname "$0")/.."

PROJECT=softdta
BRIDGE=sdta-compose0  # docker-compose.yml's network
fail() { echo "compose: $*" >&2; exit 1; }

own=0
case "${1:-}" in
    --own-daemon) own=1 ;;
    "") ;;
    *) echo "compose: unknown option $1; the one option is --own-daemon" >&2; exit 2 ;;
esac
for tool in docker docker-compose dockerd; do
    command -v "$tool" >/dev/null || fail "$tool is not installed; run make setup, which installs docker.io and docker-compose"
done

daemon_dir=""
stop_daemon() {
    [[ -n $daemon_dir ]] || return 0
    docker-compose -p "$PROJECT" down --remove-orphans -t 20 >/dev/null 2>&1 || true
    local pid deadline
    pid=$(cat "$daemon_dir/docker.pid" 2>/dev/null || true)
    if [[ -n $pid ]] && kill -TERM "$pid" 2>/dev/null; then
        deadline=$((SECONDS + 30))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    # what a daemon that did not stop cleanly left: its containerd and shims, its mounts, the network's bridge
    for proc in /proc/[0-9]*; do
        if tr '\0' ' ' <"$proc/cmdline" 2>/dev/null | grep -qF "$daemon_dir"; then
            kill -KILL "${proc#/proc/}" 2>/dev/null || true
        fi
    done
    awk -v dir="$daemon_dir" 'index($5, dir) == 1 {print $5}' /proc/self/mountinfo | sort -r \
        | while read -r mount; do umount -l "$mount" 2>/dev/null || true; done
    ip link del "$BRIDGE" 2>/dev/null || true
    rm -rf "$daemon_dir"
}

if ((own)) || ! docker info >/dev/null 2>&1; then
    daemon_dir=$(mktemp -d /tmp/softdta-dockerd.XXXXXX)
    trap stop_daemon EXIT
    # overlay2 by default; SOFTDTA_DOCKER_STORAGE_DRIVER=vfs where overlayfs is missing (slow, but it runs)
    if [[ -n ${SOFTDTA_DOCKER_STORAGE_DRIVER:-} ]]; then
        printf '{"storage-driver": "%s"}\n' "$SOFTDTA_DOCKER_STORAGE_DRIVER" >"$daemon_dir/daemon.json"
    else
        echo '{}' >"$daemon_dir/daemon.json"
    fi
    setsid dockerd --config-file "$daemon_dir/daemon.json" --iptables=false --ip6tables=false --ip-masq=false \
        --ip-forward=false --bridge=none --data-root "$daemon_dir/data" --exec-root "$daemon_dir/exec" \
        -H "unix://$daemon_dir/docker.sock" --pidfile "$daemon_dir/docker.pid" \
        >"$daemon_dir/dockerd.log" 2>&1 </dev/null &
    daemon=$!
    export DOCKER_HOST="unix://$daemon_dir/docker.sock"
    deadline=$((SECONDS + 60))
    until docker info >/dev/null 2>&1; do
        if ! kill -0 "$daemon" 2>/dev/null; then
            # its last line says why ("failed to start daemon: error initializing graphdriver: ...")
            fail "dockerd did not start: $(tail -n 1 "$daemon_dir/dockerd.log")"
        fi
        ((SECONDS < deadline)) || fail "dockerd did not answer within 60 s: $(tail -n 1 "$daemon_dir/dockerd.log")"
        sleep 0.2
    done
fi

bash scripts/images.sh
docker-compose -p "$PROJECT" down --remove-orphans >/dev/null 2>&1 || true  # what an interrupted run left
status=0
docker-compose -p "$PROJECT" up --no-build --exit-code-from check || status=$?
if ((status)); then
    echo "compose: the check failed (status $status); the services' logs:" >&2
    docker-compose -p "$PROJECT" logs --no-color --tail 40 >&2 || true
fi
docker-compose -p "$PROJECT" down --remove-orphans -t 20
exit "$status"
