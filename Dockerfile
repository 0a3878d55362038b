# The image docker-compose.yml runs: Debian bookworm with softdta and everything `make setup` installs.
FROM debian:bookworm
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip python3-venv make sudo \
    && rm -rf /var/lib/apt/lists/*
COPY . /opt/softdta
WORKDIR /opt/softdta
RUN PIP_BREAK_SYSTEM_PACKAGES=1 make setup
