#!/usr/bin/env bash
# The driver of benchmarks/results/2026-12-06-h100-d's GPU runs: bash benchmarks/run/gpu_2026-12-06d.sh PART...
# with OUT set to a folder and COMMIT to the commit under test, from the repository root, on a GPU
# machine (.gpu/activate.sh puts ffpa-attn and flash-attn-4 on the path; .whl-extra holds peft).
# The routing-core rewrite is compared with the package before it (0a52d15, unpacked in .baseline
# with its own benchmarks/) in the same call, on the same machine.
set -u
[ -f .gpu/activate.sh ] && source .gpu/activate.sh
if ls .whl-extra/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-deps --target /tmp/extra .whl-extra/*.whl > /dev/null 2>&1
  export PYTHONPATH=/tmp/extra:${PYTHONPATH:-}
fi
NEW=$PWD
export PYTHONPATH=$NEW:${PYTHONPATH:-}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $OUT/session.log; }
if [ ! -f $OUT/manifest.json ]; then
  python - <<PY > $OUT/manifest.json
import json, subprocess, sys
sys.path.insert(0, ".")
from benchmarks.common import env_info
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,power.limit,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
print(json.dumps({"commit": "${COMMIT:-unknown}", "baseline_commit": "0a52d15", "gpu": gpu, "env": env_info(),
                  "driver": "benchmarks/run/gpu_2026-12-06d.sh"}, indent=1))
PY
fi
full() {  # limit model backend args...: one full-depth row, one process
  local limit=$1 model=$2 backend=$3; shift 3
  stamp "full_model $model $backend $*"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $limit python benchmarks/full_model.py --model $model \
    --backend $backend --append --out $OUT/full_model.json "$@" 2>&1 | grep "^{" | cut -c1-600 >> $OUT/full_model.log \
    || echo "   (no row: $model $backend $* exited or timed out after ${limit}s)" >> $OUT/full_model.log
}
for part in "$@"; do case "$part" in
T)  # every GPU test (the rewritten routing core on the real kernels)
  stamp "gpu tests"
  timeout ${TESTS_S:-420} python -m pytest -m gpu -q -p no:cacheprovider --durations=12 tests/gpu 2>&1 | tail -60 > $OUT/gpu-tests.log
  stamp "gpu tests done"
  ;;
O)  # host time per attention call: after, before, after (both on this machine, in this call)
  for label in after before after; do
    stamp "overhead $label"
    if [ $label = before ]; then pp=$NEW/.baseline:${PYTHONPATH#$NEW:}; else pp=$PYTHONPATH; fi
    PYTHONPATH=$pp timeout 120 python benchmarks/overhead.py --device cuda --label $label --out $OUT/overhead_$label.$(date +%s).json \
      2>&1 | grep -v "^ffpa_patch: Gemma4" | tee -a $OUT/overhead.log
  done
  ;;
E)  # the 8k slice (6 layers of 31B shape), one step = fwd+bwd+AdamW: after / before / after, plus a padded batch
  for pass in after before after; do
    if [ $pass = before ]; then script=.baseline/benchmarks/e2e.py; pp=$NEW/.baseline:${PYTHONPATH#$NEW:}; else script=benchmarks/e2e.py; pp=$PYTHONPATH; fi
    for padded in "" "--padded"; do
      stamp "e2e $pass $padded"
      PYTHONPATH=$pp timeout 150 python $script --seqs 8192 --layers 6 --steps 8 --backends ffpa $padded --append \
        --out $OUT/e2e_8k_$pass.json 2>&1 | grep "^{" | cut -c1-400 >> $OUT/e2e.log
    done
  done
  stamp "e2e stock"
  timeout 150 python benchmarks/e2e.py --seqs 8192 --layers 6 --steps 6 --backends sdpa-stock --append --out $OUT/e2e_8k_stock.json \
    2>&1 | grep "^{" | cut -c1-400 >> $OUT/e2e.log
  ;;
F31)  # 31B at full depth, 8k, LoRA, plain checkpointing; vocab 32768 (262144 does not fit 80 GB with stock)
  full 200 31b sdpa-stock --seq 8192 --vocab 32768 --steps 3
  full 150 31b ffpa --seq 8192 --vocab 32768 --steps 4
  full 150 31b floor --seq 8192 --vocab 32768 --steps 4
  ;;
F26)  # 26B-A4B (MoE) at full depth, 8k, LoRA, released vocab
  full 150 26b-a4b sdpa-stock --seq 8192 --steps 4
  full 150 26b-a4b ffpa --seq 8192 --steps 4
  ;;
F31L)  # 16k
  full 200 31b ffpa --seq 16384 --vocab 32768 --steps 3
  full 240 31b sdpa-stock --seq 16384 --vocab 32768 --steps 3
  ;;
T3)  # the three GPU tests of the first call that a test bug of mine (max_seqlen below the longest
    # sequence: a device-side assert that poisoned the CUDA context for the two after it) made fail
  stamp "gpu tests, again"
  timeout 240 python -m pytest -m gpu -q -p no:cacheprovider tests/gpu -k "repeatable or double_backward" 2>&1 | tail -25 > $OUT/gpu-tests-rerun.log
  ;;
F31F16)  # the floor at 16k
  full 150 31b floor --seq 16384 --vocab 32768 --steps 3
  ;;
FE4)  # E4B (42 layers, 18 KV-shared, per-layer inputs), 8k, LoRA, released vocab
  full 120 e4b sdpa-stock --seq 8192 --steps 4
  full 120 e4b ffpa --seq 8192 --steps 4
  full 120 e4b floor --seq 8192 --steps 4
  ;;
esac; done
stamp "done"
