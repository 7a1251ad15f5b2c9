"""apply() and revert() from many threads at once leave exactly one consistent state."""
import sys
import threading

import ffpa_patch
from ffpa_patch.wrapping import live_in_chain


def test_eight_threads_applying_and_reverting_leave_stock_exactly_as_it_was():
    import transformers.integrations.sdpa_attention as sdpa_module
    import transformers.models.gemma4.modeling_gemma4 as gemma4
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

    ffpa_patch.revert()
    stock = (sdpa_module.sdpa_attention_forward, AttentionInterface._global_mapping["sdpa"], dict(ALL_ATTENTION_FUNCTIONS._local_mapping))
    errors, start = [], threading.Barrier(8)

    def churn():
        start.wait()
        try:
            for _ in range(60):
                ffpa_patch.apply()
                ffpa_patch.revert()
        except Exception as exc:  # e.g. "already wrapped", "already has a 'ffpa' entry that is not ours"
            errors.append(repr(exc))

    threads = [threading.Thread(target=churn) for _ in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show in a few rounds
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert (sdpa_module.sdpa_attention_forward, AttentionInterface._global_mapping["sdpa"], dict(ALL_ATTENTION_FUNCTIONS._local_mapping)) == stock
    assert gemma4.ALL_ATTENTION_FUNCTIONS is ALL_ATTENTION_FUNCTIONS
    assert "ffpa" not in AttentionInterface._global_mapping
    status = ffpa_patch.apply()
    assert all(p["state"] not in ("failed",) for p in status.patches), status
    assert "ffpa" in AttentionInterface._global_mapping and live_in_chain(AttentionInterface._global_mapping["sdpa"], "gemma4_dropin") == 1
    ffpa_patch.revert()


def test_the_lifecycle_state_is_one_object_not_module_globals(patched):
    """What apply() asked for, the message and the hooks live on one Lifecycle instance: a
    second instance starts clean while the package's is active, and the package keeps none
    of that state at module level (so nothing can change it behind the lock)."""
    from ffpa_patch.lifecycle import Lifecycle
    from ffpa_patch.patches import ALL

    assert ffpa_patch.is_applied() and ffpa_patch._lifecycle.wanted
    fresh = Lifecycle(ALL)
    assert not fresh.is_applied() and fresh.message == "not applied"
    assert fresh.patches.keys() == ffpa_patch._lifecycle.patches.keys()
    assert all(fresh.patches[n] is not ffpa_patch._lifecycle.patches[n] for n in fresh.names)
    assert not any(hasattr(ffpa_patch, name) for name in ("_patches", "_wanted", "_message", "_logged", "_hooks", "_lock"))
    ffpa_patch.revert()
    assert not ffpa_patch._lifecycle.wanted and ffpa_patch.status().message == "reverted"
