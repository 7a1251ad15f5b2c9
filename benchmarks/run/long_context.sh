#!/usr/bin/env bash
# Long-context training steps of the 6-layer 31B-shaped slice (benchmarks/e2e.py), one
# process per row, appended to OUT_DIR/long_context.json; a row that runs out of memory or
# time is recorded as such.   bash benchmarks/run/long_context.sh OUT_DIR [a|b|all]
#   a: 32k and 64k, selective checkpointing, stock sdpa and "ffpa" (a32 / a64: one length)
#   b: 128k "ffpa" (and stock), compiled "ffpa", plain checkpointing, mixed-length packing
#   trainer: Trainer on the slice, 4 packed documents of 2k-16k tokens a step (~36k), selective checkpointing
#   liger: 8k and 32k with liger-kernel's Gemma4 patches, against each alone (liger.json)
set -u
out=${1:?OUT_DIR}; part=${2:-all}
mkdir -p "$out"
row() {  # seconds, then e2e.py arguments
  local limit=$1; shift
  echo "== $*" | tee -a "$out/long_context.log"
  timeout "$limit" python benchmarks/e2e.py --steps 3 --append --out "$out/${json:-long_context}.json" "$@" 2>&1 \
    | grep "^{" >> "$out/long_context.log" || echo "   (no row: exit or timeout after ${limit}s)" >> "$out/long_context.log"
}
lengths="32768 65536"; [ "$part" = a32 ] && lengths=32768; [ "$part" = a64 ] && lengths=65536
if [ "$part" != b ]; then
  for s in $lengths; do
    row 150 --seqs $s --ckpt selective --backends ffpa
    row 200 --seqs $s --ckpt selective --backends sdpa-stock
  done
fi
if [ "$part" = b ] || [ "$part" = all ]; then
  row 200 --seqs 131072 --ckpt selective --backends ffpa
  row 150 --seqs 32768 --ckpt selective --compile --backends ffpa
  row 150 --seqs 32768 --ckpt plain --backends ffpa
  row 150 --seqs 32768 --ckpt selective --packed 8 --mixed --backends ffpa
  row 150 --seqs 32768 --ckpt selective --packed 8 --mixed --backends sdpa-stock
  row 240 --seqs 131072 --ckpt selective --backends sdpa-stock
fi
if [ "$part" = liger ] || [ "$part" = all ]; then
  json=liger
  for b in sdpa-stock ffpa; do
    row 120 --seqs 8192 --backends $b
    row 120 --seqs 8192 --backends $b --liger
  done
  row 150 --seqs 32768 --ckpt selective --backends ffpa --liger
  row 200 --seqs 32768 --ckpt selective --backends sdpa-stock --liger
fi
if [ "$part" = trainer ] || [ "$part" = all ]; then
  for b in sdpa-stock ffpa; do
    echo "== trainer $b" | tee -a "$out/long_context.log"
    timeout 300 python benchmarks/trainer.py --model slice31b --backend $b --precision bf16 --collator packing \
      --doc-len 2048 16384 --per-step 4 --ckpt selective --steps 6 --out "$out/trainer_long.json" --append 2>&1 \
      | grep '^{' >> "$out/long_context.log"
  done
fi
