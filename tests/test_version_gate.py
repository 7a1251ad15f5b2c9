"""The version gate: unsupported, missing, forced and strict each behave as documented."""
import pytest
from packaging.version import Version

import ffpa_patch
from ffpa_patch import versions


@pytest.fixture
def fake_transformers(monkeypatch):
    real = versions.installed

    def set_version(v):
        monkeypatch.setattr(versions, "installed", lambda d: (None if v is None else Version(v)) if d == "transformers" else real(d))

    yield set_version
    ffpa_patch.revert()


def test_unsupported_version_warns_names_versions_and_patches_nothing(fake_transformers):
    ffpa_patch.revert()
    fake_transformers("5.4.0")
    with pytest.warns(UserWarning, match=r"transformers 5\.4\.0 is UNSUPPORTED \(works with >=5\.5\.0,<5\.26\)"):
        st = ffpa_patch.apply()
    assert not st.active and not ffpa_patch.is_applied()
    assert all(p["state"] != "applied" for p in st.patches)


def test_missing_transformers_is_reported(fake_transformers):
    ffpa_patch.revert()
    fake_transformers(None)
    with pytest.warns(UserWarning, match="transformers is not installed"):
        st = ffpa_patch.apply()
    assert not st.active


def test_strict_raises_on_unsupported(fake_transformers):
    ffpa_patch.revert()
    fake_transformers("6.0.0")
    with pytest.raises(ffpa_patch.UnsupportedVersionError, match="6.0.0"):
        ffpa_patch.apply(strict=True)
    assert not ffpa_patch.is_applied()


def test_force_applies_outside_the_range(fake_transformers, monkeypatch):
    import transformers.modeling_utils  # noqa: F401  (so the patch applies now, not on import)

    ffpa_patch.revert()
    fake_transformers("6.0.0")
    monkeypatch.setenv("FFPA_PATCH_FORCE", "1")
    st = ffpa_patch.apply()
    assert st.active and "FORCED" in st.message
    assert any(p["name"] == "ffpa_backend" and p["state"] == "applied" for p in st.patches)


def test_unknown_target_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown ffpa_patch target"):
        ffpa_patch.apply(targets=["nope"])


def test_supported_range_lives_in_one_constant():
    assert versions.SUPPORTED["transformers"].startswith(">=5.5.0")
    assert versions.check("transformers").supported == versions.SUPPORTED["transformers"]


def test_an_optional_package_out_of_range_turns_off_only_the_patch_that_needs_it(monkeypatch):
    import transformers.modeling_utils  # noqa: F401
    import transformers.models.gemma4.modeling_gemma4  # noqa: F401

    real = versions.installed
    monkeypatch.setattr(versions, "installed", lambda d: Version("9.0.0") if d == "nemo-automodel" else real(d))
    ffpa_patch.revert()
    try:
        with pytest.warns(UserWarning, match=r"nemo_moe_ring off: nemo-automodel 9\.0\.0 is UNSUPPORTED"):
            st = ffpa_patch.apply()
        rows = {p["name"]: p for p in st.patches}
        assert rows["ffpa_backend"]["state"] == "applied" and rows["gemma4_dropin"]["state"] == "applied"
        assert rows["nemo_moe_ring"]["state"] == "unsupported versions"
        assert "nemo-automodel 9.0.0" in rows["nemo_moe_ring"]["reason"]
        assert st.active and st.message == "active (nemo_moe_ring off: unsupported versions)"
        with pytest.raises(ffpa_patch.UnsupportedVersionError, match="nemo-automodel 9.0.0"):
            ffpa_patch.apply(strict=True)
    finally:
        ffpa_patch.revert()
    monkeypatch.setattr(versions, "installed", real)
    rows = {p["name"]: p for p in ffpa_patch.apply().patches}
    assert rows["nemo_moe_ring"]["state"] != "unsupported versions"  # judged afresh
    ffpa_patch.revert()
