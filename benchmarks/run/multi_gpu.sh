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
for part in "$@"; do case "$part" in
US) train 300 8 --parallel ulysses --sp 8 --seq 32768 --steps 3 --backend sdpa-stock ;;
U)  train 570 ${SP:-8} --parallel ulysses --sp ${SP:-8} --seq ${SEQ:-65536} --steps ${STEPS:-30} --recipe ${RECIPE:-lora} ;;
UL) train 570 8 --parallel ulysses --sp 8 --seq 16384 --steps 30 --same-batch ;;
U1) train 570 1 --parallel none --seq 16384 --steps 30 --same-batch ;;
F)  train 570 8 --parallel fsdp2 --seq 8192 --steps 30 --recipe full --backend ${BACKEND:-ffpa} ;;
esac; done
