"""Run a command while sampling the GPU's SM clock and power (nvidia-smi, read-only).

python benchmarks/probes/gpu_clocks.py --out clocks.json -- python benchmarks/e2e.py ...

Why: the same GEMM kernels ran 5-10% slower in the ffpa step than in the stock
one (README, "Where the GPU time goes"). A denser step draws more power, and an
H200 at its power limit lowers its clock; these samples show whether it did.
Only busy samples (utilization >= --busy %) count, so JIT compiles and model
construction do not dilute the medians. Nothing about the GPU is changed.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile

FIELDS = ["utilization.gpu", "clocks.sm", "clocks.max.sm", "power.draw", "power.limit", "temperature.gpu",
          "clocks_event_reasons.active"]


def query_fields() -> list[str]:
    """The fields this nvidia-smi knows (the throttle-reason field was renamed across drivers)."""
    fields = []
    for field in FIELDS:
        probe = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader", "-i", "0"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and "Field" not in probe.stdout:
            fields.append(field)
    return fields


def number(text: str) -> float | None:
    try:
        return float(text.strip().split()[0])
    except (ValueError, IndexError):
        return None


def summarise(rows: list[dict], busy: float) -> dict:
    busy_rows = [r for r in rows if (number(r.get("utilization.gpu", "")) or 0) >= busy]
    out = {"samples": len(rows), "busy_samples": len(busy_rows), "busy_threshold_pct": busy}
    for field in ("clocks.sm", "clocks.max.sm", "power.draw", "power.limit", "temperature.gpu"):
        values = [v for v in (number(r.get(field, "")) for r in busy_rows) if v is not None]
        if values:
            out[field] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    reasons: dict[str, int] = {}
    for r in busy_rows:
        key = r.get("clocks_event_reasons.active", "").strip()
        if key:
            reasons[key] = reasons.get(key, 0) + 1
    if reasons:
        out["event_reasons"] = reasons
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON summary (the raw samples go next to it as .csv)")
    ap.add_argument("--interval-ms", type=int, default=100)
    ap.add_argument("--busy", type=float, default=90.0, help="utilization %% from which a sample counts")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command given after --")
    fields = query_fields()
    raw = args.out.rsplit(".", 1)[0] + ".csv"
    with open(raw, "w") as sink, tempfile.TemporaryFile("w+") as err:
        sink.write(",".join(fields) + "\n")
        sink.flush()
        sampler = subprocess.Popen(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader",
                                    "-i", "0", f"--loop-ms={args.interval_ms}"], stdout=sink, stderr=err)
        try:
            rc = subprocess.call(command)
        finally:
            sampler.terminate()
            sampler.wait()
    with open(raw) as f:
        rows = list(csv.DictReader(f, skipinitialspace=True))
    summary = {"command": command, "rc": rc, **summarise(rows, args.busy)}
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps({k: v for k, v in summary.items() if k != "command"}), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
