#!/usr/bin/env bash
# The driver of benchmarks/results/2026-12-08-*'s GPU runs: bash benchmarks/run/gpu_2026-12-08.sh PART...
# with OUT set to a folder and COMMIT to the commit under test, from the repository root, on a GPU machine
# (.gpu/activate.sh puts ffpa-attn and flash-attn-4 on the path; peft comes from .whl-extra).
#   T   ffpa_patch's Triton head_dim-512 backward against ffpa-attn's (benchmarks/probes/d512_bwd_triton.py):
#       a tile-order / tile-size sweep at 31B 8k, then the released shapes 4k-32k and one sp-8 Ulysses rank at 64k/128k
#   TP  the Triton backward's packed (varlen) mode against ffpa-attn's varlen backward (the same probe, packed rows)
#   TT  the GPU tests of the FFPA kernel, now with the Triton backward as its default on sm90
#   TA  every GPU test (packed batches now run ffpa_patch's FFPAVarlen in place of ffpa_attn_varlen_func)
#   F8  item 5 of issue #40 at 8k: the 31B at full depth (LoRA, checkpointing), ffpa_patch with
#       FFPA_PATCH_D512_BACKWARD=ffpa-attn (before) and triton (after), one process each
#   F16 the same at 16k; F12 the 12B at 8k (one 10-minute call each, with F8 if time allows)
set -u
[ -f .gpu/activate.sh ] && source .gpu/activate.sh
export PYTHONPATH=$PWD:${PYTHONPATH:-}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $OUT/session.log; }
python -m benchmarks.manifest $OUT benchmarks/run/gpu_2026-12-08.sh
full() {  # limit model seq backward args...: one full-depth row, one process
  local limit=$1 model=$2 seq=$3 bwd=$4; shift 4
  stamp "full_model $model $seq backward=$bwd $*"
  FFPA_PATCH_D512_BACKWARD=$bwd PYTHONPATH=/tmp/extra:$PYTHONPATH PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    timeout $limit python benchmarks/full_model.py --model $model --seq $seq --backend ffpa --append \
    --out $OUT/full_model_d512_$bwd.json "$@" 2>&1 | grep "^{" | cut -c1-600 >> $OUT/full_model.log \
    || echo "   (no row: $model $seq $bwd $* exited or timed out after ${limit}s)" >> $OUT/full_model.log
}
for part in "$@"; do case "$part" in
T)
  stamp "triton d512 backward"
  timeout ${T_S:-150} python benchmarks/probes/d512_bwd_triton.py --out $OUT/d512_bwd_triton.json --sweep \
    --budget-s $(( ${T_S:-150} - 30 )) > $OUT/d512_bwd_triton.log 2>&1
  stamp "triton backward done: $(grep -c '^{' $OUT/d512_bwd_triton.log) rows"
  ;;
TP)
  stamp "triton d512 backward, packed"
  timeout ${T_S:-150} python benchmarks/probes/d512_bwd_triton.py --out $OUT/d512_bwd_triton_packed.json \
    --shapes 31B:16384:docs2048 31B:16384:docs512 26B-A4B:8192:docs1024 31B:8192:docs8192 \
    --budget-s $(( ${T_S:-150} - 30 )) > $OUT/d512_bwd_triton_packed.log 2>&1
  stamp "packed rows: $(grep -c '^{' $OUT/d512_bwd_triton_packed.log)"
  ;;
TT)
  stamp "gpu tests of the FFPA kernel"
  timeout ${TESTS_S:-200} python -m pytest -m gpu -q -p no:cacheprovider --durations=8 tests/gpu \
    -k "triton_d512 or d512_backward or released_full_layer or bitwise_repeatable_at or share_storage or first_call or compiles_fullgraph or lse_entry or low_copy or ulysses_rank or image_blocks_on" \
    2>&1 | tail -40 > $OUT/gpu-tests-d512.log
  stamp "done: $(tail -1 $OUT/gpu-tests-d512.log)"
  ;;
TA|TA1|TA2)  # every GPU test; TA1 / TA2: the FFPA kernel's (changed 2026-12-08) / the rest, when one call is too short
  sel=""; [ "$part" = TA1 ] && sel="ffpa or d512 or varlen or packed or doctor or lse_entry or first_call or share_storage"
  [ "$part" = TA2 ] && sel="not (ffpa or d512 or varlen or packed or doctor or lse_entry or first_call or share_storage)"
  stamp "gpu tests $part"
  timeout ${TESTS_S:-540} python -m pytest -m gpu -q -p no:cacheprovider --durations=12 tests/gpu ${sel:+-k "$sel"} \
    2>&1 | tail -60 > $OUT/gpu-tests-$part.log
  stamp "done: $(tail -1 $OUT/gpu-tests-$part.log)"
  ;;
F8)
  [ -d /tmp/extra ] || python3 -m pip install -q --no-deps --target /tmp/extra .whl-extra/peft-*.whl > /dev/null 2>&1
  for bwd in ${F_BACKWARDS:-ffpa-attn triton}; do
    full ${F_S:-140} 31b 8192 $bwd --vocab 32768 --recipe lora --ckpt plain --steps 4
  done
  ;;
F16)
  [ -d /tmp/extra ] || python3 -m pip install -q --no-deps --target /tmp/extra .whl-extra/peft-*.whl > /dev/null 2>&1
  for bwd in ${F_BACKWARDS:-ffpa-attn triton}; do
    full ${F_S:-240} 31b 16384 $bwd --vocab 32768 --recipe lora --ckpt plain --steps 4
  done
  ;;
F12)
  [ -d /tmp/extra ] || python3 -m pip install -q --no-deps --target /tmp/extra .whl-extra/peft-*.whl > /dev/null 2>&1
  for bwd in ${F_BACKWARDS:-ffpa-attn triton}; do
    full ${F_S:-150} 12b 8192 $bwd --recipe lora --ckpt plain --steps 4
  done
  ;;
esac; done
