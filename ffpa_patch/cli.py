"""ffpa-patch demo | status [--check] [--json] [--config PATH] | run CMD | doctor | startup-path | sitecustomize-path"""
from __future__ import annotations

import argparse
import json
import os
import sys

CHECK_HINT = "`ffpa-patch status --check` imports Transformers and runs the kernel checks (5-15 s)"

#: `ffpa-patch status` exit codes, so a launch script can gate on them (README, "Turning it on").
READY, CANNOT_RUN_HERE, OFF, UNSUPPORTED = 0, 3, 4, 5
EXIT_CODES = {
    READY: "active, and the fused kernels run here",
    CANNOT_RUN_HERE: "active, but the fused kernels cannot run here (no suitable GPU, or a kernel package missing): stock SDPA",
    OFF: "not applied: disabled, misconfigured, or a patch failed",
    UNSUPPORTED: "not applied: installed versions outside the supported range",
}


def exit_code(state: str, kernels_run: bool) -> int:
    from ffpa_patch.lifecycle import ACTIVE, UNSUPPORTED_VERSIONS

    if state == UNSUPPORTED_VERSIONS:
        return UNSUPPORTED
    if state != ACTIVE:
        return OFF
    return READY if kernels_run else CANNOT_RUN_HERE


def _status(as_json: bool, config: str | None = None, check: bool = False) -> int:
    """Fast by default: versions, patch gates and the GPU from package metadata and the driver's
    files, with no torch or Transformers import (those take 5-15 s). ``check`` (and ``config``)
    imports Transformers' Gemma4 so the patches are really applied, and asks the kernels whether
    they run here."""
    import importlib

    import ffpa_patch
    from ffpa_patch import hf

    if config and not os.path.exists(config):  # before the 5-20 s of imports a check costs
        print(f"ffpa-patch status: --config {config}: no such file or folder (a local model folder or config.json)", file=sys.stderr)
        return 2
    check = check or bool(config)
    if check:
        for name in hf.modules_to_import():
            try:
                importlib.import_module(name)  # so status shows what is patched, not "waiting"
            except Exception:
                pass
    st = ffpa_patch.status()
    data = st.as_dict()
    data["checked"] = check
    if check:
        data["kernels"], kernels_run = _kernel_report()
        data["d512_backward"] = _backward_report()
        verdict = "the fused kernels run here" if kernels_run else "the fused kernels cannot run here: see the kernel lines"
        data["transformers_internals"] = _internals()
    else:
        from ffpa_patch import machine

        data["kernels"] = _kernel_packages(st)
        kernels_run, verdict = machine.fused_kernels_here()
    if config:
        from ffpa_patch.plan import layer_plan

        try:
            text_config = hf.load_text_config(config)
        except Exception as exc:
            print(f"ffpa-patch status: --config {config}: not a readable model config ({type(exc).__name__}: {exc})", file=sys.stderr)
            return 2
        from ffpa_patch.names import Backend

        data["plan"] = {b.value: layer_plan(text_config, b.value) for b in Backend}
    code = exit_code(st.state, kernels_run)
    data["fused_kernels_here"] = {"run": kernels_run, "why": verdict}
    data["exit_code"] = code
    if as_json:
        print(json.dumps(data, indent=1))
        return code
    print(st)
    print(f"  models: Gemma 4 {hf.MODELS}")
    print("  kernels on this machine:" if check else "  kernel packages:")
    for name, why in data["kernels"].items():
        print(f"    {name:<34} {why or 'usable'}")
    print(f"  fused kernels here: {verdict}" + ("" if check else f" (judged by name; {CHECK_HINT})"))
    if check:
        print(f"  full layers' backward (FFPA, head_dim 512): {data['d512_backward']}")
    if check:
        problems = data["transformers_internals"]
        print("  Transformers internals ffpa_patch relies on: " + ("all found" if not problems else ""))
        for line in problems:
            print(f"    MISSING: {line}")
    for backend, rows in data.get("plan", {}).items():
        print(f'  {config} with attn_implementation="{backend}" (bf16 training prefill, no padding):')
        for r in rows:
            print(f"    {r['layers']:>3} {r['layer']:<7} layers (head_dim {r['head_dim']}) -> {r['kernel']}: {r['reason']}")
    print(f"  exit code {code}: {EXIT_CODES[code]}")
    return code


def _kernel_packages(st) -> dict:
    """What the fast view can say about each kernel package: installed or not (package metadata)."""
    from ffpa_patch.kernels import CATALOG
    from ffpa_patch.versions import requirement

    found = {v.name: v for v in st.versions}
    rows = {}
    for info in CATALOG:  # every row, as `status --check` lists them
        v = found.get(info.package)
        if info.package == "torch":
            rows[info.label] = "part of torch"
        else:
            rows[info.label] = f"{v.installed} installed" if v is not None and v.installed else f"not installed (pip install {requirement(info.package)})"
        if not info.fused:
            rows[info.label] += " (does not count as fused)"
    return rows


def _kernel_report() -> tuple[dict, bool]:
    """Each kernel of the table asked whether it takes a bf16 call of its layer type on this machine,
    and whether one of the full layers' kernels does (what "the fused kernels run here" means)."""
    try:
        import torch

        from ffpa_patch.kernels import active
        from ffpa_patch.names import Layer

        dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        rows = {k.info.label: (k.info, k.unsupported(dev, torch.bfloat16, k.info.head_dim)) for k in active().kernels}
        fused_full = any(why is None and info.serves == Layer.FULL and info.fused for info, why in rows.values())
        return {label: why if why is not None or info.fused else "runs, but does not count as fused"
                for label, (info, why) in rows.items()}, fused_full
    except Exception as exc:
        return {"torch": f"not importable ({exc})"}, False


def _backward_report() -> str:
    """Which backward the FFPA full layers run on this machine (FFPA_PATCH_D512_BACKWARD, the GPU,
    triton); a call's shape can still send it to ffpa-attn's, which status() then counts."""
    try:
        import torch

        from ffpa_patch.kernels import ffpa

        dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        if problem := ffpa.unsupported(dev, torch.bfloat16, 512):
            return f"none: FFPA does not run here ({problem})"
        why = ffpa.triton_backward_unavailable(dev)
        return "ffpa_patch's Triton kernel (kernels/d512_bwd.py)" if why is None else f"ffpa-attn's ({why})"
    except Exception as exc:
        return f"could not check: {type(exc).__name__}: {exc}"


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


def _writable_folder(path: str) -> str | None:
    """Why ``path`` cannot be the folder `demo --save` writes, or None; nothing is made here."""
    if os.path.exists(path) and not os.path.isdir(path):
        return "exists and is not a folder"
    parent = os.path.abspath(path)
    while not os.path.exists(parent):  # the folder it would be made in
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return f"cannot make a folder there ({parent} is a file)"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot write there ({parent} is not writable)"
    return None


def _positive(text: str) -> int:
    """argparse type: a whole number of at least 1 (a bad value exits 2 with a message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def main(argv: list[str] | None = None) -> int:
    from ffpa_patch import __version__

    codes = "; ".join(f"{c} = {what}" for c, what in EXIT_CODES.items())
    ap = argparse.ArgumentParser(prog="ffpa-patch", description="FFPA attention for stock Transformers Gemma4")
    ap.add_argument("--version", action="version", version=f"ffpa-patch {__version__}")
    sub = ap.add_subparsers(dest="cmd")
    demo = sub.add_parser("demo", help="train a small random Gemma4 a few steps, stock then patched: times, routes, loss difference")
    demo.add_argument("--steps", type=_positive, default=None, help="training steps per side (default: 5 on a GPU, 3 on CPU)")
    demo.add_argument("--seq", type=_positive, default=None, help="tokens per step (default: 4096 on a GPU, 256 on CPU)")
    demo.add_argument("--layers", type=_positive, default=6, help="decoder layers (5 sliding : 1 full, like the released models)")
    demo.add_argument("--save", metavar="DIR", help="also write the demo's model to DIR (config + weights), a local "
                                                    "folder from_pretrained takes: no download")
    st = sub.add_parser("status", help="versions, patches, kernels, routing counts; exits 0 when the fused kernels will run",
                        epilog=f"exit codes: {codes}; 1 = ffpa-patch itself failed, 2 = bad arguments")
    st.add_argument("--json", action="store_true", help="print everything as one JSON object (exit code included)")
    st.add_argument("--check", action="store_true",
                    help="import Transformers' Gemma4 and the kernels: the patches applied, whether the kernels run here (5-15 s)")
    st.add_argument("--config", help="a local model folder or config.json: show where each layer type would go (never downloads; implies --check)")
    run = sub.add_parser("run", help="run CMD with ffpa_patch active in every Python process",
                         usage="ffpa-patch run [--] CMD [ARGS...]",
                         description="Run CMD with the bundled sitecustomize first on PYTHONPATH, so every Python "
                                     "process it starts (every torchrun rank) imports ffpa_patch. Put `--` before "
                                     "CMD when CMD has options of its own: ffpa-patch run -- torchrun --nproc-per-node 8 train.py")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD", help="the command and its arguments")
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
    if args.cmd == "demo":
        from ffpa_patch.demo import run as run_demo

        if args.save and (problem := _writable_folder(args.save)):  # before the seconds the demo takes
            print(f"ffpa-patch demo: --save {args.save}: {problem}", file=sys.stderr)
            return 2
        return run_demo(steps=args.steps, seq=args.seq, layers=args.layers, save=args.save)
    if args.cmd == "doctor":
        from ffpa_patch.doctor import run

        code, lines = run()
        print("\n".join(f"ffpa-patch doctor: {line}" for line in lines))
        return code
    if args.cmd == "startup-path":
        print(os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup.py"))
        return 0
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    return _run(cmd)
