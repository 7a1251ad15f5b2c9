"""The kernel table checks itself: each way a wrong entry used to route wrongly (found by adding a
second kernel in a scratch clone) is now an error when the table is built, one test each; and a
second full-layer candidate takes its catalog row plus its module (tests/second_kernel.py), nothing else."""
from dataclasses import replace

import pytest
import torch

import ffpa_patch
import tiny
from ffpa_patch.kernels import (CATALOG, FFPA, KernelSet, KernelTableError, catalog, load, reference, registered_ops,
                                use)
from ffpa_patch.routing import stats

SECOND = catalog.KernelInfo("sdpa512", "SDPA (math)", "full", "torch", "", "", "second_kernel", 512, fused=False)


def production(*rows):
    return KernelSet("scratch", tuple(load(info) for info in rows))


def test_a_kernel_named_like_a_fallback_is_refused_at_construction():
    with pytest.raises(KernelTableError, match="fallback's name"):
        production(replace(SECOND, name="sdpa"), *CATALOG)


def test_two_kernels_of_one_name_are_refused():
    with pytest.raises(KernelTableError, match="appears twice"):
        production(replace(SECOND, name="ffpa"), *CATALOG)


def test_a_kernel_from_a_package_without_a_supported_range_is_refused():
    """It used to pass, then crash `ffpa-patch status` (a KeyError for its package)."""
    with pytest.raises(KernelTableError, match="no supported range"):
        production(replace(SECOND, package="mystery-kernels"), *CATALOG)


def test_a_kernel_without_the_entry_points_of_its_kind_is_refused():
    with pytest.raises(KernelTableError, match="takes any mask but has no block"):
        production(replace(SECOND, any_mask=True))
    with pytest.raises(KernelTableError, match="serves 'everything'"):
        production(replace(SECOND, serves="everything"))


def test_a_checkpoint_op_the_policy_cannot_see_is_refused():
    """A composite op is decomposed before a selective-checkpointing policy looks: keeping it saves nothing."""
    lib = torch.library.Library("ffpa_table_test", "FRAGMENT")  # noqa: TOR901 (a test-only namespace)
    lib.define("composite_fwd(Tensor x) -> Tensor")
    lib.impl("composite_fwd", lambda x: x * 2, "CompositeImplicitAutograd")
    with pytest.raises(KernelTableError, match="composite"):
        production(replace(SECOND, checkpoint_ops=("ffpa_table_test::composite_fwd",)))


def test_checkpoint_ops_are_looked_up_at_each_call_not_when_the_table_is_built():
    table = production(replace(SECOND, checkpoint_ops=("ffpa_table_later::fwd",)))
    kernel = table.by_name("sdpa512")
    assert kernel.saved_ops() == set()  # not registered yet (as ffpa-attn's before its import)

    @torch.library.custom_op("ffpa_table_later::fwd", mutates_args=())
    def fwd(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    assert kernel.saved_ops() == {torch.ops.ffpa_table_later.fwd.default}
    assert registered_ops(FFPA) == (set() if load(FFPA).missing() else registered_ops(FFPA))


def test_strict_mode_is_not_satisfied_by_a_table_kernel_that_does_not_count_as_fused(patched):
    """It used to be: strict mode accepted any table kernel, and the demo printed "0.85x stock"."""
    table = reference.kernel_set(fp32=True, catalog=(SECOND, *CATALOG))
    model = tiny.causal_lm("dense31b", attn="ffpa")
    with use(table), pytest.raises(ffpa_patch.FFPAFallbackError, match="does not count as fused"):
        ffpa_patch.apply(strict=True)
        model(torch.randint(0, 128, (1, 12)))


def test_a_second_full_layer_candidate_is_its_row_plus_its_module(patched):
    """Preferred before FFPA: the whole model routes its full layers to it, exactly; its CPU twin is
    generated from the row; its production form loads from the module and takes what the contract says."""
    table = reference.kernel_set(fp32=True, catalog=(SECOND, *CATALOG))
    ids = torch.randint(0, 128, (1, 20), generator=torch.Generator().manual_seed(0))
    model = tiny.causal_lm("dense31b", attn="eager")
    with torch.no_grad():
        want = model(ids).logits
        model.set_attn_implementation("ffpa")
        stats.reset()
        with use(table):
            got = model(ids).logits
    torch.testing.assert_close(got, want, atol=5e-5, rtol=1e-4)
    assert stats.total("full", "sdpa512") == 1 and stats.total("full", "ffpa") == 0
    assert stats.total("sliding", "fa4") == model.config.num_hidden_layers - 1

    kernel = production(SECOND, *CATALOG).by_name("sdpa512")
    assert kernel.unsupported(torch.device("cpu"), torch.bfloat16, 512) == "device cpu (SDPA (math) needs CUDA)"
    q = torch.randn(1, 6, 4, 512, dtype=torch.bfloat16)
    k = torch.randn(1, 9, 1, 512, dtype=torch.bfloat16)
    torch.testing.assert_close(kernel.dense(q, k, k, 0.05), reference.attention(q, k, k, 0.05), atol=2e-2, rtol=2e-2)


def test_both_statuses_list_the_same_kernels():
    """The quick status (package metadata) and `--check` (the kernels asked) name the same table."""
    from ffpa_patch import cli

    quick = cli._kernel_packages(ffpa_patch.status())
    checked, _ = cli._kernel_report()
    assert set(quick) == set(checked) == {info.label for info in CATALOG}


def test_the_extras_and_the_ranges_come_from_the_rows():
    from ffpa_patch import versions

    assert catalog.extras() == {"ffpa": ["ffpa-attn>=0.2.4,<0.3"], "fa4": ["flash-attn-4>=4.0.0b36"]}
    assert all(versions.SUPPORTED[info.package] == info.versions for info in CATALOG if info.package != "torch")


def test_ffpa_gets_a_copy_of_v_only_when_it_shares_ks_storage():
    """ffpa-attn's sm90 head_dim-512 forward asserts on k and v at one address (tests/gpu runs the real
    kernel with one tensor as both); the entries hand it a copy of v then, and v itself otherwise."""
    from ffpa_patch.kernels.ffpa import _unaliased

    k = torch.randn(1, 8, 1, 4)
    v = torch.randn(1, 8, 1, 4)
    assert _unaliased(k, v) is v
    for alias in (k, k.view(1, 8, 4)[:, :, None]):
        copy = _unaliased(k, alias)
        assert copy.data_ptr() != k.data_ptr() and torch.equal(copy, alias)
