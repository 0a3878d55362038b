#!/usr/bin/env bash
# `make images`: the images docker-compose.yml runs, with no registry. The base is Debian bookworm made with
# debootstrap from the mirror apt already uses (cached as a tarball) and imported as softdta-base:bookworm;
# softdta:latest adds softdta's wheel, whose BPF objects are built here (docs/lab.md, "The lab in containers").
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=softdta-base:bookworm
CACHE=${SOFTDTA_CACHE:-/var/cache/softdta}/docker
fail() { echo "images: $*" >&2; exit 1; }
# the classic builder: bookworm's docker has no buildx, and BuildKit would want an entitlement for --network host
export DOCKER_BUILDKIT=0

command -v docker >/dev/null || fail "docker is not installed; run make setup, which installs docker.io"
docker info >/dev/null 2>&1 || fail "no Docker daemon answers at ${DOCKER_HOST:-unix:///var/run/docker.sock}; start one or set DOCKER_HOST, or run make compose, which starts its own"

mirror() {
    local sources=/etc/apt/sources.list.d/debian.sources
    if [[ -r $sources ]]; then
        awk '/^URIs:/ {print $2; exit}' "$sources"
    else
        awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null
    fi
}

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    tarball=$CACHE/bookworm-minbase.tar
    if [[ ! -s $tarball ]]; then
        command -v debootstrap >/dev/null || fail "debootstrap is not installed; run make setup"
        url=$(mirror)
        [[ -n $url ]] || fail "found no Debian mirror in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list"
        work=$(mktemp -d)
        trap 'rm -rf "$work"' EXIT
        echo "images: debootstrap bookworm from $url (about a minute, once)"
        debootstrap --variant=minbase bookworm "$work/rootfs" "$url" >"$work/debootstrap.log" 2>&1 \
            || fail "debootstrap from $url failed: $(tail -n 1 "$work/debootstrap.log")"
        rm -rf "$work"/rootfs/var/cache/apt/archives/*.deb "$work"/rootfs/var/lib/apt/lists/*
        # no init runs in a container: packages must not try to start their services
        printf '#!/bin/sh\nexit 101\n' >"$work/rootfs/usr/sbin/policy-rc.d"
        chmod +x "$work/rootfs/usr/sbin/policy-rc.d"
        mkdir -p "$CACHE"
        tar -C "$work/rootfs" -c . >"$tarball.partial"
        mv "$tarball.partial" "$tarball"
        rm -rf "$work"
        trap - EXIT
    fi
    docker import "$tarball" "$BASE" >/dev/null
fi

# the wheel and every dependency's, installed in the image with no index and no compiler
rm -rf build/wheels
python3 -m pip wheel -q --disable-pip-version-check --wheel-dir build/wheels . 2>&1 \
    | grep -v -e "Running pip as the 'root' user" -e "is ignored: it is neither" || true
ls build/wheels/softdta-*.whl >/dev/null 2>&1 || fail "pip wheel built no softdta wheel (see its output above)"
docker build -q --network host -t softdta:latest . >/dev/null
echo "images: $BASE and softdta:latest are built"
