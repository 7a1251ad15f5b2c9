"""Every wrong input and every off cause, from the environment, the CLI and apply(): one clear
message, the documented exit code or exception type, and never a traceback (CPU machine)."""
import os
import subprocess
import sys

import pytest

import ffpa_patch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWITCHES = ("FFPA_PATCH_DISABLE", "FFPA_PATCH_STRICT", "FFPA_PATCH_FORCE", "FFPA_PATCH_TARGETS", "FFPA_PATCH_EXCLUDE")


def cli(*args, **env_extra):
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    env.update(env_extra, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "ffpa_patch", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


#: off cause (environment) -> (status's exit code, demo's exit code, a phrase status and the demo say)
CAUSES = {
    "disabled": ({"FFPA_PATCH_DISABLE": "1"}, 4, 4, "disabled by FFPA_PATCH_DISABLE=1"),
    "disabled, TRUE": ({"FFPA_PATCH_DISABLE": "TRUE"}, 4, 4, "disabled by FFPA_PATCH_DISABLE=TRUE"),
    "bad switch value": ({"FFPA_PATCH_DISABLE": "maybe"}, 4, 4, "FFPA_PATCH_DISABLE='maybe' is not a switch"),
    "bad force value": ({"FFPA_PATCH_FORCE": "2"}, 4, 4, "FFPA_PATCH_FORCE='2' is not a switch"),
    "unknown target": ({"FFPA_PATCH_TARGETS": "bogus"}, 4, 4, "unknown ffpa_patch target(s) ['bogus']"),
    "empty targets": ({"FFPA_PATCH_TARGETS": " , "}, 4, 4, "name no patch"),
    "backend excluded": ({"FFPA_PATCH_EXCLUDE": "ffpa_backend"}, 3, 4, "ffpa_backend"),
    "strict, unknown target": ({"FFPA_PATCH_STRICT": "1", "FFPA_PATCH_TARGETS": "bogus"}, 4, 4, "unknown ffpa_patch target"),
    "strict on a CPU": ({"FFPA_PATCH_STRICT": "1"}, 3, 3, "strict"),
}


@pytest.mark.parametrize("cause", list(CAUSES))
def test_status_and_demo_say_why_with_their_exit_code(cause):
    env, status_code, demo_code, phrase = CAUSES[cause]
    status = cli("status", **env)
    assert status.returncode == status_code, status.stdout + status.stderr
    assert "Traceback" not in status.stderr and (phrase in status.stdout or cause == "strict on a CPU")
    assert status.stdout.count(phrase) <= 2 if cause != "strict on a CPU" else "[strict]" in status.stdout
    assert not status.stderr.strip(), status.stderr  # status says it once, in its own output
    demo = cli("demo", "--steps", "2", "--seq", "32", "--layers", "6", **env)
    assert demo.returncode == demo_code, demo.stdout + demo.stderr
    assert "Traceback" not in demo.stderr and phrase in demo.stdout, demo.stdout + demo.stderr


@pytest.mark.parametrize("cause", ["disabled", "unknown target", "strict on a CPU"])
def test_doctor_and_run_never_print_a_traceback(cause):
    env = CAUSES[cause][0]
    doctor = cli("doctor", **env)
    assert doctor.returncode == 3 and "Traceback" not in doctor.stderr  # no GPU here: "cannot run here"
    run = cli("run", "--", sys.executable, "-c", "import ffpa_patch; print(ffpa_patch.status().state)", **env)
    if cause == "strict, unknown target":  # strict mode raises from the user's own import, as documented
        assert run.returncode != 0
    else:
        assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr


def test_the_demo_on_a_cpu_shows_no_speed_up_figure():
    demo = cli("demo", "--steps", "2", "--seq", "32")
    assert demo.returncode == 0, demo.stderr
    assert "no fused kernel ran here" in demo.stdout and "x stock" not in demo.stdout


@pytest.mark.parametrize("kwargs, error, needle", [
    ({"strict": "no"}, TypeError, "takes True, False or None"),
    ({"strict": 1}, TypeError, "takes True, False or None"),
    ({"force": "yes"}, TypeError, "takes True, False or None"),
    ({"targets": ["ffpa_backend", 3]}, TypeError, "takes patch names"),
    ({"targets": 5}, TypeError, "takes patch names"),
    ({"exclude": [None]}, TypeError, "takes patch names"),
    ({"targets": "bogus"}, ValueError, "unknown ffpa_patch target(s) ['bogus']"),
    ({"targets": "ffpa_backend", "exclude": "ffpa_backend"}, ValueError, "both chosen and excluded"),
])
def test_apply_checks_its_arguments(kwargs, error, needle):
    try:
        with pytest.raises(error, match=needle.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
            ffpa_patch.apply(**kwargs)
    finally:
        ffpa_patch.revert()


@pytest.mark.parametrize("targets", ["ffpa_backend", "ffpa_backend,gemma4_dropin", ["FFPA_BACKEND"]])
def test_a_target_name_as_one_string_is_accepted(targets):
    try:
        status = ffpa_patch.apply(targets=targets)
        assert status.state == "active"
        assert "ffpa_backend" in {p["name"] for p in status.patches if p["state"] in ("applied", "waiting for import")}
    finally:
        ffpa_patch.revert()


def test_attn_implementation_ffpa_says_why_when_the_backend_patch_is_excluded():
    code = ("import sys; sys.path.insert(0, 'tests')\n"
            "import ffpa_patch, tiny\n"
            "try:\n"
            "    tiny.causal_lm('dense31b', attn='sdpa').set_attn_implementation('ffpa')\n"
            "except Exception as exc:\n"
            "    print(type(exc).__name__, exc)\n")
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    env.update(PYTHONPATH=ROOT, FFPA_PATCH_EXCLUDE="ffpa_backend")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300).stdout
    assert out.startswith("FFPANotAppliedError") and "its ffpa_backend patch is not among the patches applied" in out, out


def test_the_demo_says_unsupported_versions_with_code_5():
    """Transformers outside the range cannot be installed beside the tests; the demo's check is fed
    the state status() has then."""
    from ffpa_patch.demo import _not_ready
    from ffpa_patch.lifecycle import UNSUPPORTED_VERSIONS
    from ffpa_patch.report import Status

    code, said = _not_ready(Status(active=False, strict=False, state=UNSUPPORTED_VERSIONS,
                                   message="not applied: transformers 5.4.0 is UNSUPPORTED"), "ffpa_backend")
    assert code == 5 and "transformers 5.4.0 is UNSUPPORTED" in said
