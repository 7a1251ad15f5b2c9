#!/usr/bin/env bash
# The multi-GPU runs (issue: multi-GPU runs), for a host with 8 GPUs: bash benchmarks/run/multi_gpu.sh PART...
# with OUT set to a folder and COMMIT to the commit under test, from the repository root. Not yet run: no
# multi-GPU machine has been lent. Every rank goes through `ffpa-patch run`, as the README tells users.
# Needs, beside .gpu (ffpa-attn, flash-attn-4): DeepSpeed 0.19.x, accelerate >= 1.16 and peft in .whl-extra
#   pip download --no-deps deepspeed==0.19.8 accelerate==1.16.0 peft==0.21.2 -d .whl-extra   (carry .whl-extra)
# Each part appends rows to $OUT/trainer_parallel.json (benchmarks/trainer_parallel.py: tokens/s/GPU, peak
# memory of every rank, every step's loss and time, the routes taken).
# One run per part, so that each fits one 10-minute device call (settings from the environment):
#   US  stock DeepSpeed + SDPA on Gemma 4 under Ulysses (its registration fails: the row records the error)
#   U   one Ulysses SP run: SP (8) ranks, SEQ (65536) tokens, STEPS (30), RECIPE (lora; full = ZeRO-3).
#       The headline: SEQ 32768, 65536, 131072 at SP 8, and 32768, 65536 at SP 4 (131072 at 30 steps may
#       need STEPS=15: ~19 s a step projected)
#   UL  the loss comparison: the 30-step loss of one packed 16k sequence at SP 8 (same weights and batch)
#   U1  its one-GPU reference (--parallel none)
#   F   one FSDP2 + checkpointing run on 8 GPUs, 31B full fine-tuning at 8k: BACKEND (ffpa, or sdpa-stock)
#   N6 / N6P / N7P  NeMo-Automodel's Gemma4 26B-A4B under its own ring CP (benchmarks/nemo_ring_cp.py, CP ranks,
#       NSEQ tokens): 0.6.0 without ffpa_patch, 0.6.0 with it, 0.7.0 with it (the patch: "not needed"). Each
#       NeMo goes into its own folder with the Transformers it pins, from .whl-nemo (carry it):
#         pip download --no-deps nemo-automodel==0.6.0 nemo-automodel==0.7.0 transformers==5.12.1 transformers==5.18.0 -d .whl-nemo
#       NeMo's other dependencies must be in the GPU image (the driver logs what fails to import)
set -u
[ -f .gpu/activate.sh ] && source .gpu/activate.sh
if [ ! -d /tmp/extra ] && ls .whl-extra/*.whl .whl-extra/*.tar.gz > /dev/null 2>&1; then
  DS_BUILD_OPS=0 python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/extra .whl-extra/* > $OUT/pip.log 2>&1
fi
command -v ffpa-patch > /dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . >> $OUT/pip.log 2>&1
export PYTHONPATH=/tmp/extra:$PWD:${PYTHONPATH:-} PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True DS_BUILD_OPS=0
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*" | tee -a $OUT/session.log; }
python -m benchmarks.manifest $OUT benchmarks/run/multi_gpu.sh
train() {  # LIMIT NPROC ARGS...: one trainer_parallel.py run over NPROC ranks
  local limit=$1 n=$2; shift 2
  stamp "trainer_parallel $n ranks: $*"
  if [ "$n" = 1 ]; then launch="python"; else launch="python -m torch.distributed.run --standalone --nproc-per-node $n"; fi
  timeout $limit ffpa-patch run -- $launch benchmarks/trainer_parallel.py --model 31b --vocab 32768 --out $OUT/trainer_parallel.json "$@" \
    > $OUT/last_run.log 2>&1 || echo "   exited $? (tail: $(tail -3 $OUT/last_run.log | tr '\n' ' ' | cut -c1-300))" | tee -a $OUT/session.log
}
nemo() {  # VERSION TRANSFORMERS PATCHED LABEL: one nemo_ring_cp.py run over CP ranks
  local ver=$1 tf=$2 patched=$3 label=$4 dir=/tmp/nemo-$1
  [ -d $dir ] || python3 -m pip install -q --no-deps --target $dir .whl-nemo/nemo_automodel-$ver-*.whl \
    .whl-nemo/transformers-$tf-*.whl >> $OUT/pip.log 2>&1
  [ -d /tmp/g26b ] || PYTHONPATH=$dir:$PYTHONPATH python benchmarks/nemo_ring_cp.py --write-config /tmp/g26b ${NLAYERS:+--layers $NLAYERS}
  local cp=${CP:-2} launch="python -m torch.distributed.run --standalone --nproc-per-node ${CP:-2}"
  [ "$patched" = 1 ] && launch="ffpa-patch run -- $launch"
  stamp "nemo $ver patched=$patched cp=$cp seq=${NSEQ:-16384}"
  PYTHONPATH=$dir:$PYTHONPATH timeout 570 $launch benchmarks/nemo_ring_cp.py --label $label --out $OUT/nemo_ring_cp.json \
    --config benchmarks/nemo_ring_cp.yaml --model.config.pretrained_model_name_or_path /tmp/g26b \
    --distributed.cp_size $cp --dataset.seq_len ${NSEQ:-16384} --benchmark.json_output_path $OUT/nemo_summary_$label.json \
    > $OUT/nemo_$label.log 2>&1 || echo "   exited $? (tail: $(tail -3 $OUT/nemo_$label.log | tr '\n' ' ' | cut -c1-300))" | tee -a $OUT/session.log
}
for part in "$@"; do case "$part" in
US) train 300 8 --parallel ulysses --sp 8 --seq 32768 --steps 3 --backend sdpa-stock ;;
U)  train 570 ${SP:-8} --parallel ulysses --sp ${SP:-8} --seq ${SEQ:-65536} --steps ${STEPS:-30} --recipe ${RECIPE:-lora} ;;
UL) train 570 8 --parallel ulysses --sp 8 --seq 16384 --steps 30 --same-batch ;;
U1) train 570 1 --parallel none --seq 16384 --steps 30 --same-batch ;;
N6)  FFPA_PATCH_DISABLE=1 nemo 0.6.0 5.12.1 0 nemo0.6-stock ;;
N6P) nemo 0.6.0 5.12.1 1 nemo0.6-ffpa_patch ;;
N7P) nemo 0.7.0 5.18.0 1 nemo0.7-ffpa_patch ;;
F)  train 570 8 --parallel fsdp2 --seq 8192 --steps 30 --recipe full --backend ${BACKEND:-ffpa} ;;
esac; done
