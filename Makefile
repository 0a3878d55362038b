# The two commands of the README: `make demo` (the main job) and `make test`. Both set up a fresh machine first.
PYTHON ?= python3

.PHONY: setup demo test bench codegen

setup:
	bash scripts/setup.sh

demo: setup
	softdta demo

test: setup
	$(PYTHON) -m pytest -q tests bench --benchmark-disable

bench: setup
	mkdir -p bench/results
	softdta bench
	$(PYTHON) -m pytest bench --benchmark-only --benchmark-json bench/results/core.json

codegen:
	softdta codegen
