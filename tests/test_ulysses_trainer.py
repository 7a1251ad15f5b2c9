"""Ulysses sequence parallelism as accelerate and Trainer users drive it (2 gloo ranks, CPU):
``ParallelismConfig(sp_backend="deepspeed", sp_size=2)``, a tiny Gemma 4 left on "sdpa" (the only
core accelerate accepts), a packed batch, two SGD steps against one process on the whole sequence."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("deepspeed.runtime.sequence_parallel.ulysses_sp")
if not hasattr(pytest.importorskip("accelerate.utils.dataclasses"), "DeepSpeedSequenceParallelConfig"):
    pytest.skip("this accelerate has no DeepSpeed sequence parallelism", allow_module_level=True)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(mode: str, tmp_path) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", USE_HUB_KERNELS="0", OUT_DIR=str(tmp_path))
    env.pop("FFPA_PATCH_DISABLE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
           os.path.join(ROOT, "tests", "ulysses_trainer_worker.py"), mode]
    for attempt in range(2):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
        if proc.returncode == 0 or "terminate called without an active exception" not in proc.stderr:
            break
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[7:])


@pytest.mark.parametrize("mode", ["accelerate", "trainer"])
def test_two_steps_match_one_process_and_every_layer_runs_fused(mode, tmp_path):
    ranks = launch(mode, tmp_path)
    assert len(ranks) == 2
    for got in ranks:
        assert len(got["losses"]) == 2
        for loss, expected in zip(got["losses"], got["expected"]):  # the second step checks the first update
            assert abs(loss - expected) <= 1e-5 * expected, got
        routes = {tuple(r) for r in got["routes"]}
        assert {(layer, kernel) for layer, kernel, _ in routes} == {("full", "ffpa"), ("sliding", "fa4")}, routes
        assert all(reason.startswith("Ulysses sequence parallel") and "varlen" in reason for _, _, reason in routes)
        states = {p["name"]: p["state"] for p in got["applied"]}
        assert states["deepspeed_ulysses"] == "applied" and states["gemma4_dropin"] == "applied"
