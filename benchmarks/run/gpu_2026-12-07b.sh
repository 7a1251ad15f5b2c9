#!/usr/bin/env bash
# The driver of benchmarks/results/2026-12-07-*-b's GPU runs: bash benchmarks/run/gpu_2026-12-07b.sh PART...
# with OUT set to a folder and COMMIT to the commit under test, from the repository root, on a GPU machine
# (.gpu/activate.sh puts ffpa-attn and flash-attn-4 4.0.0b36 on the path).
#   P   the Ulysses SP projection: per-rank attention at heads/N over the whole sequence (31B, N = 8 and 4;
#       26B-A4B, N = 8), 64k and 128k, with the measured one-GPU attention-free floors (H100, 2026-12-06-h100-d)
#   K   kernel_map.py's sdpa rows and its first FFPA call (both failed before), 31B shapes at 8k
#   TN  the GPU tests this session touched (the drop-in, the first-call entry, the SP rank shapes)
#   T   the rest of the GPU tests
#   A   every GPU test (after the kernel-table change)
set -u
[ -f .gpu/activate.sh ] && source .gpu/activate.sh
export PYTHONPATH=$PWD:${PYTHONPATH:-}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $OUT/session.log; }
python -m benchmarks.manifest $OUT benchmarks/run/gpu_2026-12-07b.sh
for part in "$@"; do case "$part" in
P)
  stamp "ulysses projection 31B"
  timeout 300 python benchmarks/ulysses_projection.py --model 31B --degrees 8 4 --seqs 65536 131072 --floor-tps 1946 \
    --one-gpu-tps 1632 --out $OUT/ulysses_projection_31b.json 2>&1 | tail -20 >> $OUT/ulysses_projection.log
  stamp "ulysses projection 26B-A4B"
  timeout 120 python benchmarks/ulysses_projection.py --model 26B-A4B --degrees 8 --seqs 65536 131072 --floor-tps 5032 \
    --out $OUT/ulysses_projection_26b.json 2>&1 | tail -10 >> $OUT/ulysses_projection.log
  stamp "projection done"
  ;;
K)
  stamp "kernel_map sdpa rows + first FFPA call"
  timeout 180 python benchmarks/kernel_map.py --seqs 8192 --models 31B --layouts dense --kernels ffpa sdpa fa4 \
    --out $OUT/kernel_map_check.json 2>&1 | tail -8 > $OUT/kernel_map_check.log
  stamp "kernel_map done"
  ;;
TN)
  stamp "gpu tests touched this session"
  timeout ${TESTS_S:-300} python -m pytest -m gpu -q -p no:cacheprovider --durations=8 tests/gpu \
    -k "first_call or ulysses or tiny_gemma4_on_real_kernels or autocast or dropin" 2>&1 | tail -30 > $OUT/gpu-tests-new.log
  stamp "done: $(tail -1 $OUT/gpu-tests-new.log)"
  ;;
T)
  stamp "gpu tests"
  timeout ${TESTS_S:-540} python -m pytest -m gpu -q -p no:cacheprovider --durations=12 tests/gpu \
    -k "not (first_call or ulysses or tiny_gemma4_on_real_kernels or autocast or dropin)" 2>&1 | tail -40 > $OUT/gpu-tests-rest.log
  stamp "done: $(tail -1 $OUT/gpu-tests-rest.log)"
  ;;
A)
  stamp "all gpu tests"
  timeout ${TESTS_S:-540} python -m pytest -m gpu -q -p no:cacheprovider --durations=12 tests/gpu 2>&1 | tail -60 > $OUT/gpu-tests-all.log
  stamp "done: $(tail -1 $OUT/gpu-tests-all.log)"
  ;;
esac; done
