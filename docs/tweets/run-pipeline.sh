#!/bin/bash
# The tweets population's training and every stage after it (docs/tweets/PROTOCOL.md, "Commands"; amendments 13 and
# 14), run from the snapshot worktree /work/pop-eval of a commit at or after amendment 14's code (checked): one
# `geosharp population pipeline` of docs/tweets/pipeline.json takes every model in turn, on this machine, in two
# one-thread processes (a whole model each: its weights, trained where it is not trained yet, retrained with its
# errors measured again where this CPU does not rebuild them bit for bit; its test predictions; the main evaluation,
# the ablations and the exploratory curvature measures), after the calibration on the first three models; then the
# results in manifest order and the gap's reliability. Every step resumes where it stopped, so rerun this script
# after an interruption; the correlations and the analysis follow once every model is complete.
# usage: run-pipeline.sh   (copy it to /work/populations/tweets/; nohup ./run-pipeline.sh > sharpness.log 2>&1 &)
set -euo pipefail
cd /work/pop-eval
export PYTHONPATH=/work/pop-eval MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
DIR=/work/populations/tweets/recipes
PY=/work/main/.venv/bin/python
# on a new machine, continue from the committed pack (amendment 6); the pipeline rebuilds (or retrains) a packed
# model it has not finished
if [ ! -e "$DIR" ] && [ -f /work/main/docs/tweets/recipes/population.json ]; then
    cp -r /work/main/docs/tweets/recipes "$DIR.restoring" && mv "$DIR.restoring" "$DIR"
fi
# every stage runs in the background and is waited for, so that a TERM (a killed sitting) is handled at once, not
# after the stage: stop_stage then ends the stage and every process under it (the pipeline's workers)
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
# the population's 80 models (trained or not: the pipeline trains the models left, amendment 14), and no training
# beside it (the training snapshot dc168d2 takes no lock: a model would be trained by both)
"$PY" -c "import json, sys; n = len(json.load(open('$DIR/population.json'))['models']); \
sys.exit(0 if n == 80 else f'the manifest lists {n} models, not 80')"
# (run-train.sh's trainer and its spawned workers all run in /work/pop-run; stop them with the same loop and kill)
for p in /proc/[0-9]*; do
    if [ "$(readlink "$p/cwd" 2> /dev/null)" = /work/pop-run ]; then
        echo "run-pipeline.sh: a training from /work/pop-run is running (process ${p#/proc/}); stop it and its" \
            "workers (the pipeline trains the models left)" >&2
        exit 2
    fi
done
# one code and one software for every sitting (amendment 8): the first sitting records the snapshot's commit and
# the library versions in docs/tweets/eval-snapshot.json (commit it) and beside the population (packed with it);
# a later sitting on anything else, or on a snapshot older than amendment 14's code, stops here
SNAP=/work/main/docs/tweets/eval-snapshot.json
dirty=$(git -C /work/pop-eval status --porcelain --untracked-files=no)
if [ -n "$dirty" ]; then
    echo "run-pipeline.sh: /work/pop-eval has uncommitted changes; recreate it at its commit" >&2; exit 2
fi
# amendment 14's code (the pipeline trains the models not trained yet), with amendment 13's (weights, predictions
# and measures per model on one machine, each line keyed by the SHA-256 of its weights) and 12's (radii up to 100)
if ! git -C /work/pop-eval merge-base --is-ancestor ac0b78541e3d0f821d753bdfbf278bccab4f6cdb HEAD; then
    echo "run-pipeline.sh: /work/pop-eval is older than amendment 14's code (ac0b785); create it at a" \
        "later commit" >&2
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
    sys.exit(f"run-pipeline.sh: the snapshot records disagree ({records}); find which one the evaluation began on")
if began is not None and began != now:
    sys.exit(f"run-pipeline.sh: this sitting runs {now}, the evaluation began on {began}: create /work/pop-eval at "
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
# every model (the reliability's summary goes to reliability.log beside reliability.json, not into this log: nothing
# of the gaps is shown before the analysis); one OpenMP thread from the start, as run-train.sh trained every model
OMP_NUM_THREADS=1 gs population pipeline --out "$DIR" --plan /work/pop-eval/docs/tweets/pipeline.json --workers 2
trap - EXIT
gs population correlate --out "$DIR"
gs population correlate --out "$DIR" --tag ablations
gs population correlate --out "$DIR" --tag curvature
nice -n 19 "$PY" -m geosharp_ref.studies.population.tweets_analysis analyse "$DIR"
