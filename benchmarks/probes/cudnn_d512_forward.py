#!/usr/bin/env python3
"""cuDNN frontend's Hopper D512 attention forward vs ffpa-attn's forward, and a backward handoff check.

At B=1, bf16, head_dim 512, causal, scale 512**-0.5, for each (Hq, Hkv) in --shapes and S in --seqs:
  1. times ffpa-attn's forward (torch.ops.ffpa_attn._fwd_cute) and the SM90 D512 forward template of
     nvidia-cudnn-frontend 1.31.0 (cudnn/sdpa/fwd/kernels/sm90/prefill_d512_f16.py) with CUDA events
     (2 warmup calls, median of 5; compilation excluded), in ms and TF/s (FLOPs = 4*Hq*D*S*(S+1)/2);
  2. at the smallest S: cuDNN's out/LSE vs ffpa's, ffpa's backward (_bwd_cute) fed cuDNN's out+LSE vs
     fed its own, and (unless --no-ref) all of it vs an fp32 torch reference.
Every cuDNN step is in try/except (its error goes into the JSON); the JSON is rewritten after each row.

The template needs nvidia-cutlass-dsl >= 4.7.0 (cudnn/frost/buffers.py CUTEDSL_MIN_VERSION; it imports
cutlass.experimental), but ffpa-attn 0.2.4 pins 4.6.2. So by default the kernel comes prebuilt:
.whl-cudnn/aot/ holds one object per (Hq, Hkv, S), compiled and exported for sm_90a on a CPU machine
with DSL 4.7.0 (--build-aot), loaded here with cutlass.runtime.load_module plus libcutedsl47_shim.so
(the one runtime symbol 4.6.2 lacks). A (Hq, Hkv, S) without an object is JIT-compiled in-process
from the trimmed python extract .whl-cudnn/cudnn, which works only under DSL >= 4.7. Either way the
call is the positional tvm-ffi entry with the arguments cuDNN's dense binder passes
(kernels/sm90/prepared_host.host); the cudnn C++ module is never used.

GPU, from the repo root (.whl-cudnn is git-ignored: name it in the run's carry):
    source .gpu/activate.sh && export PYTHONPATH=.whl-cudnn:$PYTHONPATH
    python benchmarks/probes/cudnn_d512_forward.py --out $OUT/cudnn_d512_forward.json
CPU: --dry-run (imports, argument construction); --build-aot DIR (python 3.12, DSL 4.7.0, no torch).
"""
import argparse
import ctypes
import json
import os
import sys
import time

# Both compiled-plan cache paths import cudnn.frost.device -> cudnn._device -> the C++ module.
os.environ.setdefault("CUDNN_FRONTEND_DISABLE_COMPILED_CACHE", "1")
os.environ.setdefault("CUDNN_FRONTEND_COMPILED_CACHE_INPROCESS_MEMO", "0")
try:
    import torch
except ImportError:  # --build-aot needs no torch
    torch = None

D, SCALE = 512, 512 ** -0.5
SYMBOL = "cudnn_sm90_d512"
AOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".whl-cudnn", "aot")


def err(e):
    return f"{type(e).__name__}: {e}"


def aot_name(hq, hkv, s):
    return f"sm90_d512_bf16_causal_b1_h{hq}_{hkv}_s{s}.o"


def cudnn_template(hq, hkv, s):
    """The SM90 D512 template, specialised as SdpaFwdDslSm90.check_support would for this graph."""
    import cudnn.sdpa.fwd.kernels as kernels
    from cudnn.frost.template_loader import load_template
    from cudnn.frost.tile_dsl.constants import DTYPE_BF16, SCHED_LPT, SCHED_LPT_L2
    from cudnn.sdpa.fwd.config_sm90 import SCALE_POSITIVE, TemplateParams

    # api_dsl._causal_sched_policy (50 MiB = _SCHED_L2_BUDGET_BYTES). Causal with S_q == S_kv is spelled
    # causal=True, bottom_right=None there: bottom-right, the same mask as top-left when square.
    sched = SCHED_LPT_L2 if 50 * 2 ** 20 >= s * 2 * D * 2 else SCHED_LPT
    params = TemplateParams(dtype_qkv=DTYPE_BF16, causal=True, has_lse=True, qh_per_kh=hq // hkv,
                            sched_policy=sched, scale_mode=SCALE_POSITIVE)
    path = os.path.join(os.path.dirname(kernels.__file__), "sm90", "prefill_d512_f16.py")
    return load_template(path, params, tag="sdpa_fwd_sm90_d512")


def compile_args(hq, hkv, s):
    """compile() args for contiguous [1, S, H, D] q/k/v/o and [1, Hq, S] fp32 lse, as check_support derives
    them: (B, H, S, D) element strides with a size-1 axis pinned to D; lse strides with size-1 axes 0."""
    st = lambda h: (D, D, h * D, 1)
    return (1, hq, hkv, s, s, st(hq), st(hkv), st(hkv), st(hq), (0, s if hq > 1 else 0, 1))


def host_args(q, k, v, o, lse, scale):
    """The host's positional arguments but the stream (prepared_host.host order), for the tensors above."""
    _, s, hq, _ = q.shape
    hkv = k.shape[2]
    ptr = lambda t: 0 if t.device.type == "meta" else t.data_ptr()
    rt = lambda h: (D, h * D, D)  # the host takes (batch, seq, head) element strides
    return [ptr(q), ptr(k), ptr(v), ptr(o), ptr(lse), 0, 0, 0, (1, hq, hkv, s, s, 0), rt(hq), rt(hkv), rt(hkv),
            rt(hq), tuple(lse.stride()), lse.numel(), float(scale), 0, None, None, None, 0, s]


def load_cudnn_fn(hq, hkv, s, aot_dir):
    """(positional tvm-ffi function, 'aot'|'jit', compile seconds)."""
    t0, path = time.time(), os.path.join(aot_dir, aot_name(hq, hkv, s))
    import cutlass
    from cutlass import runtime
    if os.path.exists(path):
        if tuple(int(x) for x in cutlass.__version__.split(".")[:2]) < (4, 7):
            ctypes.CDLL(os.path.join(aot_dir, "libcutedsl47_shim.so"), mode=ctypes.RTLD_GLOBAL)
        return getattr(runtime.load_module(path, enable_tvm_ffi=True), SYMBOL), "aot", time.time() - t0
    from cudnn.frost.compiled_cache import positional_entry
    compiled = cudnn_template(hq, hkv, s).compile(*compile_args(hq, hkv, s), target="sm_90a", d_qk=D, d_v=D)
    return positional_entry(compiled) or compiled, "jit", time.time() - t0


def build_aot(out_dir, shapes, seqs):
    import cudnn
    import cutlass
    os.makedirs(out_dir, exist_ok=True)
    made = {}
    for hq, hkv in shapes:
        for s in seqs:
            args = compile_args(hq, hkv, s)
            cudnn_template(hq, hkv, s).compile(*args, target="sm_90a", d_qk=D, d_v=D).export_to_c(
                os.path.join(out_dir, aot_name(hq, hkv, s)), function_name=SYMBOL)
            made[aot_name(hq, hkv, s)] = repr(args)
            print("built", aot_name(hq, hkv, s), flush=True)
    meta = dict(cudnn_frontend=cudnn.__version__, cutlass_dsl=cutlass.__version__, symbol=SYMBOL, compile_args=made)
    json.dump(meta, open(os.path.join(out_dir, "manifest.json"), "w"), indent=1)


def bench(fn):
    """CUDA-event median of 5 calls after 2 warm-ups (benchmarks.common.cuda_ms; imported here, since
    --build-aot runs without torch)."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from benchmarks.common import cuda_ms

    return cuda_ms(fn, warmup=2, iters=5)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def maxabs(a, b):
    return (a.float() - b.float()).abs().max().item()


def reference(q, k, v, dout, scale):
    """fp32 causal attention and its gradients, one query head at a time: out, lse (natural log), dq, dk, dv."""
    _, s, hq, _ = q.shape
    g = hq // k.shape[2]
    f32 = dict(dtype=torch.float32, device=q.device)
    out, dq, lse = torch.empty(q.shape, **f32), torch.empty(q.shape, **f32), torch.empty(1, hq, s, **f32)
    dk, dv = torch.zeros(k.shape, **f32), torch.zeros(v.shape, **f32)
    keep = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    for h in range(hq):
        qh, kh, vh, doh = q[0, :, h].float(), k[0, :, h // g].float(), v[0, :, h // g].float(), dout[0, :, h].float()
        sc = (qh @ kh.T * scale).masked_fill(~keep, float("-inf"))
        lse[0, h] = torch.logsumexp(sc, -1)
        p = torch.exp(sc - lse[0, h][:, None])
        out[0, :, h] = o = p @ vh
        ds = p * (doh @ vh.T - (doh * o).sum(-1, keepdim=True))
        dq[0, :, h] = ds @ kh * scale
        dk[0, :, h // g] += ds.T @ qh * scale
        dv[0, :, h // g] += p.T @ doh
    return out, lse, dq, dk, dv


def check(q, k, v, o_f, lse_f, o_c, lse_c, do_ref):
    """cuDNN vs ffpa forward outputs, ffpa's backward fed each one's out+LSE, and both vs fp32 (o_c None: ffpa only)."""
    names, res = ("dq", "dk", "dv"), {}
    dout = torch.randn_like(q)
    bwd = lambda o, lse: torch.ops.ffpa_attn._bwd_cute(dout, q, k, v, o, lse, SCALE, 1, 0)
    vs = lambda o, lse, g, r: dict(out_rel=rel(o, r[0]), lse_maxabs=maxabs(lse, r[1]),
                                   **{f"{n}_rel": rel(a, b) for n, a, b in zip(names, g, r[2:])})
    grads_f = bwd(o_f, lse_f)
    ref = reference(q, k, v, dout, SCALE) if do_ref else None
    if ref is not None:
        res["ffpa_vs_ref"] = vs(o_f, lse_f, grads_f, ref)
    if o_c is None:
        return res
    try:
        # Both hold the natural-log LSE of the scaled scores, [B, Hq, S] fp32: no conversion (a cuDNN
        # stats_log2 plan would need lse * ln 2).
        res.update(out_maxabs=maxabs(o_c, o_f), out_rel=rel(o_c, o_f), lse_maxabs=maxabs(lse_c, lse_f))
        grads_c = bwd(o_c, lse_c)
        for n, a, b in zip(names, grads_c, grads_f):
            res[f"{n}_rel_cudnn_vs_ffpa_inputs"], res[f"{n}_maxabs_cudnn_vs_ffpa_inputs"] = rel(a, b), maxabs(a, b)
        if ref is not None:
            res["cudnn_vs_ref"] = vs(o_c, lse_c, grads_c, ref)
    except Exception as e:
        res["cudnn_error"] = err(e)
    return res


def row_for(row, args, check_here, save):
    hq, hkv, s = row["hq"], row["hkv"], row["s"]
    flops = 4 * hq * D * s * (s + 1) / 2
    gen = torch.Generator(device="cuda").manual_seed(s * 1000 + hq * 10 + hkv)
    q = torch.randn(1, s, hq, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(1, s, hkv, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    ffpa = lambda: torch.ops.ffpa_attn._fwd_cute(q, k, v, SCALE, 1, 1)
    t0 = time.time()
    o_f, lse_f = ffpa()
    torch.cuda.synchronize()
    row["ffpa_first_call_s"] = round(time.time() - t0, 2)
    row["ffpa_ms"] = bench(ffpa)
    row["ffpa_tflops"] = flops / row["ffpa_ms"] / 1e9
    save()  # a sticky CUDA error in the cuDNN call would end the process; keep what ffpa gave
    o_c = lse_c = None
    try:
        fn, row["cudnn_mode"], t = load_cudnn_fn(hq, hkv, s, args.aot_dir)
        row["cudnn_load_or_compile_s"] = round(t, 2)
        o_c, lse_c = torch.empty_like(q), torch.empty(1, hq, s, dtype=torch.float32, device="cuda")
        call = host_args(q, k, v, o_c, lse_c, SCALE)
        cudnn = lambda: fn(*call, torch.cuda.current_stream().cuda_stream)
        row["cudnn_ms"] = bench(cudnn)  # the last call leaves o_c / lse_c for check()
        row["cudnn_tflops"] = flops / row["cudnn_ms"] / 1e9
        # one more call into NaN-filled buffers: freed FFPA outputs of these very inputs may sit in the
        # memory torch.empty handed out, so an unpoisoned buffer could "match" without being written
        o_c.fill_(float("nan"))
        lse_c.fill_(float("nan"))
        cudnn()
        torch.cuda.synchronize()
        row["cudnn_wrote_all"] = bool(not o_c.isnan().any() and not lse_c.isnan().any())
    except Exception as e:
        row["cudnn_error"], o_c = err(e), None
    if check_here:
        row["check"] = check(q, k, v, o_f, lse_f, o_c, lse_c, not args.no_ref)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--shapes", nargs="+", default=["32,4", "16,2", "16,1"], help="Hq,Hkv pairs")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT") or ".", "cudnn_d512_forward.json"))
    ap.add_argument("--aot-dir", default=os.path.normpath(AOT_DIR))
    ap.add_argument("--no-ref", action="store_true", help="skip the fp32 torch reference")
    ap.add_argument("--dry-run", action="store_true", help="CPU: imports and argument construction only")
    ap.add_argument("--build-aot", metavar="DIR", help="CPU, DSL >= 4.7: compile and export the objects")
    args = ap.parse_args()
    shapes, seqs = [tuple(int(x) for x in s.split(",")) for s in args.shapes], sorted(args.seqs)
    if args.build_aot:
        return build_aot(args.build_aot, shapes, seqs)
    report, ok = dict(python=sys.version.split()[0], torch=torch.__version__, rows=[]), {}
    for name, mod in (("cutlass_dsl", "cutlass"), ("ffpa_attn", "ffpa_attn.cute")):  # the latter registers the ops
        try:
            report[name], ok[name] = getattr(__import__(mod), "__version__", "ok"), True
        except Exception as e:
            report[name], ok[name] = err(e), False
    if args.dry_run:
        hq, hkv, s = *shapes[0], seqs[0]
        try:
            report["cudnn_template"] = cudnn_template(hq, hkv, s).__name__
        except Exception as e:
            report["cudnn_template"] = err(e)
        try:  # loads the prebuilt object (no GPU needed), else JIT-compiles (DSL >= 4.7; no GPU needed either)
            report["cudnn_fn"] = repr(load_cudnn_fn(hq, hkv, s, args.aot_dir))
        except Exception as e:
            report["cudnn_fn"] = err(e)
        meta = lambda *shape, dt=torch.bfloat16: torch.empty(*shape, dtype=dt, device="meta")
        q, kv, lse = meta(1, s, hq, D), meta(1, s, hkv, D), meta(1, hq, s, dt=torch.float32)
        report["compile_args"] = repr(compile_args(hq, hkv, s))
        report["host_args"] = repr(host_args(q, kv, kv, q, lse, SCALE))
        return print(json.dumps(report, indent=1))
    if not ok["ffpa_attn"]:
        json.dump(report, open(args.out, "w"), indent=1)
        sys.exit(f"ffpa-attn does not import: {report['ffpa_attn']}")
    torch.backends.cuda.matmul.allow_tf32 = False
    report["device"] = torch.cuda.get_device_name()
    save = lambda: json.dump(report, open(args.out, "w"), indent=1)
    for hq, hkv in shapes:
        for s in seqs:
            report["rows"].append(dict(hq=hq, hkv=hkv, s=s))
            row_for(report["rows"][-1], args, s == seqs[0], save)
            save()
            print(json.dumps(report["rows"][-1]), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
