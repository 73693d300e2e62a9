#!/bin/bash
# The tweets population's training (docs/tweets/PROTOCOL.md), from the snapshot worktree /work/pop-run;
# resumable (a model directory appears atomically; rerun this script to continue). usage: run-train.sh [WORKERS]
# On a new machine the population continues from its committed pack (amendment 6): docs/tweets/recipes of main.
DIR=/work/populations/tweets/recipes
if [ ! -e "$DIR" ] && [ -f /work/main/docs/tweets/recipes/population.json ]; then
    cp -r /work/main/docs/tweets/recipes "$DIR.restoring" && mv "$DIR.restoring" "$DIR"
fi
cd /work/pop-run
export PYTHONPATH=/work/pop-run OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
# Blind (amendment 8): the snapshot's `population train` ends by printing the population's gap range; that line
# is withheld from the log (stdout only; the progress bar on stderr is untouched), as test errors are until `analyse`.
# The trainer itself still replaces this shell (exec): killing the script's process stops the training.
exec > >(sed -u 's/; gap min .*$/; gap range withheld until the analysis (blind)/')
exec nice -n 19 /work/main/.venv/bin/python -c "import geosharp_ref; assert geosharp_ref.__file__.startswith('/work/pop-run'), geosharp_ref.__file__; import sys; from geosharp_ref.cli import main; sys.exit(main(sys.argv[1:]))" \
    population train --task tweets-recipes --models 80 --out "$DIR" --workers ${1:-1}
