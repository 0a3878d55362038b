#!/usr/bin/env bash
# Runs the live-lab and interop tests N times in a row while a CPU hog competes for one core, and prints the
# pass count. Usage: scripts/soak.sh [N] [pytest selection...]   (root; default N=20, the live and interop tests)
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
shift || true
selection=("$@")
((${#selection[@]})) || selection=(tests/live/test_lab.py tests/live/test_live_pipeline.py tests/live/test_xdp_veth.py tests/interop/test_rxe_lab.py
                                   tests/interop/test_rxe_interop.py tests/interop/test_rdma_cm_interop.py tests/interop/test_verbs_backend.py)

python3 -c 'while True: pass' &
hog=$!
trap 'kill $hog 2>/dev/null' EXIT

passed=0
for ((run = 1; run <= runs; run++)); do
    started=$SECONDS
    # each run holds the lock other privileged runs on this machine take (the lab's namespaces have fixed names)
    if flock /tmp/softdta-priv.lock python3 -m pytest -q -p no:cacheprovider "${selection[@]}" \
            >"/tmp/softdta-soak-$run.log" 2>&1; then
        passed=$((passed + 1))
        verdict=pass
    else
        verdict="FAIL (/tmp/softdta-soak-$run.log)"
    fi
    echo "soak: run $run/$runs $verdict in $((SECONDS - started)) s: $(tail -n 1 "/tmp/softdta-soak-$run.log")"
done
echo "soak: $passed of $runs runs passed under a CPU hog"
((passed == runs))
