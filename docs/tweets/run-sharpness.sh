#!/bin/bash
# The tweets population's stages after training (docs/tweets/PROTOCOL.md, "Commands"), run from the snapshot
# worktree /work/pop-eval of a commit at or after amendment 5 (curvature errors); every stage resumes where it
# stopped, so rerun this script after an interruption. Two cores: the reliability's test predictions and the
# calibration with two threads, then the main evaluation beside the ablations and, after them, the exploratory
# curvature measures (amendment 5), one thread each.
# usage: run-sharpness.sh   (copy it to /work/populations/tweets/; nohup ./run-sharpness.sh > sharpness.log 2>&1 &)
set -euo pipefail
cd /work/pop-eval
export PYTHONPATH=/work/pop-eval MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
DIR=/work/populations/tweets/recipes
PY=/work/main/.venv/bin/python
# on a new machine, continue from the committed pack (amendment 6); a packed model is rebuilt when loaded
if [ ! -e "$DIR" ] && [ -f /work/main/docs/tweets/recipes/population.json ]; then
    cp -r /work/main/docs/tweets/recipes "$DIR.restoring" && mv "$DIR.restoring" "$DIR"
fi
gs() {  # geosharp from the snapshot (asserted), at low priority
    nice -n 19 "$PY" -c "import geosharp_ref, sys; assert geosharp_ref.__file__.startswith('/work/pop-eval'), \
geosharp_ref.__file__; from geosharp_ref.cli import main; sys.exit(main(sys.argv[1:]))" "$@"
}
# all 80 models trained (the manifest is complete) before the reliability, and the reliability before any sharpness
"$PY" -c "import json, sys; m = json.load(open('$DIR/population.json')); n = len(m['models']); \
sys.exit(0 if m.get('complete') and n == 80 else f'{n} of 80 models trained: finish the training first')"
# where this sitting starts (counts and times only, no result value)
gs population status --out "$DIR"
OMP_NUM_THREADS=2 gs population reliability --out "$DIR" --threads 2 --no-progress
OMP_NUM_THREADS=2 gs population calibrate --out "$DIR" --sizes 2e-5 2e-4 1e-3 1e-2 --models 3 --batch-size 128 \
    --probe-rho 0.03 0.3 --iters 20 --length-buckets 8 --threads 2 --no-progress --measures adaptive geodesic-inv \
    geodesic-mix geodesic-inv-first-order geodesic-mix-first-order geodesic-inv-frobenius geodesic-mix-frobenius
OMP_NUM_THREADS=1 gs population evaluate --out "$DIR" --calibration --batches 4 --batch-size 128 --iters 20 \
    --length-buckets 8 --threads 1 --no-progress --measures adaptive geodesic-inv geodesic-mix \
    adaptive-linearised geodesic-inv-linearised geodesic-mix-linearised &
main=$!
{  # the ablations, then the exploratory curvature measures (amendment 5), beside the main evaluation
OMP_NUM_THREADS=1 gs population evaluate --out "$DIR" --calibration --sizes 1e-3 1e-2 --tag ablations --batches 4 \
    --batch-size 128 --iters 20 --length-buckets 8 --threads 1 --no-progress --measures \
    geodesic-inv-first-order geodesic-mix-first-order geodesic-inv-frobenius geodesic-mix-frobenius
OMP_NUM_THREADS=1 gs population evaluate --out "$DIR" --rho 1 --tag curvature --batches 1 --batch-size 128 \
    --length-buckets 8 --threads 1 --no-progress --measures hessian-trace-inv hessian-trace-mix \
    hessian-trace-euclidean hessian-top-eigenvalue-inv hessian-top-eigenvalue-mix hessian-top-eigenvalue-euclidean
} &
others=$!
wait "$main"
wait "$others"
gs population correlate --out "$DIR"
gs population correlate --out "$DIR" --tag ablations
gs population correlate --out "$DIR" --tag curvature
nice -n 19 "$PY" -m geosharp_ref.studies.population.tweets_analysis analyse "$DIR"
