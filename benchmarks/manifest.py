"""One GPU run's manifest.json: the commit under test ($COMMIT), the cards, the versions and the driver.

    python -m benchmarks.manifest OUT_DIR DRIVER     (from the repository root; kept if already there)
"""
import json
import os
import subprocess
import sys

from benchmarks.common import env_info


def main(out_dir: str, driver: str) -> None:
    path = os.path.join(out_dir, "manifest.json")
    if os.path.exists(path):
        return
    query = ["nvidia-smi", "--query-gpu=name,memory.total,power.limit,driver_version", "--format=csv,noheader"]
    try:
        gpus = subprocess.run(query, capture_output=True, text=True).stdout.strip().splitlines()
    except FileNotFoundError:  # no NVIDIA driver here
        gpus = []
    manifest = {"commit": os.environ.get("COMMIT", "unknown"), "gpu": gpus[0] if len(gpus) == 1 else gpus,
                "env": env_info(), "driver": driver}
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:3])
