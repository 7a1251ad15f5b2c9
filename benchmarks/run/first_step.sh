#!/usr/bin/env bash
# First step of a first and a second process (Trainer, ffpa, autocast, packing), with the
# kernel disk cache starting empty:  bash benchmarks/run/first_step.sh OUT_DIR
set -u
out=${1:?OUT_DIR}
export FFPA_PATCH_KERNEL_CACHE=$out/kernel-cache-first-step
rm -rf "$FFPA_PATCH_KERNEL_CACHE"
for n in first second; do
  echo "== $n process" | tee -a "$out/first_step.log"
  timeout 300 python benchmarks/trainer.py --backend ffpa --precision autocast --collator packing --steps 10 \
    --out "$out/first_step.json" --append 2>&1 | grep '^{' >> "$out/first_step.log"
done
du -sh "$FFPA_PATCH_KERNEL_CACHE" >> "$out/first_step.log"; find "$FFPA_PATCH_KERNEL_CACHE" -name '*.o' | wc -l >> "$out/first_step.log"
rm -rf "$FFPA_PATCH_KERNEL_CACHE"
