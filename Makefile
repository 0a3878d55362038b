# The two commands of the README: `make demo` (the main job) and `make test`. Both set up a fresh machine first.
PYTHON ?= python3

.PHONY: setup demo demo-fleet lint test bench codegen images compose

setup:
	bash scripts/setup.sh

demo: setup
	softdta demo

# the fleet: etcd, a controller, collectors joining and killed, two translators, the federated router
demo-fleet: setup
	softdta demo --fleet

# docker-compose.yml's images, built with no registry (docs/lab.md)
images: setup
	bash scripts/images.sh

# the images and docker-compose.yml's verdict, with a Docker daemon of its own where none runs
compose: setup
	bash scripts/compose.sh

# the dependency rule between layers (docs/architecture.md), style, and strict types on spec, wire and core
lint: setup
	$(PYTHON) -m ruff check softdta tests bench scripts setup.py conftest.py
	lint-imports
	$(PYTHON) -m mypy

test: lint
	$(PYTHON) -m pytest -q tests bench --benchmark-disable

bench: setup
	mkdir -p bench/results
	softdta bench
	$(PYTHON) -m pytest bench --benchmark-only --benchmark-json bench/results/core.json

codegen:
	softdta codegen
