#!/usr/bin/env bash
# The driver of this folder's two H100 runs: bash gpu_session.sh T L8 G, then T2 and
# python benchmarks/e2e.py --steps 4 --out $OUT/compile8k.json --seqs 8192 --compile --backends ffpa
# Run from the repository root with OUT set to a folder, on a GPU machine with ffpa-attn,
# flash-attn-4 and liger-kernel installed (.gpu/activate.sh, if present, puts them on the path).
set -u
[ -f .gpu/activate.sh ] && source .gpu/activate.sh
pip install -q --no-deps --no-build-isolation -e . > /tmp/install.log 2>&1 || cat /tmp/install.log
export PYTHONPATH=$PWD:$PYTHONPATH
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $OUT/session.log; }
nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv >> $OUT/session.log
trainer() {  # backend precision collator
  stamp "trainer $*"
  timeout 150 python benchmarks/trainer.py --backend $1 --precision $2 --collator $3 --out $OUT/trainer.json --append 2>&1 \
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
T)
  trainer sdpa-stock autocast padding
  trainer ffpa autocast padding
  trainer no-attention autocast padding
  trainer no-attention autocast packing
  ;;
T2)
  trainer ffpa autocast padding
  trainer sdpa-stock autocast padding
  ;;
L8)
  for b in sdpa-stock ffpa; do
    row 80 liger --seqs 8192 --backends $b
    row 80 liger --seqs 8192 --backends $b --liger
  done
  ;;
LCF)
  row 150 long_context --seqs 65536 --ckpt selective --backends ffpa
  row 200 long_context --seqs 131072 --ckpt selective --backends ffpa
  ;;
LCS)
  row 220 long_context --seqs 65536 --ckpt selective --backends sdpa-stock
  ;;
G)
  stamp "gpu tests"
  timeout ${TESTS_S:-330} python -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tail -40 > $OUT/gpu-tests.log
  ;;
L32)
  row 120 liger --seqs 32768 --ckpt selective --backends ffpa --liger
  row 150 liger --seqs 32768 --ckpt selective --backends sdpa-stock --liger
  ;;
MX)
  row 120 long_context --seqs 32768 --ckpt selective --packed 8 --mixed --backends ffpa
  row 150 long_context --seqs 32768 --ckpt selective --packed 8 --mixed --backends sdpa-stock
  ;;
CMP)
  row 170 long_context --seqs 32768 --ckpt selective --compile --backends ffpa
  ;;
esac; done
stamp done
