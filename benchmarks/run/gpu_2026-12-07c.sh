#!/usr/bin/env bash
# The driver of benchmarks/results/2026-12-07-*-c's GPU runs: bash benchmarks/run/gpu_2026-12-07c.sh PART...
# with OUT set to a folder and COMMIT to the commit under test, from the repository root, on a GPU machine
# (.gpu/activate.sh puts ffpa-attn and flash-attn-4 4.0.0b36 on the path).
#   A   every GPU test (the catalog-built kernel table, the BSHD-contiguous dense inputs)
#   MD  the kernel map, dense rows: every released shape, 2k-32k, FFPA / flash-attn-4, stock SDPA to 8k
#   ML  the kernel map, packed rows: varlen against the same documents as a dense batch, 2k-32k
#   MS  the kernel map at the head counts one Ulysses rank sees (sp 2, 4, 8), 8k-32k, dense
#   A40 the GPU tests that run flash-attn-4, on 4.0.0b40 (what `pip install ffpa-patch[fa4]` resolves to today;
#       the bundle's is b36): its wheel in .whl-extra, carried beside .gpu
#   TK  the GPU tests of k and v sharing storage (ffpa-attn asserts on it), the first FFPA call of a process,
#       and the entries the copy guard touched (compile, LSE entries, image blocks)
#   IFD image batches at full depth with pixels through the vision tower (31B, LoRA, checkpointing, 8k,
#       4 images of 280 tokens), stock against "ffpa" (peft from .whl-extra)
#   BK  ffpa-attn's head_dim-512 backward split into its kernels (torch.profiler), 16k and 32k, 4 shapes
#   VP  ffpa-attn's varlen path: its per-call cu_seqlens checks off, and its dK/dV tile order flipped, against
#       the unchanged call and the dense batch (benchmarks/probes/ffpa_varlen_probe.py; run it last)
#   T   design M of docs/notes/d512-backward-design.md: a Triton head_dim-512 backward with P and dS in HBM,
#       against ffpa-attn's backward (benchmarks/probes/d512_bwd_triton.py; TSHAPES, TSWEEP=1 for tile configs)
#   C   cuDNN frontend 1.31's sm90 head_dim-512 forward against FFPA's, and FFPA's backward from its out/LSE
#       (needs .whl-cudnn, a trimmed extract of the wheel, carried beside .gpu)
set -u
[ -f .gpu/activate.sh ] && source .gpu/activate.sh
export PYTHONPATH=$PWD:${PYTHONPATH:-}
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $OUT/session.log; }
python -m benchmarks.manifest $OUT benchmarks/run/gpu_2026-12-07c.sh
map() {  # NAME TIMEOUT ARGS...: one kernel_map.py run, its rows as they come in $OUT/kernel_map_NAME.{json,log}
  local name=$1 limit=$2; shift 2
  stamp "kernel map $name"
  timeout $limit python benchmarks/kernel_map.py "$@" --out $OUT/kernel_map_$name.json 2>&1 | grep "^{\|GEMM\|Error" > $OUT/kernel_map_$name.log
  stamp "kernel map $name: $(grep -c '^{' $OUT/kernel_map_$name.log) rows, $(grep -c "'error'" $OUT/kernel_map_$name.log) errors"
}
images() {  # limit args...: one image-batch row, one process
  local limit=$1; shift
  stamp "images $*"
  timeout $limit python benchmarks/images.py --append --out $OUT/images.json "$@" 2>&1 | grep "^{" | cut -c1-600 >> $OUT/images.log \
    || echo "   (no row: $* exited or timed out after ${limit}s)" >> $OUT/images.log
}
for part in "$@"; do case "$part" in
TK)
  stamp "gpu tests: shared k/v storage, first call, the guarded entries"
  timeout ${TESTS_S:-150} python -m pytest -m gpu -q -p no:cacheprovider --durations=5 tests/gpu \
    -k "share_storage or first_call or compiles_fullgraph or lse_entry or image_blocks_on" 2>&1 | tail -30 > $OUT/gpu-tests-kv.log
  stamp "done: $(tail -1 $OUT/gpu-tests-kv.log)"
  ;;
BK)
  stamp "ffpa backward kernels"
  timeout ${BK_S:-150} python benchmarks/probes/ffpa_bwd_kernels_probe.py --out $OUT/ffpa_bwd_kernels.json > $OUT/ffpa_bwd_kernels.log 2>&1
  stamp "backward kernels done: $(grep -c '^{' $OUT/ffpa_bwd_kernels.log) rows"
  ;;
T)
  stamp "triton d512 backward"
  timeout ${T_S:-420} python benchmarks/probes/d512_bwd_triton.py --out $OUT/d512_bwd_triton.json \
    ${TSWEEP:+--sweep} ${TSHAPES:+--shapes $TSHAPES} > $OUT/d512_bwd_triton.log 2>&1
  stamp "triton backward done: $(grep -c '^{' $OUT/d512_bwd_triton.log) rows; $(tail -1 $OUT/d512_bwd_triton.log | cut -c1-200)"
  ;;
VP)
  stamp "ffpa varlen probe"
  timeout ${VP_S:-240} python benchmarks/probes/ffpa_varlen_probe.py --out $OUT/ffpa_varlen_probe.json > $OUT/ffpa_varlen_probe.log 2>&1
  stamp "varlen probe done: $(grep -c '^{' $OUT/ffpa_varlen_probe.log) rows"
  ;;
IFD)
  [ -d /tmp/extra ] || python3 -m pip install -q --no-deps --target /tmp/extra .whl-extra/peft-*.whl > /dev/null 2>&1
  for b in ${IMAGE_BACKENDS:-ffpa sdpa-stock}; do
    PYTHONPATH=/tmp/extra:$PYTHONPATH images ${IMAGE_S:-170} --model 31b --layers 60 --vocab 32768 --lora --ckpt --pixels --steps 5 --backend $b
  done
  ;;
A)
  stamp "all gpu tests"
  timeout ${TESTS_S:-420} python -m pytest -m gpu -q -p no:cacheprovider --durations=12 tests/gpu 2>&1 | tail -60 > $OUT/gpu-tests-all.log
  stamp "done: $(tail -1 $OUT/gpu-tests-all.log)"
  ;;
A40)
  stamp "flash-attn-4 b40 gpu tests"
  rm -rf /tmp/fa4-b40 && python3 -m zipfile -e .whl-extra/flash_attn_4-4.0.0b40-py3-none-any.whl /tmp/fa4-b40
  PYTHONPATH=/tmp/fa4-b40:$PYTHONPATH python -c "import importlib.metadata as m, flash_attn.cute as f; print('flash-attn-4', m.version('flash-attn-4'), f.__file__)" > $OUT/gpu-tests-fa4-b40.log 2>&1
  PYTHONPATH=/tmp/fa4-b40:$PYTHONPATH timeout ${TESTS_S:-240} python -m pytest -m gpu -q -p no:cacheprovider --durations=5 tests/gpu \
    -k "fa4 or tiny_gemma4_on_real or image_blocks or autocast or vision" 2>&1 | tail -30 >> $OUT/gpu-tests-fa4-b40.log
  stamp "done: $(tail -1 $OUT/gpu-tests-fa4-b40.log)"
  ;;
MD) map dense ${MAP_S:-300} --layouts dense --sdpa-max 8192 --seqs 2048 4096 8192 16384 32768 ;;
ML) map packed ${MAP_S:-300} --layouts varlen batched --kernels ffpa fa4 --seqs 2048 4096 8192 16384 32768 ;;
MS) map sp ${MAP_S:-200} --layouts dense --kernels ffpa fa4 --sp 2 4 8 --models 31B 26B-A4B 12B --seqs 8192 16384 32768 ;;
C)
  stamp "cudnn sm90 d512 forward"
  PYTHONPATH=$PWD/.whl-cudnn:$PYTHONPATH timeout ${CUDNN_S:-240} python benchmarks/probes/cudnn_d512_forward.py \
    --out $OUT/cudnn_d512_forward.json > $OUT/cudnn_d512_forward.log 2>&1
  stamp "cudnn done: $(tail -2 $OUT/cudnn_d512_forward.log | tr '\n' ' ' | cut -c1-300)"
  ;;
esac; done
