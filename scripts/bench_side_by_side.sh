#!/bin/sh
# Two revisions' benchmarks side by side in one run: scripts/bench_side_by_side.sh REV_BEFORE REV_AFTER [options]
exec python3 "$(dirname "$0")/bench_side_by_side.py" "$@"
