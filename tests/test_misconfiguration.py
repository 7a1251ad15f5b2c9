"""Misconfiguration is loud: one line on stderr (logging not configured), the reason in
status().message, strict raising on the automatic path too. Each in a fresh interpreter."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATUS = "import ffpa_patch; print(ffpa_patch.status().message)"


def python(code, **env_extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FFPA_PATCH_")}
    env.update(env_extra, PYTHONPATH=os.pathsep.join(p for p in (ROOT, env_extra.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("value", ["nonsense", "ffpa_backend,nonsense"])
def test_an_unknown_target_is_named_on_stderr_and_in_the_status(value):
    done = python(STATUS, FFPA_PATCH_TARGETS=value)
    assert done.returncode == 0
    assert "ffpa_patch: not applied: unknown ffpa_patch target(s) ['nonsense']" in done.stderr
    assert done.stdout.strip().startswith("not applied: unknown ffpa_patch target(s) ['nonsense']")


def test_each_patch_row_of_a_misconfigured_status_points_at_the_reason():
    done = python("import ffpa_patch; print({p['state'] + ': ' + p['reason'] for p in ffpa_patch.status().patches})",
                  FFPA_PATCH_STRICT="maybe")
    assert done.stdout.strip() == "{'not applied: nothing applied (misconfigured): see the first line'}"


def test_target_names_are_not_case_sensitive():
    done = python("import ffpa_patch; print([p['name'] for p in ffpa_patch.status().patches if p['state'] != 'skipped'])",
                  FFPA_PATCH_TARGETS="FFPA_Backend")
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.strip() == "['ffpa_backend']"


@pytest.mark.parametrize("name,value", [("FFPA_PATCH_STRICT", "maybe"), ("FFPA_PATCH_DISABLE", "2")])
def test_a_switch_with_a_bad_value_is_rejected_with_the_accepted_spellings(name, value):
    done = python(STATUS, **{name: value})
    assert done.returncode == 0
    line = f"{name}='{value}' is not a switch: use 1/true/yes/on or 0/false/no/off"
    assert line in done.stderr and line in done.stdout


def test_an_explicit_apply_raises_on_a_bad_switch():
    done = python("import ffpa_patch\ntry:\n    ffpa_patch.apply()\nexcept ValueError as e:\n    print('raised', e)",
                  FFPA_PATCH_FORCE="sure")
    assert "raised FFPA_PATCH_FORCE='sure' is not a switch" in done.stdout


def test_an_unknown_d512_backward_is_refused_at_apply_with_the_choices():
    done = python("import ffpa_patch\ntry:\n    ffpa_patch.apply()\nexcept ValueError as e:\n    print('raised', e)",
                  FFPA_PATCH_D512_BACKWARD="cudnn")
    assert "raised FFPA_PATCH_D512_BACKWARD='cudnn': use one of ('triton', 'ffpa-attn')" in done.stdout


@pytest.mark.parametrize("value,expected", [("", "triton"), (" Triton ", "triton"), ("ffpa-attn", "ffpa-attn")])
def test_the_d512_backward_switch_reads_its_spellings(monkeypatch, value, expected):
    from ffpa_patch import env

    monkeypatch.setenv("FFPA_PATCH_D512_BACKWARD", value)
    assert env.d512_backward() == expected


@pytest.fixture
def future_nemo(tmp_path):
    """An installed nemo-automodel outside the supported range (metadata only)."""
    dist = tmp_path / "nemo_automodel-9.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nemo-automodel\nVersion: 9.0.0\n")
    return str(tmp_path)


def test_unsupported_versions_are_said_on_stderr_on_import(future_nemo):
    done = python(STATUS, PYTHONPATH=future_nemo)
    assert done.returncode == 0
    assert "nemo-automodel 9.0.0" in done.stderr and "FFPA_PATCH_FORCE=1" in done.stderr


def test_strict_raises_on_the_automatic_path(future_nemo):
    done = python(STATUS, PYTHONPATH=future_nemo, FFPA_PATCH_STRICT="1")
    assert done.returncode != 0
    assert "UnsupportedVersionError" in done.stderr and "nemo-automodel 9.0.0" in done.stderr


def test_with_logging_configured_the_line_goes_to_the_logger():
    done = python("import logging, sys; logging.basicConfig(stream=sys.stdout, format='LOG %(name)s %(message)s')\n"
                  + STATUS, FFPA_PATCH_TARGETS="nonsense")
    assert "LOG ffpa_patch ffpa_patch: not applied: unknown ffpa_patch target(s)" in done.stdout
    assert done.stderr == ""


def test_an_explicit_apply_warns_at_the_callers_line(future_nemo):
    code = "import warnings, ffpa_patch\nwith warnings.catch_warnings(record=True) as w:\n    warnings.simplefilter('always')\n" \
           "    ffpa_patch.apply()\nprint(w[-1].filename, w[-1].lineno)"
    done = python(code, PYTHONPATH=future_nemo)
    assert done.stdout.strip().endswith("<string> 4"), done.stdout + done.stderr


def test_exclude_none_means_the_environment_switch_as_the_api_says(monkeypatch):
    import ffpa_patch

    monkeypatch.setenv("FFPA_PATCH_EXCLUDE", "nemo_moe_ring")
    ffpa_patch.revert()
    try:
        rows = {p["name"]: p["state"] for p in ffpa_patch.apply(exclude=None).patches}
        assert rows["nemo_moe_ring"] == "skipped" and ffpa_patch.is_applied()
    finally:
        ffpa_patch.revert()


def test_stats_rows_are_plain_strings(patched, reference_kernels):
    import torch

    import ffpa_patch
    import tiny

    tiny.causal_lm("dense31b", attn="ffpa")(torch.randint(0, 128, (1, 8)))
    rows = ffpa_patch.stats()
    assert rows and all(type(r[k]) is str for r in rows for k in ("layer", "kernel", "reason"))
    assert "<Layer." not in repr(rows)
