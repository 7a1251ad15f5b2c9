#!/usr/bin/env bash
# The Trainer recipes of benchmarks/results/trainer.json, one process each, on one GPU.
#   bash benchmarks/run/trainer_matrix.sh OUT_DIR [stock|shim|all]
# flash-attn-4's kernel disk cache starts empty (OUT_DIR/kernel-cache), so the first shim
# process compiles everything and the ones after it show a second process's first step.
set -u
out=${1:?OUT_DIR}; part=${2:-all}
mkdir -p "$out"
export FFPA_PATCH_KERNEL_CACHE=${FFPA_PATCH_KERNEL_CACHE:-$out/kernel-cache}
one() {  # backend precision collator [sliding]
  echo "== $*" | tee -a "$out/trainer.log"
  timeout 300 python benchmarks/trainer.py --backend "$1" --precision "$2" --collator "$3" --sliding "${4:-fa4}" \
    --out "$out/trainer.json" --append 2>&1 | grep -v "it/s\]\|s/it\]" | tail -n 4 >> "$out/trainer.log"
}
if [ "$part" != shim ]; then
  for p in autocast bf16; do for c in packing padding; do one sdpa-stock $p $c; done; done
fi
if [ "$part" != stock ]; then
  one ffpa autocast packing          # empty kernel cache: the JIT of every kernel
  one ffpa autocast packing          # second process: flash-attn-4's kernels from disk
  one ffpa bf16 packing
  one ffpa autocast padding
  one ffpa bf16 padding
  one sdpa-dropin autocast packing
  one sdpa-dropin bf16 padding
  one ffpa autocast packing flex     # FlexAttention sliding layers: compiles over 30 lengths
fi
