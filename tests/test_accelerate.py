"""`ffpa-patch run -- accelerate launch --mixed_precision bf16` patches the launched script, and
accelerate's autocast over fp32 weights reaches the fused route (CPU, strict seam). Multi-process
CPU launches need mpirun in accelerate; several ranks are covered by test_distributed.py (torchrun)."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_accelerate_launch_with_bf16_mixed_precision_runs_the_full_layer_fused():
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    env.pop("FFPA_PATCH_DISABLE", None)
    cmd = [sys.executable, "-m", "ffpa_patch", "run", "--", sys.executable, "-m", "accelerate.commands.launch",
           "--cpu", "--num_processes", "1", "--num_machines", "1", "--dynamo_backend", "no", "--mixed_precision", "bf16",
           os.path.join(ROOT, "tests", "accelerate_worker.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "PROCESSES_OK 1 of 1" in proc.stdout, proc.stdout + proc.stderr[-3000:]
