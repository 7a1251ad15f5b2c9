"""Import / apply / revert orders, each in a fresh interpreter, checking the real targets."""
import itertools
import json

import pytest

from conftest import run_python

PROBE = """
import json, sys
def probe():
    out = {}
    if "transformers.modeling_utils" in sys.modules:
        from transformers.modeling_utils import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
        from transformers.integrations import sdpa_attention
        out["ffpa_registered"] = "ffpa" in AttentionInterface._global_mapping and "ffpa" in AttentionMaskInterface._global_mapping
        entry = AttentionInterface._global_mapping["sdpa"]
        from ffpa_patch import wrapping
        while wrapping._ours.get(id(entry), (None, None))[1] == "gemma4_dropin":  # the drop-in wraps only the entry
            entry = entry.__wrapped__
        out["sdpa_entry_wrapped"] = entry is not sdpa_attention.sdpa_attention_forward.__wrapped__ if hasattr(sdpa_attention.sdpa_attention_forward, "__wrapped__") else False
        attr = sdpa_attention.sdpa_attention_forward
        # both stock, or both ours around the same original (the registry's is a plain function)
        out["sdpa_entry_is_module_attr"] = entry is attr or (
            hasattr(attr, "__wrapped__") and getattr(entry, "__wrapped__", None) is attr.__wrapped__)
        out["sdpa_module_wrapped"] = hasattr(sdpa_attention.sdpa_attention_forward, "__wrapped__")
    g = sys.modules.get("transformers.models.gemma4.modeling_gemma4")
    if g is not None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        from ffpa_patch.wrapping import live_in_chain
        # what Gemma 4 calls: the shared table's "sdpa", with the drop-in switched on inside it (once)
        assert g.ALL_ATTENTION_FUNCTIONS is ALL_ATTENTION_FUNCTIONS
        out["gemma4_dropin_depth"] = live_in_chain(ALL_ATTENTION_FUNCTIONS["sdpa"], "gemma4_dropin")
        out["gemma4_dropin"] = out["gemma4_dropin_depth"] > 0
    return out
"""

STEPS = {
    "import": "import ffpa_patch",
    "gemma4": "import transformers.models.gemma4.modeling_gemma4",
    "apply": "import ffpa_patch; ffpa_patch.apply()",
    "revert": "import ffpa_patch; ffpa_patch.revert()",
}


def run(steps, env=None):
    code = PROBE + "\n".join(STEPS[s] for s in steps) + "\nprint(json.dumps(probe()))"
    return json.loads(run_python(code, env).strip().splitlines()[-1])


def bug_present():
    out = run_python(PROBE + "import ffpa_patch.patches.sdpa_repeat_kv as p\nfrom transformers.integrations import sdpa_attention\nprint(p._bug_present(sdpa_attention))", {"FFPA_PATCH_DISABLE": "1"})
    return out.strip() == "True"


ORDERS = [
    ("import", "gemma4"),
    ("gemma4", "import"),
    ("import", "gemma4", "apply"),
    ("import", "apply", "apply", "gemma4"),
    ("gemma4", "import", "revert"),
    ("import", "revert", "gemma4"),
    ("import", "gemma4", "revert", "apply"),
    ("gemma4", "import", "revert", "apply", "revert"),
    ("import", "revert", "revert", "gemma4", "apply", "apply"),
]




@pytest.mark.parametrize("order", ORDERS, ids=["-".join(o) for o in ORDERS])
def test_order_ends_in_expected_state(order):
    # import activates; revert deactivates; apply re-activates. Later imports follow the last word.
    active = False
    for s in order:
        if s == "import" and not any(x in ("import", "apply", "revert") for x in order[: order.index(s)]):
            active = True
        elif s == "apply":
            active = True
        elif s == "revert":
            active = False
    got = run(order)
    assert got["ffpa_registered"] is active
    assert got["gemma4_dropin"] is active
    assert got["gemma4_dropin_depth"] == int(active)  # never double-wrapped
    assert got["sdpa_entry_is_module_attr"] is True  # registry and module attribute always agree
    if bug_present():
        assert got["sdpa_module_wrapped"] is active
    else:
        assert got["sdpa_module_wrapped"] is False  # not needed: untouched


def test_disable_env_patches_nothing():
    got = run(("import", "gemma4"), {"FFPA_PATCH_DISABLE": "1"})
    assert got["ffpa_registered"] is False and got["gemma4_dropin"] is False
    assert got["sdpa_module_wrapped"] is False


def test_import_does_not_import_torch_or_transformers():
    out = run_python("import sys, ffpa_patch; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    assert out.strip() == "[]"


def test_failing_hook_never_breaks_the_users_import(tmp_path):
    # A hook that raises is logged; the import it hangs on, and later ones, succeed.
    fake = tmp_path / "fakepkg"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    code = (
        "import ffpa_patch, logging\n"
        "from ffpa_patch.wrapping import when_imported\n"
        "def bad(m): raise RuntimeError('hook exploded')\n"
        "when_imported('fakepkg', bad)\n"
        "import fakepkg\n"
        "import transformers.models.gemma4.modeling_gemma4\n"
        "print('ok')\n"
    )
    out = run_python(code, {"PYTHONPATH": str(tmp_path)})
    assert out.strip().endswith("ok")
