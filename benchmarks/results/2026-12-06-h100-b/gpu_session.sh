#!/usr/bin/env bash
# The driver of this folder's GPU runs: bash gpu_session.sh PART... with OUT set to a folder,
# from the repository root, on a GPU machine with ffpa-attn, flash-attn-4 and liger-kernel
# installed (.gpu/activate.sh, if present, puts them on the path).
set -u
[ -f .gpu/activate.sh ] && source .gpu/activate.sh
pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
export PYTHONPATH=$PWD:${PYTHONPATH:-}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $OUT/session.log; }
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv >> $OUT/session.log
trainer() {  # json backend precision [more trainer.py args]
  local json=$1 backend=$2 precision=$3; shift 3
  stamp "trainer $backend $precision $*"
  timeout 180 python benchmarks/trainer.py --backend $backend --precision $precision "$@" --out $OUT/$json.json --append 2>&1 \
    | grep -v "it/s\]\|s/it\]" | grep '^{' | cut -c1-600 >> $OUT/trainer.log
}
row() {  # seconds json e2e-args
  local limit=$1 json=$2; shift 2
  stamp "e2e $*"
  echo "== $*" >> $OUT/long_context.log
  timeout $limit python benchmarks/e2e.py --steps 3 --append --out $OUT/$json.json "$@" 2>&1 | grep "^{" | cut -c1-700 >> $OUT/long_context.log \
    || echo "   (no row: exit or timeout after ${limit}s)" >> $OUT/long_context.log
}
for part in "$@"; do case "$part" in
F)  # #14: the floors and the rows they bound, autocast + padding
  trainer floor sdpa-stock autocast --collator padding
  trainer floor no-attention autocast --collator padding
  trainer floor no-kernel autocast --collator padding
  trainer floor ffpa autocast --collator padding
  ;;
P)  # #14: where the shim's padded step goes, host and GPU
  trainer profile ffpa autocast --collator padding --steps 12 --profile-step 8
  trainer profile no-kernel autocast --collator padding --steps 12 --profile-step 8
  ;;
AB)  # #14: masks.analyse with one read-back against the previous seven (.gpu_base: the old package)
  for i in 1 2; do
    trainer ab ffpa autocast --collator padding
    stamp "baseline (.gpu_base)"
    (cd .gpu_base && timeout 180 python benchmarks/trainer.py --backend ffpa --precision autocast --collator padding \
      --out $OUT/ab_base.json --append 2>&1 | grep '^{' | cut -c1-300 >> $OUT/trainer.log)
  done
  trainer ab sdpa-stock autocast --collator padding
  ;;
LD)  # the Liger pair's gradient question: every comparison's three largest differences
  stamp "liger worker"
  for order in ffpa-first liger-first; do timeout 200 python tests/gpu/liger_worker.py $order cuda 2>/dev/null | tail -1 >> $OUT/liger_worker.jsonl; done
  ;;
GP)  # the gradient probe: q_proj gradients per layer against fp32
  stamp "grad probe"
  timeout 240 python tests/gpu/grad_probe.py --untempered 2>/dev/null >> $OUT/grad_probe.jsonl  # as run (before tiny.temper)
  timeout 240 python tests/gpu/grad_probe.py 2>/dev/null >> $OUT/grad_probe_tempered.jsonl  # not run yet
  ;;
L32P)
  row 120 long_context --seqs 32768 --ckpt selective --backends ffpa
  row 150 long_context --seqs 32768 --ckpt selective --backends sdpa-stock
  ;;
LT)
  stamp "liger gpu test"
  timeout 200 python -m pytest -m gpu -q -p no:cacheprovider -k liger -s 2>&1 | tail -30 > $OUT/gpu-tests-liger.log
  ;;
G)
  stamp "gpu tests"
  timeout ${TESTS_S:-330} python -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tail -40 > $OUT/gpu-tests.log
  ;;
L64)
  row 150 long_context --seqs 65536 --ckpt selective --backends ffpa
  row 220 long_context --seqs 65536 --ckpt selective --backends sdpa-stock
  ;;
L64X)  # 64k on an 80 GB card: without fragmentation (the rows above ran out of memory without it)
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True row 105 long_context_64k_expandable --seqs 65536 --ckpt selective --backends ffpa
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True row 175 long_context_64k_expandable --seqs 65536 --ckpt selective --backends sdpa-stock
  ;;
L128)
  row 200 long_context --seqs 131072 --ckpt selective --backends ffpa
  ;;
L32)
  row 120 liger --seqs 32768 --ckpt selective --backends ffpa --liger
  row 150 liger --seqs 32768 --ckpt selective --backends sdpa-stock --liger
  ;;
MX)
  row 120 long_context --seqs 32768 --ckpt selective --packed 8 --mixed --backends ffpa
  row 150 long_context --seqs 32768 --ckpt selective --packed 8 --mixed --backends sdpa-stock
  ;;
PL)
  row 120 long_context --seqs 32768 --ckpt plain --backends ffpa
  ;;
CMP)
  row 170 long_context --seqs 32768 --ckpt selective --compile --steps 5 --backends ffpa
  ;;
esac; done
stamp done
