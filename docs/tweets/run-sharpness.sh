#!/bin/bash
# The tweets population's stages after training (docs/tweets/PROTOCOL.md, "Commands"), run from the snapshot
# worktree /work/pop-eval of a commit at or after amendment 11 (checked); every stage resumes where it
# stopped, so rerun this script after an interruption. Two cores, every stage on both (amendment 9): the packed
# models rebuilt by two one-thread processes, the reliability's test predictions and the calibration with two
# threads, then the main evaluation, the ablations and the exploratory curvature measures (amendment 5) in that
# order, each as two torchrun ranks of one thread (gloo; disjoint shards of the models, the records those of one
# process), so the primary analysis's measures are complete first.
# usage: run-sharpness.sh   (copy it to /work/populations/tweets/; nohup ./run-sharpness.sh > sharpness.log 2>&1 &)
set -euo pipefail
# amendment 12: a model does not rebuild on another machine, so the stages after training wait for amendment 13's
# per-model pipeline (each model's training, errors, predictions and measures on one machine)
echo "run-sharpness.sh: the stages after training wait for amendment 13 (docs/tweets/PROTOCOL.md, amendment 12)" >&2
exit 2
cd /work/pop-eval
export PYTHONPATH=/work/pop-eval MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
DIR=/work/populations/tweets/recipes
PY=/work/main/.venv/bin/python
# on a new machine, continue from the committed pack (amendment 6); a packed model is rebuilt when loaded
if [ ! -e "$DIR" ] && [ -f /work/main/docs/tweets/recipes/population.json ]; then
    cp -r /work/main/docs/tweets/recipes "$DIR.restoring" && mv "$DIR.restoring" "$DIR"
fi
# every stage runs in the background and is waited for, so that a TERM (a killed sitting) is handled at once, not
# after the stage: stop_stage then ends the stage and every process under it (torchrun's ranks, rebuild workers)
run() {
    "$@" &
    stage=$!
    wait "$stage" || { local rc=$?; stage=; return $rc; }
    stage=
}
gs() {  # geosharp from the snapshot (asserted), at low priority
    run nice -n 19 "$PY" -c "import geosharp_ref, sys; assert geosharp_ref.__file__.startswith('/work/pop-eval'), \
geosharp_ref.__file__; from geosharp_ref.cli import main; sys.exit(main(sys.argv[1:]))" "$@"
}
ranks() {  # `geosharp population ...` as two torchrun ranks of one thread each (they import from the snapshot too)
    OMP_NUM_THREADS=1 run nice -n 19 "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 \
        -m geosharp_ref.cli population "$@"
}
# all 80 models trained (the manifest is complete) before the reliability, and the reliability before any sharpness
"$PY" -c "import json, sys; m = json.load(open('$DIR/population.json')); n = len(m['models']); \
sys.exit(0 if m.get('complete') and n == 80 else f'{n} of 80 models trained: finish the training first')"
# one code and one software for every sitting (amendment 8): the first sitting records the snapshot's commit and
# the library versions in docs/tweets/eval-snapshot.json (commit it) and beside the population (packed with it);
# a later sitting on anything else, or on a snapshot older than amendment 11's code, stops here
SNAP=/work/main/docs/tweets/eval-snapshot.json
dirty=$(git -C /work/pop-eval status --porcelain --untracked-files=no)
if [ -n "$dirty" ]; then
    echo "run-sharpness.sh: /work/pop-eval has uncommitted changes; recreate it at its commit" >&2; exit 2
fi
# amendment 9's code (population rebuild, ranks that die with their launcher, gloo's 7-day timeout), amendment 10's
# analysis, amendment 11's (population exclude, the lock under torchrun) and amendment 12's (radii up to 100, an
# underflowing weight immovable) (4beacbe)
if ! git -C /work/pop-eval merge-base --is-ancestor 4beacbeb0b2503aeeb1893a348ff09b7da62a388 HEAD; then
    echo "run-sharpness.sh: /work/pop-eval is older than amendment 12's code (4beacbe); create it at a later commit" >&2
    exit 2
fi
now=$("$PY" -c "import json, platform, subprocess, numpy, scipy, tokenizers, torch, transformers; \
head = subprocess.check_output(['git', '-C', '/work/pop-eval', 'rev-parse', 'HEAD'], text=True).strip(); \
print(json.dumps(dict(commit=head, python=platform.python_version(), torch=torch.__version__, \
transformers=transformers.__version__, tokenizers=tokenizers.__version__, numpy=numpy.__version__, \
scipy=scipy.__version__), sort_keys=True))")
"$PY" - "$SNAP" "$DIR/eval-snapshot.json" "$now" <<'EOF'
import json, pathlib, sys
paths, now = [pathlib.Path(a) for a in sys.argv[1:3]], json.loads(sys.argv[3])
records = {str(p): json.loads(p.read_text()) for p in paths if p.is_file()}
began = next(iter(records.values()), None)
if any(r != began for r in records.values()):
    sys.exit(f"run-sharpness.sh: the snapshot records disagree ({records}); find which one the evaluation began on")
if began is not None and began != now:
    sys.exit(f"run-sharpness.sh: this sitting runs {now}, the evaluation began on {began}: create /work/pop-eval at "
             f"that commit (git worktree add --detach) and install those versions")
for p in paths:
    if not p.is_file():
        p.write_text(json.dumps(now, sort_keys=True) + "\n")
EOF
# the machine of each sitting (not part of the snapshot record: a new machine may continue the evaluation, and its
# CPU's vector unit can change the last bits of a value), one line per sitting in sittings.jsonl beside the population
"$PY" -c "import datetime, json, os, platform, torch; cpu = next((l.split(':', 1)[1].strip() for l in \
open('/proc/cpuinfo') if l.startswith('model name')), platform.processor()); print(json.dumps(dict( \
started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'), cpu=cpu, cores=os.cpu_count(), \
torch_cpu_capability=torch.backends.cpu.get_cpu_capability()), sort_keys=True))" >> "$DIR/sittings.jsonl"
descendants() {  # every process under $1, deepest first
    local c
    for c in $(pgrep -P "$1" || true); do descendants "$c"; echo "$c"; done
}
stop_stage() {
    if [ -n "${stage:-}" ]; then kill -TERM $(descendants "$stage") "$stage" 2>/dev/null || true; fi
}
trap stop_stage EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
# where this sitting starts (counts and times only, no result value)
gs population status --out "$DIR"
# the packed models before the stages that load them one after another (the reliability, the calibration's three);
# after those, each of two ranks rebuilds the models it loads
# (one thread each, as every model was trained: OMP_NUM_THREADS=1 from the start, as in run-train.sh; amendment 12)
if [ ! -f "$DIR/reliability.json" ] || [ ! -f "$DIR/calibration.json" ]; then
    OMP_NUM_THREADS=1 gs population rebuild --out "$DIR" --workers 2 --no-progress
fi
# the reliability's summary (R, τ_half, the gaps' spread) goes to reliability.log beside reliability.json, not into
# this log: nothing of the gaps is shown before the analysis (as run-train.sh withholds the gap range); once written
# (atomically, at its end), reliability.json is not computed again by a later sitting (amendment 12)
if [ ! -f "$DIR/reliability.json" ]; then
    OMP_NUM_THREADS=2 gs population reliability --out "$DIR" --threads 2 --no-progress >> "$DIR/reliability.log"
fi
OMP_NUM_THREADS=2 gs population calibrate --out "$DIR" --sizes 2e-5 2e-4 1e-3 1e-2 --models 3 --batch-size 128 \
    --probe-rho 0.03 0.3 --iters 20 --length-buckets 8 --threads 2 --no-progress --measures adaptive geodesic-inv \
    geodesic-mix geodesic-inv-first-order geodesic-mix-first-order geodesic-inv-frobenius geodesic-mix-frobenius
# the ranks import geosharp_ref from the snapshot (PYTHONPATH), as gs asserts for one process
"$PY" -c "import geosharp_ref; assert geosharp_ref.__file__.startswith('/work/pop-eval'), geosharp_ref.__file__"
ranks evaluate --out "$DIR" --calibration --batches 4 --batch-size 128 --iters 20 --length-buckets 8 --threads 1 \
    --no-progress --measures adaptive geodesic-inv geodesic-mix adaptive-linearised geodesic-inv-linearised \
    geodesic-mix-linearised
ranks evaluate --out "$DIR" --calibration --sizes 1e-3 1e-2 --tag ablations --batches 4 --batch-size 128 --iters 20 \
    --length-buckets 8 --threads 1 --no-progress --measures geodesic-inv-first-order geodesic-mix-first-order \
    geodesic-inv-frobenius geodesic-mix-frobenius
ranks evaluate --out "$DIR" --rho 1 --tag curvature --batches 1 --batch-size 128 --length-buckets 8 --threads 1 \
    --no-progress --measures hessian-trace-inv hessian-trace-mix hessian-trace-euclidean hessian-top-eigenvalue-inv \
    hessian-top-eigenvalue-mix hessian-top-eigenvalue-euclidean
trap - EXIT
gs population correlate --out "$DIR"
gs population correlate --out "$DIR" --tag ablations
gs population correlate --out "$DIR" --tag curvature
nice -n 19 "$PY" -m geosharp_ref.studies.population.tweets_analysis analyse "$DIR"
