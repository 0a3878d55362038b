#!/usr/bin/env bash
# Runs the restart matrix (tests/live/test_restart_matrix.py) N times in a row while CPU hogs compete for every
# core, then prints how many runs passed and how often each cell failed.
# Usage: scripts/restart_matrix_soak.sh [N] [HOGS] [pytest options...]   (root; default N=10, HOGS=the cores)
#   e.g. scripts/restart_matrix_soak.sh 3 2 -k collector-kill9
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
hogs=${2:-$(nproc)}
shift 2 2>/dev/null || shift $#
logs=$(mktemp -d /tmp/softdta-matrix-soak.XXXXXX)

hog_pids=()
stop_hogs() {
    ((${#hog_pids[@]})) && kill "${hog_pids[@]}" 2>/dev/null
    wait "${hog_pids[@]}" 2>/dev/null
}
trap stop_hogs EXIT
for ((hog = 0; hog < hogs; hog++)); do
    python3 -c 'while 1: pass' &
    hog_pids+=($!)
done

passed=0
for ((run = 1; run <= runs; run++)); do
    started=$SECONDS
    log="$logs/run-$run.log"
    # the lock other privileged runs on this machine take, so that they do not compete with this one as well
    if flock /tmp/softdta-priv.lock python3 -m pytest -q -p no:cacheprovider -rf tests/live/test_restart_matrix.py \
            "$@" >"$log" 2>&1; then
        passed=$((passed + 1))
        verdict=pass
    else
        verdict="FAIL ($log)"
    fi
    echo "restart matrix soak: run $run/$runs $verdict in $((SECONDS - started)) s: $(tail -n 1 "$log")"
done

failures=$(grep -h '^FAILED ' "$logs"/run-*.log | sed -e 's/^FAILED [^[]*\[\([^]]*\)\].*/\1/' | sort | uniq -c | sort -rn)
if [[ -n $failures ]]; then
    echo "restart matrix soak: failed cells (runs failed, cell):"
    echo "$failures"
fi
echo "restart matrix soak: $passed of $runs runs passed under $hogs CPU hogs (logs in $logs)"
((passed == runs))
