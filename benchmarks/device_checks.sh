#!/bin/bash
# The checks to run where a session is lent a CUDA device (15 minutes of device time in all, a start taking 2-3):
# one short script, its outputs under $OUT. Run from the repository root on the device machine, e.g. with the
# session's `run` tool: `bash benchmarks/device_checks.sh` (timeout_s 540; nothing needs to travel with it).
#   1. tests/geosharp_ref/test_cuda.py (marker cuda): every measure and command on the GPU against the CPU;
#   2. benchmarks section 6: ViT-B/32, 2048 inputs in batches of 256, 20 iterations, per measure time and peak
#      memory (RESULTS.md "Section 6 (CUDA)");
#   3. benchmarks/profile_cuda.py: one batch's evaluation against the plain forward+backward, the adaptive rest per
#      parameter and grouped, Auto-PGD's parking on and off, and the profiler's top operators.
# Each step has its own time limit, so a slow step leaves the others their share. Writes $OUT/env.txt (the
# device, torch and transformers versions, each step's exit status and seconds), $OUT/cuda_tests.log,
# $OUT/bench_cuda.{md,json}, $OUT/bench_cuda.log and $OUT/profile_cuda.txt.
set -u
OUT=${OUT:-/tmp/device_checks}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HYPOTHESIS_PROFILE=ci
PY=${PY:-python3}
E=$OUT/env.txt
(nvidia-smi -L; "$PY" -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, \
transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')") \
    > "$E" 2>&1
s=$SECONDS
timeout "${TESTS_S:-120}" "$PY" -m pytest -q -m cuda tests/geosharp_ref/test_cuda.py -p no:cacheprovider \
    > "$OUT/cuda_tests.log" 2>&1
echo "tests rc=$? $((SECONDS - s)) s" >> "$E"
s=$SECONDS
timeout "${BENCH_S:-240}" "$PY" benchmarks/run.py --device cuda --cases cuda --out "$OUT/bench_cuda.md" \
    --json "$OUT/bench_cuda.json" > "$OUT/bench_cuda.log" 2>&1
echo "bench rc=$? $((SECONDS - s)) s" >> "$E"
s=$SECONDS
timeout "${PROFILE_S:-150}" "$PY" benchmarks/profile_cuda.py 2>&1 | grep -v USDT > "$OUT/profile_cuda.txt"
echo "profile rc=${PIPESTATUS[0]} $((SECONDS - s)) s" >> "$E"
cat "$E"
tail -3 "$OUT/cuda_tests.log"
tail -5 "$OUT/bench_cuda.log"
grep -E "^(floor|adaptive|geodesic|phases)|kernel launches" "$OUT/profile_cuda.txt"
