#!/usr/bin/env bash
# The driver of this folder's GPU runs (#17's remaining rows, and the GPU tests with the tempered
# tiny models): bash gpu_session.sh PART... with OUT set to a folder, from the repository root,
# on a GPU machine with ffpa-attn, flash-attn-4 and liger-kernel installed (.gpu/activate.sh,
# if present, puts them on the path). Long rows run with expandable_segments, as the README
# recommends for long context (without it 64k ran out of memory on an 80 GB card from fragmentation).
set -u
[ -f .gpu/activate.sh ] && source .gpu/activate.sh
pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
export PYTHONPATH=$PWD:${PYTHONPATH:-}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $OUT/session.log; }
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv >> $OUT/session.log
row() {  # seconds json e2e-args
  local limit=$1 json=$2; shift 2
  stamp "e2e $*"
  echo "== $*" >> $OUT/long_context.log
  timeout $limit python benchmarks/e2e.py --append --out $OUT/$json.json "$@" 2>&1 | grep "^{" | cut -c1-700 >> $OUT/long_context.log \
    || echo "   (no row: exit or timeout after ${limit}s)" >> $OUT/long_context.log
}
xrow() { PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True row "$@"; }
for part in "$@"; do case "$part" in
G)  # every GPU test, with tests/tiny.py's tempered models
  stamp "gpu tests"
  timeout ${TESTS_S:-300} python -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tail -40 > $OUT/gpu-tests.log
  ;;
GPT)  # q_proj gradients per layer against fp32, tempered models
  stamp "grad probe"
  timeout 150 python tests/gpu/grad_probe.py 2>/dev/null >> $OUT/grad_probe_tempered.jsonl
  ;;
X128L)  # 128k on an 80 GB card: Liger's fused loss and GEGLU keep the activations that would not fit
  xrow 270 long --steps 3 --seqs 131072 --ckpt selective --backends ffpa --liger
  ;;
X128)
  xrow 270 long --steps 3 --seqs 131072 --ckpt selective --backends ffpa
  ;;
X64L)
  xrow 100 long --steps 3 --seqs 65536 --ckpt selective --backends ffpa --liger
  xrow 150 long --steps 2 --seqs 65536 --ckpt selective --backends sdpa-stock --liger
  ;;
X64)
  xrow 100 long --steps 3 --seqs 65536 --ckpt selective --backends ffpa
  xrow 150 long --steps 2 --seqs 65536 --ckpt selective --backends sdpa-stock
  ;;
X48)  # the longest length eager stock fits on an 80 GB card (32k fits, 64k does not)
  xrow 120 long --steps 2 --seqs 49152 --ckpt selective --backends sdpa-stock
  ;;
S32)
  row 90 long --steps 3 --seqs 32768 --ckpt selective --backends sdpa-stock
  ;;
F32)  # the eager row that the compiled one compares with, on the same machine
  row 90 long --steps 3 --seqs 32768 --ckpt selective --backends ffpa
  ;;
F64)
  xrow 100 long --steps 3 --seqs 65536 --ckpt selective --backends ffpa
  ;;
CMP)  # compiled: per-step times are in the JSON, the median skips the first step
  row 180 long --steps 5 --seqs 32768 --ckpt selective --compile --backends ffpa
  ;;
C8)  # 8k without checkpointing: eager stock, the shim + Liger eager, and compiled
  row 60 short --steps 3 --seqs 8192 --backends sdpa-stock
  row 60 short --steps 3 --seqs 8192 --backends ffpa --liger
  row 170 short --steps 6 --seqs 8192 --compile --backends ffpa --liger
  ;;
TR)  # Trainer on the slice: 4 packed documents of 2k-16k tokens a step (~36k), selective checkpointing
  for b in sdpa-stock ffpa; do
    stamp "trainer $b"
    timeout 150 python benchmarks/trainer.py --model slice31b --backend $b --precision bf16 --collator packing \
      --doc-len 2048 16384 --per-step 4 --ckpt selective --steps 5 --out $OUT/trainer_long.json --append 2>&1 \
      | grep '^{' | cut -c1-600 >> $OUT/trainer.log
  done
  ;;
LCP)  # Liger's fused linear cross entropy, eager and compiled, against torch (no model, no ffpa_patch)
  stamp "liger compile probe"
  timeout 120 python benchmarks/liger_compile_probe.py --out $OUT/liger_compile_probe.json 2>&1 | grep '^{' >> $OUT/long_context.log
  row 170 short --steps 6 --seqs 8192 --compile --backends sdpa-stock --liger
  ;;
CMPS)  # compiled 32k with Dynamo told not to replay the layers' side effects under checkpointing
  row 150 long --steps 5 --seqs 32768 --ckpt selective --compile --skip-ckpt-side-effects --backends ffpa
  ;;
esac; done
stamp done
