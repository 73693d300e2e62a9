#!/bin/bash
# The tweets pilot (docs/tweets/PROTOCOL.md), from the snapshot worktree /work/pop-run; resumable.
# usage: run-pilot.sh STAGE MODELS [WORKERS]   (STAGE 0 = --task tweets-pilot, K = --task tweets-pilot-K; out pilot[-K])
STAGE=${1:-0}; MODELS=${2:-4}; WORKERS=${3:-1}
if [ "$STAGE" = 0 ]; then TASK=tweets-pilot; OUT=/work/populations/tweets/pilot
else TASK=tweets-pilot-$STAGE; OUT=/work/populations/tweets/pilot-$STAGE; fi
cd /work/pop-run
export PYTHONPATH=/work/pop-run OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
exec nice -n 19 /work/main/.venv/bin/python -c "import geosharp_ref; assert geosharp_ref.__file__.startswith('/work/pop-run'), geosharp_ref.__file__; import sys; from geosharp_ref.cli import main; sys.exit(main(sys.argv[1:]))" \
    population train --task $TASK --models $MODELS --out $OUT --workers $WORKERS
