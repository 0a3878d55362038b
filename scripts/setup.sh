#!/usr/bin/env bash
# Installs everything softdta needs on a fresh Debian machine (root): system packages, then the package itself.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(tshark docker.io docker-compose iptables etcd-server etcd-client nats-server clang clang-format llvm libbpf-dev libxdp1 libxdp-dev linux-libc-dev gcc make iproute2 python3-pyverbs qemu-system-x86 debootstrap cpio openssl cpp libgc1 libboost-iostreams1.74.0
              libjsoncpp25 libthrift-0.17.0 libboost-program-options1.74.0 libxxhash0 libpcap0.8 libgmp10 libnanomsg5
              python3-thrift libgrpc++1.51 libgrpc29 libprotobuf32 libabsl20220623)
missing=()
for package in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check -e '.[test]' pre-commit 2>&1 | grep -v -e "Running pip as the 'root' user" -e "is ignored: it is neither" || true
python3 -c "import softdta, scapy, numpy, nats, pyarrow, duckdb, importlinter, mypy, ruff, pre_commit" || { echo "setup: python packages failed to install" >&2; exit 1; }
