"""The ffpa-patch command: help, version, and one clear line with a non-zero exit on bad input."""
import os

import pytest

import ffpa_patch
from ffpa_patch import cli


def test_no_arguments_prints_the_help(capsys):
    assert cli.main([]) == 2
    out = capsys.readouterr().out
    assert out.startswith("usage: ffpa-patch") and "sitecustomize-path" in out


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"ffpa-patch {ffpa_patch.__version__}"


def test_run_with_a_missing_command_says_so(capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))  # restored after the test
    assert cli.main(["run", "--", "no-such-command-ffpa"]) == 127
    err = capsys.readouterr().err
    assert err.strip() == "ffpa-patch run: cannot run 'no-such-command-ffpa': No such file or directory"


def test_status_with_a_missing_config_says_so(capsys, tmp_path):
    assert cli.main(["status", "--config", str(tmp_path / "absent")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ffpa-patch status: --config {tmp_path / 'absent'}: no such file or folder (a local model folder or config.json)")


def test_status_with_a_folder_that_is_not_a_model_says_so(capsys, tmp_path):
    assert cli.main(["status", "--config", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"ffpa-patch status: --config {tmp_path}: not a readable model config (")


def test_sitecustomize_path_is_the_installed_bootstrap(capsys):
    assert cli.main(["sitecustomize-path"]) == 0
    folder = capsys.readouterr().out.strip()
    assert os.path.isfile(os.path.join(folder, "sitecustomize.py"))
    assert folder == os.path.join(os.path.dirname(ffpa_patch.__file__), "bootstrap")


def test_names_the_readme_shows_resolve_after_a_plain_import():
    assert issubclass(ffpa_patch.FFPAFallbackError, RuntimeError)
    assert callable(ffpa_patch.checkpointing.context_fn)
    from ffpa_patch import FFPAFallbackError

    assert FFPAFallbackError is ffpa_patch.FFPAFallbackError


def test_status_text_names_missing_optional_packages_and_uninstalled_targets():
    import importlib.util

    status = ffpa_patch.apply()
    text = str(status)
    for v in status.versions:
        assert v.message in text  # installed or not, as in --json
    if importlib.util.find_spec("nemo_automodel") is None:
        row = next(p for p in status.patches if p["name"] == "nemo_moe_ring")
        assert (row["state"], row["reason"]) == ("not installed", "nemo_automodel is not installed")
        assert "nemo-automodel is not installed (optional" in text


def test_on_a_machine_without_cuda_the_ffpa_patches_say_they_cannot_run():
    import torch
    import transformers.modeling_utils  # noqa: F401

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    rows = {p["name"]: p for p in ffpa_patch.apply().patches}
    assert rows["ffpa_backend"]["state"] == "applied"
    assert any("no CUDA device here" in w for w in rows["ffpa_backend"]["warnings"])
    assert "WARNING: in place, but no CUDA device here" in str(ffpa_patch.status())
