"""torch.compile over a patched model (Dynamo with the "eager" backend on CPU; inductor is a gpu test).

Reading a mask's structure is data-dependent, so inside a graph sliding layers take
FlexAttention with the mask as given and masked full layers are routed in an eager
region: the only graph breaks ffpa_patch may cause, one per masked full layer.
"""
import torch

import tiny
from ffpa_patch.routing import stats


def _inputs(kind):
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    kw = {}
    if kind == "left_pad":
        mask = torch.ones(2, 24, dtype=torch.long)
        mask[0, :6] = 0
        kw["attention_mask"] = mask
    return ids, kw


def test_compiled_model_matches_eager_and_breaks_only_at_masked_full_layers(patched, reference_kernels):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = tiny.causal_lm("dense31b", attn="ffpa")
    ids, kw = _inputs("left_pad")
    ref = model(ids, **kw).logits
    stats.reset()
    out = torch.compile(model, backend="eager")(ids, **kw).logits
    valid = kw["attention_mask"].bool()
    torch.testing.assert_close(out[valid], ref[valid], atol=5e-5, rtol=1e-4)
    # stock Gemma4 compiles without breaks; each break here is ffpa_patch's eager region
    reasons = list(counters["graph_break"])
    assert reasons and all("_route_eagerly" in r for r in reasons), reasons
    # inside the graph nothing is counted; the eager region of the full layer counts itself
    assert stats.total("full", "ffpa") == 1 and stats.total("sliding", "fa4") == 0
