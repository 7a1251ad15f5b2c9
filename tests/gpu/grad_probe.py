"""Per-layer q_proj gradient error against the fp32 eager model, for stock SDPA, eager and
the shim (flash-attn-4 or FlexAttention sliding layers), in bf16: the liger worker's setup
(tiny dense31b, head_dim 256, hidden 256, two rows of 1024 random tokens, the LM loss).
python tests/gpu/grad_probe.py [--untempered]  (one JSON line per setting; --untempered:
q_norm/k_norm left at weight 1, as in benchmarks/results/gpu_2026-12-06b/h100_c/grad_probe.jsonl)"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import ffpa_patch  # noqa: E402
import tiny  # noqa: E402
from ffpa_patch.kernels import use  # noqa: E402
from ffpa_patch.kernels import cute  # noqa: E402
from liger_worker import errors, step  # noqa: E402  (the same step and yardstick as the Liger test)


def main():
    tempered = "--untempered" not in sys.argv
    for seq, window in ((512, 8), (1024, 8), (1024, 128)):
        torch.manual_seed(0)
        ids = torch.randint(0, 128, (2, seq), device="cuda")
        cfg = dict(head_dim=256, hidden_size=256, sliding_window=window)
        ffpa_patch.revert()
        ref = tiny.causal_lm("dense31b", attn="eager", tempered=tempered, **cfg).cuda()
        ref_loss, _, want = step(ref, ids)
        rows = {}
        for name, attn, kernels in (("sdpa", "sdpa", None), ("eager", "eager", None), ("ffpa+fa4", "ffpa", True),
                                    ("ffpa+flex", "ffpa", False)):  # kernels: flash-attn-4 for sliding layers
            if attn == "ffpa":
                ffpa_patch.apply()
            else:
                ffpa_patch.revert()
            model = tiny.causal_lm("dense31b", attn=attn, tempered=tempered, **cfg).to("cuda", torch.bfloat16)
            model.load_state_dict(ref.state_dict())
            with use(cute.kernel_set(fa4=kernels is not False)):
                loss, _, got = step(model, ids)
            rows[name] = {"loss": round(loss, 4), "q_proj_rel_err": errors(got, want),
                          "q_proj_norm": [round(float(g.norm()), 3) for g in got]}
        print(json.dumps({"seq": seq, "window": window, "tempered": tempered, "fp32_loss": round(ref_loss, 4),
                          "fp32_q_proj_norm": [round(float(w.norm()), 3) for w in want], **rows}), flush=True)


if __name__ == "__main__":
    main()
