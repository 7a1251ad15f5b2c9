#!/usr/bin/env bash
# The driver of benchmarks/results/2026-12-07-*'s GPU runs: bash benchmarks/run/gpu_2026-12-07.sh PART...
# with OUT set to a folder and COMMIT to the commit under test, from the repository root, on a GPU machine
# (.gpu/activate.sh puts ffpa-attn and flash-attn-4 4.0.0b36 on the path; .whl-extra holds peft and
# flash-attn-4 4.0.0b40). The package before this session's rewrite (b8daa5f) is unpacked in .baseline.
set -u
[ -f .gpu/activate.sh ] && source .gpu/activate.sh
if [ ! -d /tmp/extra ]; then
  python3 -m pip install -q --no-deps --target /tmp/extra .whl-extra/peft-*.whl > /dev/null 2>&1
  python3 -m pip install -q --no-deps --target /tmp/fa4b40 .whl-extra/flash_attn_4-4.0.0b40-*.whl > /dev/null 2>&1
fi
export PYTHONPATH=/tmp/extra:${PYTHONPATH:-}
NEW=$PWD
export PYTHONPATH=$NEW:$PYTHONPATH
B40=/tmp/fa4b40:$PYTHONPATH  # flash-attn-4 b40 ahead of the bundle's b36
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $OUT/session.log; }
if [ ! -f $OUT/manifest.json ]; then
  python - <<PY > $OUT/manifest.json
import json, subprocess, sys
sys.path.insert(0, ".")
from benchmarks.common import env_info
gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,power.limit,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip()
print(json.dumps({"commit": "${COMMIT:-unknown}", "baseline_commit": "b8daa5f", "gpu": gpu, "env": env_info(),
                  "driver": "benchmarks/run/gpu_2026-12-07.sh"}, indent=1))
PY
fi
full() {  # limit model backend args...: one full-depth row, one process
  local limit=$1 model=$2 backend=$3; shift 3
  stamp "full_model $model $backend $*"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout $limit python benchmarks/full_model.py --model $model \
    --backend $backend --append --out $OUT/full_model.json "$@" 2>&1 | grep "^{" | cut -c1-600 >> $OUT/full_model.log \
    || echo "   (no row: $model $backend $* exited or timed out after ${limit}s)" >> $OUT/full_model.log
}
images() {  # limit pythonpath args...: one image-batch row, one process
  local limit=$1 pp=$2; shift 2
  stamp "images $*"
  PYTHONPATH=$pp timeout $limit python benchmarks/images.py --append --out $OUT/images.json "$@" 2>&1 | grep "^{" | cut -c1-500 >> $OUT/images.log \
    || echo "   (no row: $* exited or timed out after ${limit}s)" >> $OUT/images.log
}
for part in "$@"; do case "$part" in
TN)  # the GPU tests this session added (12B shapes, LSE entry points, image blocks)
  stamp "new gpu tests"
  timeout ${TESTS_S:-240} python -m pytest -m gpu -q -p no:cacheprovider --durations=8 tests/gpu \
    -k "lse or image or released_full_layer or unified or 12B" 2>&1 | tail -40 > $OUT/gpu-tests-new.log
  stamp "new gpu tests done"
  ;;
T)  # every GPU test
  stamp "gpu tests"
  timeout ${TESTS_S:-480} python -m pytest -m gpu -q -p no:cacheprovider --durations=12 tests/gpu 2>&1 | tail -60 > $OUT/gpu-tests.log
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
  ;;
I31)  # image batches on the 31B slice: 4 images of 280 tokens in 8k, moving every step; text-only for the ratio
  for b in sdpa-stock ffpa sdpa-dropin; do images 150 $PYTHONPATH --model 31b --backend $b; done
  for b in sdpa-stock ffpa; do images 150 $PYTHONPATH --model 31b --backend $b --text; done
  ;;
I12)  # the same on the 12B's shapes (gemma4_unified: full layers bidirectional in image blocks too)
  for b in sdpa-stock ffpa; do images 150 $PYTHONPATH --model 12b --backend $b; done
  for b in sdpa-stock ffpa; do images 150 $PYTHONPATH --model 12b --backend $b --text; done
  ;;
IF)  # the route before this session: sliding layers of image batches on FlexAttention
  images 200 $PYTHONPATH --model 31b --backend ffpa-flex
  ;;
B40)  # flash-attn-4 4.0.0b40 (what pip resolves today) against the bundle's b36: the sliding kernels, and the image slice
  for v in b36 b40; do
    if [ $v = b40 ]; then pp=$B40; else pp=$PYTHONPATH; fi
    stamp "kernel_map sliding fa4 $v"
    PYTHONPATH=$pp timeout 200 python benchmarks/kernel_map.py --layers sliding --kernels fa4 --models 31B 12B E4B \
      --seqs 8192 16384 --out $OUT/fa4_$v.json 2>&1 | grep "^{\|GEMM" >> $OUT/fa4_versions.log
  done
  images 150 $B40 --model 31b --backend ffpa
  ;;
F12)  # the 12B at full depth, 8k, LoRA, plain checkpointing, released vocab
  full 200 12b sdpa-stock --seq 8192 --steps 4
  full 150 12b ffpa --seq 8192 --steps 4
  full 150 12b floor --seq 8192 --steps 4
  ;;
IFD)  # image batches at full depth with pixels through the vision tower (LoRA, checkpointing, 8k, 4 images of 280 tokens)
  for b in sdpa-stock ffpa ffpa-flex floor; do
    images 200 $PYTHONPATH --model 31b --layers 60 --vocab 32768 --lora --ckpt --pixels --steps 5 --backend $b
  done
  images 150 $PYTHONPATH --model 31b --layers 60 --vocab 32768 --lora --ckpt --steps 5 --backend ffpa --text
  for b in sdpa-stock ffpa floor; do
    images 150 $PYTHONPATH --model e4b --layers 42 --vocab 262144 --lora --ckpt --pixels --steps 5 --backend $b
  done
  ;;
M)  # the kernel map (issue #36 item 1): every released shape, dense and varlen, fwd and bwd apart
  stamp "kernel map"
  timeout ${MAP_S:-540} python benchmarks/kernel_map.py --seqs ${MAP_SEQS:-2048 4096 8192 16384 32768} \
    --out $OUT/kernel_map.json 2>&1 | grep "^{\|GEMM" > $OUT/kernel_map.log
  ;;
esac; done
stamp "done"
