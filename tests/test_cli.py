"""The ffpa-patch command: help, version, and one clear line with a non-zero exit on bad input."""
import os

import pytest

from conftest import run_python

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


def test_status_with_a_missing_config_says_so_before_importing_anything(tmp_path):
    out = run_python(f"import sys; from ffpa_patch import cli; code = cli.main(['status', '--config', {str(tmp_path / 'x')!r}]); "
                     "print(code, 'transformers' in sys.modules, 'torch' in sys.modules)")
    assert out.strip().splitlines()[-1] == "2 False False"


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
    for v in status.versions:  # installed or not, as in --json; state and range in columns of their own
        assert any(line.split()[:1] == [v.name] and v.state in line and v.supported in line for line in text.splitlines())
    if importlib.util.find_spec("nemo_automodel") is None:
        row = next(p for p in status.patches if p["name"] == "nemo_moe_ring")
        assert (row["state"], row["reason"]) == ("not installed", "nemo_automodel is not installed")
        assert any(line.split()[:3] == ["nemo-automodel", "-", "not"] and line.endswith("(optional)") for line in text.splitlines())


def test_on_a_machine_without_cuda_the_ffpa_patches_say_they_cannot_run():
    import torch
    import transformers.modeling_utils  # noqa: F401

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    rows = {p["name"]: p for p in ffpa_patch.apply().patches}
    assert rows["ffpa_backend"]["state"] == "applied"
    assert rows["ffpa_backend"]["warnings"] == ["in place, but no CUDA device here: every call falls back to SDPA"]
    text = str(ffpa_patch.status())  # no pip advice that cannot help here; the machine's warning printed once
    assert text.count("WARNING: in place, but no CUDA device here") == 1 and "pip install 'ffpa-attn" not in text
    same = [p["name"] for p in ffpa_patch.status().patches if p["warnings"] == rows["ffpa_backend"]["warnings"]]
    assert len(same) >= 2 and text.count("WARNING: as above") == len(same) - 1  # the routing patches after the first


# -- status exit codes: a launch script can gate on them ---------------------------------------------
def status_exit(args=(), **env_extra):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FFPA_PATCH_")}
    env.update(env_extra, PYTHONPATH=os.pathsep.join(p for p in (env_extra.get("PYTHONPATH"), root) if p))
    done = subprocess.run([sys.executable, "-m", "ffpa_patch", "status", *args], capture_output=True, text=True,
                          env=env, timeout=300)
    return done.returncode, done.stdout


@pytest.mark.parametrize("env_extra, code", [
    ({}, 3),  # active, but no GPU on this machine: the fused kernels cannot run
    ({"FFPA_PATCH_DISABLE": "1"}, 4),
    ({"FFPA_PATCH_STRICT": "perhaps"}, 4),  # a misconfigured switch
    ({"FFPA_PATCH_TARGETS": "ffpa_backend", "FFPA_PATCH_EXCLUDE": "ffpa_backend"}, 4),
])
def test_status_exit_codes_on_a_machine_without_a_gpu(env_extra, code):
    from ffpa_patch import machine

    if machine.fused_kernels_here()[0]:
        pytest.skip("this machine has a GPU the kernels run on")
    for args in ((), ("--json",)):
        got, out = status_exit(args, **env_extra)
        assert got == code, out
    assert f"exit code {code}: {cli.EXIT_CODES[code]}" in status_exit((), **env_extra)[1]


def test_status_exits_5_when_the_versions_are_unsupported(tmp_path):
    dist = tmp_path / "transformers-9.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 9.0.0\n")
    code, out = status_exit(("--json",), PYTHONPATH=str(tmp_path))
    import json

    data = json.loads(out)
    assert code == 5 and data["exit_code"] == 5 and data["state"] == "unsupported versions"


def test_exit_code_0_needs_the_patch_active_and_the_kernels_able_to_run():
    assert cli.exit_code("active", True) == 0
    assert cli.exit_code("active", False) == 3
    assert cli.exit_code("reverted", True) == 4


# -- the quick view's GPU verdict, from a stand-in for the driver's /proc folder -------------------------
@pytest.mark.parametrize("models, ok, needle", [
    ([], False, "no NVIDIA GPU found"),
    (["NVIDIA A100-SXM4-80GB"], False, "not a Hopper/Blackwell data-center GPU"),
    (["NVIDIA H100 80GB HBM3"], None, "NVIDIA H100 80GB HBM3"),
    (["NVIDIA B200"], None, "NVIDIA B200"),
])
def test_the_quick_view_judges_the_gpu_by_the_drivers_files(tmp_path, models, ok, needle):
    from ffpa_patch import machine, versions

    for i, model in enumerate(models):
        (tmp_path / f"0000:0{i}:00.0").mkdir()
        (tmp_path / f"0000:0{i}:00.0" / "information").write_text(f"Model: \t {model}\nIRQ: 42\n")
    assert machine.nvidia_gpus(str(tmp_path)) == models
    got, why = machine.fused_kernels_here(str(tmp_path))
    if ok is None:  # a Hopper/Blackwell GPU: then it is up to ffpa-attn being installed
        ok = versions.installed("ffpa-attn") is not None
        assert ok or "pip install 'ffpa-attn" in why
    assert got is ok and needle in why


# -- attn_implementation="ffpa" while ffpa_patch is imported but off -------------------------------------
@pytest.mark.parametrize("env_extra, reason", [
    ({"FFPA_PATCH_DISABLE": "1"}, "disabled by FFPA_PATCH_DISABLE=1"),
    ({"FFPA_PATCH_TARGETS": "nonsense"}, "unknown ffpa_patch target(s) ['nonsense']"),
])
def test_asking_for_ffpa_while_off_names_ffpa_patch_and_the_reason(env_extra, reason):
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys; sys.path.insert(0, 'tests')\n"
            "import ffpa_patch, tiny\n"
            "try:\n"
            "    tiny.causal_lm('dense31b', attn='sdpa').set_attn_implementation('ffpa')\n"
            "except ValueError as e:\n"
            "    print(type(e).__name__, e)\n"
            "ffpa_patch.revert()  # exact again: Transformers' own error\n"
            "try:\n"
            "    tiny.causal_lm('dense31b', attn='sdpa').set_attn_implementation('ffpa')\n"
            "except ValueError as e:\n"
            "    print(type(e).__name__, e)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FFPA_PATCH_")}
    env.update(env_extra, PYTHONPATH=root)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, timeout=300)
    ours, stock = done.stdout.strip().splitlines()[-2:]
    assert ours.startswith('FFPANotAppliedError attn_implementation="ffpa" comes from ffpa_patch, which is imported here but not applied')
    assert reason in ours and "not applied: not applied" not in ours
    assert stock.startswith("ValueError") and "ffpa_patch" not in stock


def test_the_demo_runs_on_cpu_and_says_why_nothing_was_fused(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    lines = []
    from ffpa_patch import demo

    assert demo.run(steps=2, seq=128, layers=6, out=lines.append) == 0
    text = "\n".join(lines)
    assert "stock sdpa : first step" in text and "ffpa_patch : first step" in text
    assert "full    -> sdpa : device cpu (FFPA needs CUDA)  2" in text
    diff = float(text.split("largest difference ")[1].split(")")[0])
    assert diff < 1e-4 and "nothing was fused here" in text  # SDPA, or its repeat-K/V fix on 5.5-5.12: rounding


@pytest.mark.parametrize("args", [["--seq", "-5"], ["--steps", "0"], ["--layers", "0"], ["--seq", "many"]])
def test_bad_demo_arguments_exit_2_with_a_message(args, capsys):
    from ffpa_patch import cli

    with pytest.raises(SystemExit) as done:
        cli.main(["demo", *args])
    assert done.value.code == 2
    assert "is not" in capsys.readouterr().err  # "... is not at least 1" / "is not a whole number"


def test_strict_demo_stops_before_any_step_where_nothing_can_fuse(patched):
    import torch

    import ffpa_patch
    from ffpa_patch import demo

    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    ffpa_patch.apply(strict=True)
    lines = []
    assert demo.run(steps=1, seq=64, layers=6, out=lines.append) == demo.CANNOT_RUN_HERE
    assert len(lines) == 1 and "strict mode" in lines[0] and "device cpu" in lines[0]  # no step ran


def test_the_demo_saves_a_folder_the_quick_start_loads(tmp_path, patched):
    import torch
    from transformers import AutoModelForCausalLM

    from ffpa_patch import demo

    lines = []
    assert demo.run(steps=1, seq=32, layers=6, out=lines.append, save=str(tmp_path / "tiny")) == 0
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "tiny"), attn_implementation="ffpa", dtype=torch.bfloat16)
    assert model.config.model_type == "gemma4_text" and model.config.num_hidden_layers == 6
    assert any("wrote the model and a byte-level tokenizer to" in line for line in lines)


def test_the_saved_demo_folder_has_a_tokenizer_that_fits_the_model(tmp_path, patched):
    """What TRL's SFTTrainer and generate() need from the folder, with no download: any text round-trips,
    every id is inside the model's vocabulary, and the special tokens are the model config's."""
    from transformers import AutoConfig, AutoTokenizer

    from ffpa_patch import demo

    assert demo.run(steps=1, seq=32, layers=6, out=lambda line: None, save=str(tmp_path / "tiny")) == 0
    tok, config = AutoTokenizer.from_pretrained(str(tmp_path / "tiny")), AutoConfig.from_pretrained(str(tmp_path / "tiny"))
    text = "héllo wörld, 你好 \t\n 123"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text and max(ids) < config.vocab_size and min(ids) > config.bos_token_id
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (config.pad_token_id, config.eos_token_id,
                                                                       config.bos_token_id)


@pytest.mark.parametrize("make,why", [
    (lambda p: p.write_text("x"), "exists and is not a folder"),
    (lambda p: None, "cannot make a folder there"),
])
def test_demo_save_to_a_place_it_cannot_write_says_so_before_running(tmp_path, make, why):
    """Checked before the demo runs: no traceback, no "wrote the model" over nothing, exit 2."""
    import subprocess
    import sys

    target = tmp_path / "afile"
    make(target)
    if why.startswith("cannot"):
        blocker = tmp_path / "blocker"
        blocker.write_text("a file where a folder would have to be")
        target = blocker / "inside"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run([sys.executable, "-m", "ffpa_patch", "demo", "--save", str(target)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"ffpa-patch demo: --save {target}: {why}" in done.stderr and "wrote" not in done.stdout
