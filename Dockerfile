# The image of docker-compose.yml's services: softdta's wheel (its BPF objects prebuilt) and the servers the lab
# runs, on the base `make images` makes with debootstrap, since no registry is needed (docs/lab.md).
FROM softdta-base:bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-pip libbpf1 libxdp1 iproute2 etcd-server \
        nats-server \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
COPY build/wheels /tmp/wheels
RUN python3 -m pip install -q --no-cache-dir --break-system-packages --no-index --find-links /tmp/wheels softdta \
    && rm -rf /tmp/wheels
