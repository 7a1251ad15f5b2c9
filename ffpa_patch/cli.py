"""ffpa-patch run | status [--json] [--config PATH] | doctor | startup-path | sitecustomize-path"""
from __future__ import annotations

import argparse
import json
import os
import sys


CHECK_HINT = "fast view, nothing imported: `ffpa-patch status --check` imports Transformers and the kernels (5-15 s)"


def _status(as_json: bool, config: str | None = None, check: bool = False) -> int:
    """Fast by default: versions and patch gates from package metadata, with no torch or
    Transformers import (those take 5-15 s). ``check`` (and ``config``) imports Transformers'
    Gemma4 so the patches are really applied, and asks the kernels whether they run here."""
    import importlib

    import ffpa_patch

    check = check or bool(config)
    if check:
        for name in ("transformers.modeling_utils", "transformers.models.gemma4.modeling_gemma4"):
            try:
                importlib.import_module(name)  # so status shows what is patched, not "waiting"
            except Exception:
                pass
    st = ffpa_patch.status()
    data = st.as_dict()
    data["checked"] = check
    data["kernels"] = _kernel_report() if check else _kernel_packages(st)
    if check:
        data["transformers_internals"] = _internals()
    if config:
        from ffpa_patch.plan import layer_plan, load_text_config

        if not os.path.exists(config):
            print(f"ffpa-patch status: --config {config}: no such file or folder (a local model folder or config.json)", file=sys.stderr)
            return 2
        try:
            text_config = load_text_config(config)
        except Exception as exc:
            print(f"ffpa-patch status: --config {config}: not a readable model config ({type(exc).__name__}: {exc})", file=sys.stderr)
            return 2
        data["plan"] = {b: layer_plan(text_config, b) for b in ("ffpa", "sdpa")}
    if as_json:
        print(json.dumps(data, indent=1))
        return 0
    print(st)
    print("  kernels on this machine:" if check else f"  kernel packages ({CHECK_HINT}):")
    for name, why in data["kernels"].items():
        print(f"    {name:<11} {why or 'usable'}")
    if check:
        problems = data["transformers_internals"]
        print("  Transformers internals ffpa_patch relies on: " + ("all found" if not problems else ""))
        for line in problems:
            print(f"    MISSING: {line}")
    for backend, rows in data.get("plan", {}).items():
        print(f'  {config} with attn_implementation="{backend}" (bf16 training prefill, no padding):')
        for r in rows:
            print(f"    {r['layers']:>3} {r['layer']:<7} layers (head_dim {r['head_dim']}) -> {r['kernel']}: {r['reason']}")
    return 0


def _label(name: str) -> str:
    from ffpa_patch.kernels import SERVES

    layer, head_dim = SERVES[name]
    return f"{name} ({layer} layers, D={head_dim})"


def _kernel_packages(st) -> dict:
    """What the fast view can say about each kernel: installed or not (package metadata)."""
    from ffpa_patch.kernels import PACKAGES

    found = {v.name: v for v in st.versions}
    rows = {}
    for name, dist in PACKAGES.items():
        v = found.get(dist)
        if dist == "torch":
            continue
        rows[_label(name)] = f"{dist} {v.installed} installed; not checked" if v is not None and v.installed else f"{dist} not installed"
    return rows


def _kernel_report() -> dict:
    """Each kernel of the table asked whether it takes a bf16 call of its layer type on this machine."""
    try:
        import torch

        from ffpa_patch.kernels import SERVES, active

        dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        kernels = active()
        return {_label(k.name): k.unsupported(dev, torch.bfloat16, SERVES[k.name][1]) for k in (kernels.full, kernels.sliding, kernels.flex)}
    except Exception as exc:
        return {"torch": f"not importable ({exc})"}


def _internals() -> list[str]:
    try:
        from ffpa_patch import hf

        return hf.check()
    except Exception as exc:
        return [f"could not check: {type(exc).__name__}: {exc}"]


def _bootstrap() -> str:
    """The installed package's sitecustomize folder (sitecustomize_example/ is the clone's copy)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")


def _run(cmd: list[str]) -> int:
    if not cmd:
        print("usage: ffpa-patch run -- CMD [ARGS...]", file=sys.stderr)
        return 2
    boot = _bootstrap()
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (boot, os.environ.get("PYTHONPATH", "")) if p)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:  # not found, not executable
        print(f"ffpa-patch run: cannot run {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127


def main(argv: list[str] | None = None) -> int:
    from ffpa_patch import __version__

    ap = argparse.ArgumentParser(prog="ffpa-patch", description="FFPA attention for stock Transformers Gemma4")
    ap.add_argument("--version", action="version", version=f"ffpa-patch {__version__}")
    sub = ap.add_subparsers(dest="cmd")
    st = sub.add_parser("status", help="versions, patches, kernels, routing counts")
    st.add_argument("--json", action="store_true")
    st.add_argument("--check", action="store_true",
                    help="import Transformers' Gemma4 and the kernels: the patches applied, whether the kernels run here (5-15 s)")
    st.add_argument("--config", help="a local model folder or config.json: show where each layer type would go (never downloads; implies --check)")
    run = sub.add_parser("run", help="run CMD with ffpa_patch active in every Python process")
    run.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("startup-path", help="print the PYTHONSTARTUP file's path")
    sub.add_parser("sitecustomize-path", help="print the folder to put first on PYTHONPATH (what `run` does)")
    sub.add_parser("doctor", help="run one small FFPA forward/backward against the fp32 reference")
    args = ap.parse_args(argv)
    if args.cmd is None:
        ap.print_help()
        return 2
    if args.cmd == "sitecustomize-path":
        print(_bootstrap())
        return 0
    if args.cmd == "status":
        return _status(args.json, args.config, args.check)
    if args.cmd == "doctor":
        from ffpa_patch.doctor import run

        ok, lines = run()
        print("\n".join(f"ffpa-patch doctor: {line}" for line in lines))
        return 0 if ok else 1
    if args.cmd == "startup-path":
        print(os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup.py"))
        return 0
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    return _run(cmd)
