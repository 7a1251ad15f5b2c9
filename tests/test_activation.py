"""Automatic activation routes, each in a fresh interpreter, and the CLI."""
import json
import os
import subprocess
import sys

from conftest import run_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "sitecustomize_example")
PROBE = (
    "import sys, transformers.models.gemma4.modeling_gemma4 as g\n"
    "w = sys.modules.get('ffpa_patch.wrapping')\n"  # (this probe never imports ffpa_patch itself)
    "print('PATCHED' if w and w.live_in_chain(g.ALL_ATTENTION_FUNCTIONS['sdpa'], 'gemma4_dropin') == 1 else 'PLAIN')\n"
)


def run_plain(code, pythonpath, extra_env=None, flags=()):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath))
    env.pop("FFPA_PATCH_DISABLE", None)
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_sitecustomize_example_patches_on_import():
    assert run_plain(PROBE, [EXAMPLE, ROOT]) == "PATCHED"


def test_without_sitecustomize_nothing_is_patched():
    assert run_plain(PROBE, [ROOT]) == "PLAIN"


def test_sitecustomize_chains_to_the_users_own(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITE_RAN = True\n")
    code = PROBE + "import builtins\nprint(getattr(builtins, 'USER_SITE_RAN', False))\n"
    assert run_plain(code, [EXAMPLE, ROOT, str(tmp_path)]) == "True"
    assert run_plain(PROBE, [EXAMPLE, ROOT, str(tmp_path)]) == "PATCHED"


def test_disable_env_wins_over_sitecustomize():
    assert run_plain(PROBE, [EXAMPLE, ROOT], {"FFPA_PATCH_DISABLE": "1"}) == "PLAIN"


def test_isolated_mode_skips_sitecustomize():
    # -I ignores PYTHONPATH and sitecustomize, so the patch is not active (documented)
    code = "import sys; print('ffpa_patch' in sys.modules)"
    assert run_plain(code, [EXAMPLE, ROOT], flags=("-I",)) == "False"


def test_run_launcher_patches_the_child():
    code = f"import subprocess, sys; sys.argv = ['ffpa-patch', 'run', '--', sys.executable, '-c', {PROBE!r}]\nfrom ffpa_patch.cli import main; main(sys.argv[1:])"
    assert run_plain(code, [ROOT]) == "PATCHED"


def test_pythonstartup_prints_status_in_interactive_session():
    path = run_python("from ffpa_patch.cli import main; main(['startup-path'])").strip()
    env = dict(os.environ, PYTHONSTARTUP=path, PYTHONPATH=ROOT)
    env.pop("FFPA_PATCH_DISABLE", None)
    proc = subprocess.run([sys.executable, "-i"], input="import sys; print('in', 'ffpa_patch' in sys.modules)\n",
                          capture_output=True, text=True, env=env, timeout=120)
    assert "ffpa_patch: active" in proc.stdout + proc.stderr
    assert "in True" in proc.stdout


def test_status_json_schema():
    out = run_python("from ffpa_patch.cli import main; main(['status', '--json', '--check'])")
    data = json.loads(out)
    assert {"active", "strict", "message", "versions", "patches", "routes", "kernels"} <= data.keys()
    names = {p["name"]: p["state"] for p in data["patches"]}
    assert names["ffpa_backend"] == "applied" and names["gemma4_dropin"] == "applied"
    assert any(v["name"] == "transformers" and v["ok"] for v in data["versions"])
    assert data["checked"] is True
    assert data["d512_backward"].startswith("none: FFPA does not run here")  # a CPU: no full-layer kernel, no backward


def test_status_text_names_patches_and_kernels():
    out = run_python("from ffpa_patch.cli import main; main(['status', '--check'])")
    assert "gemma4_dropin" in out and "kernels on this machine" in out
    assert "full layers' backward (FFPA, head_dim 512): none: FFPA does not run here" in out


def test_plain_status_imports_neither_torch_nor_transformers_and_says_so():
    """The fast view (the 5-15 s of `ffpa-patch status` were the torch/Transformers/kernel
    imports) answers from package metadata and points at --check for the rest."""
    code = ("import sys; from ffpa_patch.cli import main; main(['status', '--json']); "
            "print([m for m in ('torch', 'transformers', 'ffpa_attn', 'flash_attn') if m in sys.modules])")
    out = run_python(code)
    data = json.loads(out[: out.rindex("}") + 1])
    assert out.strip().endswith("[]"), out[-200:]
    assert data["checked"] is False and any(v["name"] == "transformers" for v in data["versions"])
    states = {p["name"]: p["state"] for p in data["patches"]}
    assert states["gemma4_dropin"] == "waiting for import"
    text = run_python("from ffpa_patch.cli import main; main(['status'])")
    assert "ffpa-patch status --check" in text and "ffpa-attn" in text


def test_first_forward_prints_one_summary_line_per_model():
    code = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "import torch, ffpa_patch, tiny\n"
        "from ffpa_patch.kernels import use\n"
        "from ffpa_patch.kernels import reference\n"
        "m = tiny.causal_lm('dense31b', attn='ffpa')\n"
        "with use(reference.kernel_set(fp32=True)):\n"
        "    for _ in range(3): m(torch.randint(0, 128, (1, 8)))\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("FFPA_PATCH_DISABLE", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    lines = [l for l in proc.stderr.splitlines() if l.startswith("ffpa_patch: Gemma4 model")]
    assert lines == ['ffpa_patch: Gemma4 model on "ffpa": 1 full -> ffpa: dense causal | 5 sliding -> fa4: dense causal'], proc.stderr


def test_status_config_shows_the_route_of_each_layer_type(tmp_path):
    import tiny

    tiny.text_config("dense31b").save_pretrained(tmp_path)
    out = run_python(f"from ffpa_patch.cli import main; main(['status', '--json', '--config', {str(tmp_path)!r}])")
    plan = json.loads(out)["plan"]
    full = [r for r in plan["ffpa"] if r["layer"] == "full"]
    assert full == [{"layer": "full", "head_dim": 512, "kernel": "sdpa", "reason": "device cpu (FFPA needs CUDA)", "layers": 1}]
    assert sum(r["layers"] for r in plan["sdpa"] if r["layer"] == "sliding") == 5
    assert all(r["reason"] == "device cpu (flash-attn-4 needs CUDA)" for r in plan["sdpa"] if r["layer"] == "sliding")
    sliding = [r for r in plan["ffpa"] if r["layer"] == "sliding"]
    assert all(r["reason"] == "device cpu (flash-attn-4 needs CUDA)" for r in sliding), sliding  # the preferred kernel's


def test_doctor_on_cpu_says_what_it_cannot_check():
    import pytest
    import torch

    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "ffpa_patch", "doctor"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 3  # "cannot run here", as `ffpa-patch status`
    assert "no CUDA device: cannot check the FFPA kernels here" in proc.stdout


def test_no_site_mode_skips_sitecustomize():
    code = "import sys; print('ffpa_patch' in sys.modules)"
    assert run_plain(code, [EXAMPLE, ROOT], flags=("-S",)) == "False"


def test_console_script_is_installed_and_reports_status():
    import shutil

    import pytest

    exe = shutil.which("ffpa-patch") or os.path.join(os.path.dirname(sys.executable), "ffpa-patch")
    if not os.path.exists(exe):
        pytest.skip("package not installed (run through tox or pip install -e .)")
    proc = subprocess.run([exe, "status", "--json"], capture_output=True, text=True, timeout=300)
    data = json.loads(proc.stdout)
    assert data["active"] is True
    assert proc.returncode == data["exit_code"] == (0 if data["fused_kernels_here"]["run"] else 3), proc.stderr
