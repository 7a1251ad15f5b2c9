"""The patch contract on synthetic targets: exact revert, no double wrap, rollback."""
import sys
import types

import pytest
import wrapt

from ffpa_patch.registry import APPLIED, NOT_APPLIED, Patch
from ffpa_patch.wrapping import is_ours, set_mapping_entry, wrap_attribute


def _plus_one(wrapped, instance, args, kwargs):
    return wrapped(*args, **kwargs) + 1


def make_target():
    mod = types.ModuleType("fake_target")

    class Base:
        def inherited(self):
            return 10

    class Thing(Base):
        def method(self):
            return 1

        @classmethod
        def cm(cls):
            return 2

        @staticmethod
        def sm():
            return 3

    def func():
        return 4

    mod.Base, mod.Thing, mod.func, mod.REGISTRY = Base, Thing, func, {"x": func}
    return mod


class FakePatch(Patch):
    name = "fake"
    module = "fake_target"
    paths = ("func", "Thing.method", "Thing.cm", "Thing.sm", "Thing.inherited")
    fail_after: int | None = None

    def is_needed(self, module):
        return True, "always"

    def install(self, module, record):
        for i, path in enumerate(self.paths):
            if self.fail_after is not None and i == self.fail_after:
                raise RuntimeError("boom")
            record(wrap_attribute(module, path, _plus_one, self.name)[2])
        record(set_mapping_entry(module.REGISTRY, "x", module.func))


def snapshot(mod):
    return (dict(vars(mod.Thing)), mod.func, dict(mod.REGISTRY), "inherited" in vars(mod.Thing))


def results(mod):
    t = mod.Thing()
    return (mod.func(), t.method(), mod.Thing.cm(), t.cm(), mod.Thing.sm(), t.sm(), t.inherited())


def test_apply_revert_apply_again_restores_exact_objects():
    mod = make_target()
    before, plain = snapshot(mod), results(mod)
    patch = FakePatch()
    assert patch.apply_to(mod) == APPLIED
    assert results(mod) == tuple(r + 1 for r in plain)
    patch.revert()
    assert snapshot(mod) == before and results(mod) == plain
    assert patch.apply_to(mod) == APPLIED
    assert results(mod) == tuple(r + 1 for r in plain)
    patch.revert()
    assert snapshot(mod) == before


def test_double_apply_never_double_wraps():
    mod = make_target()
    plain = results(mod)
    patch = FakePatch()
    patch.apply_to(mod)
    patch.apply_to(mod)
    assert results(mod) == tuple(r + 1 for r in plain)
    with pytest.raises(RuntimeError, match="already wrapped"):
        FakePatch().apply_to(mod)  # a second instance sees our marker
    assert results(mod) == tuple(r + 1 for r in plain)


def test_revert_before_apply_is_a_noop():
    mod = make_target()
    before = snapshot(mod)
    FakePatch().revert()
    assert snapshot(mod) == before


def test_inherited_attribute_is_deleted_not_copied_on_revert():
    mod = make_target()
    patch = FakePatch()
    patch.apply_to(mod)
    assert "inherited" in vars(mod.Thing)
    patch.revert()
    assert "inherited" not in vars(mod.Thing)
    assert mod.Thing().inherited() == 10


def test_classmethod_and_staticmethod_descriptors_survive():
    mod = make_target()
    cm, sm = vars(mod.Thing)["cm"], vars(mod.Thing)["sm"]
    patch = FakePatch()
    patch.apply_to(mod)
    assert mod.Thing.cm() == 3 and mod.Thing.sm() == 4
    patch.revert()
    assert vars(mod.Thing)["cm"] is cm and vars(mod.Thing)["sm"] is sm
    assert isinstance(vars(mod.Thing)["cm"], classmethod)


def test_wrapper_on_top_is_kept_and_ours_disabled_in_place():
    mod = make_target()
    patch = FakePatch()
    patch.apply_to(mod)
    wrapt.wrap_function_wrapper(mod, "func", lambda w, i, a, k: w(*a, **k) * 100)
    assert mod.func() == (4 + 1) * 100
    patch.revert()
    theirs = mod.func
    assert not is_ours(theirs) and theirs() == 4 * 100  # theirs stays, ours passes through


def test_failure_half_way_rolls_back_everything():
    mod = make_target()
    before, plain = snapshot(mod), results(mod)
    patch = FakePatch()
    patch.fail_after = 3
    with pytest.raises(RuntimeError, match="boom"):
        patch.apply_to(mod)
    assert snapshot(mod) == before and results(mod) == plain
    assert not patch.applied and patch.state == "failed"


def test_registry_entry_restored_or_deleted():
    reg = {"a": 1}
    undo_new = set_mapping_entry(reg, "b", 2)
    undo_old = set_mapping_entry(reg, "a", 3)
    assert reg == {"a": 3, "b": 2}
    undo_old()
    undo_new()
    assert reg == {"a": 1}


def test_a_drifted_gemma4_layout_reads_target_not_found():
    import types

    from ffpa_patch.patches.gemma4_dropin import Gemma4DropIn

    patch = Gemma4DropIn()
    assert patch.apply_to(types.ModuleType("transformers.modeling_utils")) == "target not found"
    assert "no ALL_ATTENTION_FUNCTIONS" in patch.reason and not patch.applied


def test_a_conflicting_ffpa_entry_reads_failed_with_the_reason():
    from transformers import modeling_utils
    from transformers.modeling_utils import AttentionInterface

    import ffpa_patch
    from ffpa_patch.patches.attention_backend import FFPABackend

    ffpa_patch.revert()
    AttentionInterface._global_mapping["ffpa"] = lambda *a, **k: None  # someone else's "ffpa"
    try:
        patch = FFPABackend()
        with pytest.raises(RuntimeError, match="not ours"):
            patch.apply_to(modeling_utils)
        assert patch.state == "failed" and "not ours" in patch.reason
    finally:
        del AttentionInterface._global_mapping["ffpa"]
