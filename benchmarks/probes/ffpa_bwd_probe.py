#!/usr/bin/env python3
"""Probe the ffpa-attn 0.2.4 backward at head_dim=512 on an H200 (sm90).

Shapes: B=1, Hq=32, Hkv=4, D=512, bf16, causal, S in {8192, 16384, 32768}.

What this script does:
  * The baseline is the public API (ffpa_attn_func(..., backend="cutedsl")),
    which on sm90 at D=512 runs the SM90 SplitD kernels: preprocess, dKdV, dQ.
    Their tiles (64x64), stages, and threads are hard-coded; the source has no
    knob for them.
  * The alternatives are the other backward implementations the package ships
    that the source accepts at D=512 on sm90:
      - the same SM90 kernels through the low-level BHND op, and through the
        BNHD launcher directly (no layout copies)
      - the CuTeDSL SM80 Split-D backward (generic fallback; its
        _validate_sm80_arch accepts sm>=80)
      - the Triton backward with each of its TritonBackend knobs (enable_tma,
        split_launch, persist_dkdv, enable_ws, preprocess_d_chunk, autotune, and
        the FFPA_TRITON_BWD_FUSE_DKDVDQ env var)
      - the SDPA mem-efficient backward wrapper
    Each of these gets the CuTeDSL forward's O/LSE. Both use natural-log LSE of
    the scaled scores. The public API won't pair a cutedsl forward with a
    non-cutedsl backward (functional.py _resolve_backend_pair), so those
    wrappers are called directly.
  * Timing uses torch.cuda.Event: 2 warmup calls, then 5 reps, and the median
    is reported. The first call, including JIT, is timed separately.
  * Correctness: each setting's dq/dk/dv is compared with the baseline's (max
    abs diff). At S=8192 it is also compared with a chunked fp32 torch
    reference.
  * Each (setting, seq) runs inside its own try/except. Results are written to
    $OUT/ffpa_bwd_probe.json after every step. A table is printed at the end.
  * Runtime budget: PROBE_BUDGET_S (default 240 s). No new (setting, seq) step
    starts after the budget is used up. A JIT compile already running can't be
    interrupted.

Env knobs: OUT, FFPA_BUNDLE_SITE (default /tmp/ffpa-gpu-bundle/site),
PROBE_BUDGET_S, PROBE_SEQS (e.g. "8192,16384"), PROBE_SETTINGS (comma list of
setting names, in the order to run them; the baseline always runs first),
PROBE_REF (1/0, fp32 reference at 8k), PROBE_WARMUP, PROBE_REPS.
"""

import os
import sys
import json
import math
import time
import statistics
import traceback

T0 = time.time()
BUDGET_S = float(os.environ.get("PROBE_BUDGET_S", "240"))
OUT_DIR = os.environ.get("OUT", "/tmp") or "/tmp"
OUT_JSON = os.path.join(OUT_DIR, "ffpa_bwd_probe.json")
WARMUP = int(os.environ.get("PROBE_WARMUP", "2"))
REPS = int(os.environ.get("PROBE_REPS", "5"))
SEQS = [int(s) for s in os.environ.get("PROBE_SEQS", "8192,16384,32768").split(",") if s.strip()]
DO_REF = os.environ.get("PROBE_REF", "1") not in ("0", "", "false", "False")
REF_SEQ = 8192
B, HQ, HKV, D = 1, 32, 4, 512

# Add the extracted bundle with site.addsitedir so nvidia_cutlass_dsl_packages.pth
# runs; it puts cutlass' dsl_packages on sys.path.
SITE_DIR = os.environ.get("FFPA_BUNDLE_SITE", "/tmp/ffpa-gpu-bundle/site")
if os.path.isdir(SITE_DIR):
    import site as _site

    _site.addsitedir(SITE_DIR)
    if SITE_DIR in sys.path:
        sys.path.remove(SITE_DIR)
    sys.path.insert(0, SITE_DIR)

os.makedirs(OUT_DIR, exist_ok=True)

import torch  # noqa: E402

RESULTS = {
    "meta": {
        "script": "probe_bwd.py",
        "shape": {"B": B, "Hq": HQ, "Hkv": HKV, "D": D, "dtype": "bf16", "causal": True},
        "seqs": SEQS,
        "warmup": WARMUP,
        "reps": REPS,
        "budget_s": BUDGET_S,
        "flops_formula": "fwd = 4*B*Hq*S*S*D/2 (causal); bwd = 2.5*fwd; fwd+bwd = 3.5*fwd",
        "site_dir": SITE_DIR if os.path.isdir(SITE_DIR) else None,
    },
    "source_facts": {
        "sm90_bwd_tiles": "SM90_BWD_TILE_M=64, SM90_BWD_TILE_N=64 hard-coded (cute/_utils.py:29-30; used at cute/_ffpa_bwd_sm90.py:191-193)",
        "sm90_bwd_kernel_consts": "d_chunk=256, 2 d_passes, 384 threads (1 producer WG + 2 MMA WGs), A_stage=2, regs 224/224/56 for dKdV, 216/216/56 for dQ; constructor args are only tile_m/tile_n",
        "dkdv_recompute": "dKdV kernel recomputes S and dP once per d_pass (2x); dQ kernel recomputes S and dP again -> about 1.8x the nominal 2.5x-fwd MMA FLOPs",
        "no_atomics": "SM90 D512 bwd: no atomics; GQA reduced in-CTA by looping q-heads; dQ written bf16 from registers (no fp32 dq_accum / postprocess)",
        "scheduler": "SingleTileScheduler ignores lpt=True; grid = (S/64, heads, B) launched in blockIdx order",
        "jit_key_sm90_bwd": "(kind, dtype, hd, hdv, causal, tile_m, tile_n, varlen_q, varlen_k, qhead_per_kvhead, device_arch, cute_arch_key); seqlen not in key",
    },
    "reference": {},
    "results": [],
    "skipped": [],
    "errors_global": [],
}


def _elapsed():
    return time.time() - T0


def _over_budget():
    return _elapsed() > BUDGET_S


def _dump():
    tmp = OUT_JSON + ".tmp"
    with open(tmp, "w") as f:
        json.dump(RESULTS, f, indent=1, default=str)
    os.replace(tmp, OUT_JSON)


def _fwd_flops(S):
    return 4.0 * B * HQ * S * S * D / 2.0


def _tflops(flops, ms):
    if ms is None or ms <= 0:
        return None
    return flops / (ms * 1e-3) / 1e12


def _time_cuda(fn, warmup=WARMUP, reps=REPS):
    """First call (with sync) timed wall-clock; then warmup, then reps with events."""
    t = time.time()
    out = fn()
    torch.cuda.synchronize()
    first_s = time.time() - t
    del out
    for _ in range(max(0, warmup - 1)):  # first call already counts as one warmup
        out = fn()
        del out
    torch.cuda.synchronize()
    times = []
    last = None
    for i in range(reps):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        if last is not None:
            del last
            last = None
        s.record()
        last = fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times), times, first_s, last


def _maxabs(a, b):
    return (a.float() - b.float()).abs().max().item()


def _relfro(a, ref):
    num = (a.float() - ref.float()).norm().item()
    den = ref.float().norm().item()
    return num / den if den > 0 else None


def _compare(grads, ref, prefix):
    out = {}
    for name, a, r in zip(("dq", "dk", "dv"), grads, ref):
        if a is None or r is None:
            continue
        if tuple(a.shape) != tuple(r.shape):
            out[f"{prefix}_{name}_shape_mismatch"] = [list(a.shape), list(r.shape)]
            continue
        out[f"{prefix}_max_abs_{name}"] = _maxabs(a, r)
        out[f"{prefix}_relfro_{name}"] = _relfro(a, r)
        out[f"{prefix}_finite_{name}"] = bool(torch.isfinite(a).all().item())
    return out


# ----------------------------------------------------------------------------
# Imports (each wrapped so that one missing piece doesn't kill the run)
# ----------------------------------------------------------------------------
IMPORT_ERRORS = {}
try:
    import ffpa_attn
    from ffpa_attn import ffpa_attn_func

    RESULTS["meta"]["ffpa_attn_version"] = getattr(ffpa_attn, "__version__", None)
    RESULTS["meta"]["ffpa_attn_file"] = getattr(ffpa_attn, "__file__", None)
except Exception:
    IMPORT_ERRORS["ffpa_attn"] = traceback.format_exc()
try:
    # functional.py swallows cute import errors, so import cute explicitly
    import ffpa_attn.cute as fcute
    from ffpa_attn.cute._ffpa_bwd_sm90 import _ffpa_attn_backward_sm90
    from ffpa_attn.cute._ffpa_fwd_sm90 import _ffpa_attn_forward_sm90
except Exception:
    IMPORT_ERRORS["ffpa_attn.cute"] = traceback.format_exc()
try:
    from ffpa_attn.cute._ffpa_bwd_sm80 import _ffpa_attn_backward_sm80
except Exception:
    IMPORT_ERRORS["ffpa_attn.cute._ffpa_bwd_sm80"] = traceback.format_exc()
try:
    from ffpa_attn.triton import _ffpa_attn_backward_triton
except Exception:
    IMPORT_ERRORS["ffpa_attn.triton"] = traceback.format_exc()
try:
    from ffpa_attn.aten import _efficient_attn_backward_aten
except Exception:
    IMPORT_ERRORS["ffpa_attn.aten"] = traceback.format_exc()
RESULTS["meta"]["import_errors"] = IMPORT_ERRORS

try:
    import importlib.metadata as _md

    for pkg in ("nvidia-cutlass-dsl", "quack-kernels", "triton", "apache-tvm-ffi"):
        try:
            RESULTS["meta"][f"ver_{pkg}"] = _md.version(pkg)
        except Exception:
            pass
except Exception:
    pass
RESULTS["meta"]["torch"] = torch.__version__
if torch.cuda.is_available():
    RESULTS["meta"]["device"] = torch.cuda.get_device_name(0)
    RESULTS["meta"]["capability"] = list(torch.cuda.get_device_capability(0))
_dump()

if not torch.cuda.is_available():
    print("No CUDA device; nothing to do.")
    RESULTS["errors_global"].append("no CUDA device")
    _dump()
    sys.exit(1)

DEV = torch.device("cuda", 0)
DT = torch.bfloat16
SCALE = 1.0 / math.sqrt(D)
try:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
except Exception:
    pass

# ----------------------------------------------------------------------------
# Inputs / shared forward state per seq
# ----------------------------------------------------------------------------
_INPUTS = {}
_FWD = {}
_DEFAULT_GRADS = {}


def get_inputs(S):
    if S not in _INPUTS:
        g = torch.Generator(device=DEV)
        g.manual_seed(1234 + S)
        q = torch.randn(B, HQ, S, D, device=DEV, dtype=DT, generator=g)
        k = torch.randn(B, HKV, S, D, device=DEV, dtype=DT, generator=g)
        v = torch.randn(B, HKV, S, D, device=DEV, dtype=DT, generator=g)
        do = torch.randn(B, HQ, S, D, device=DEV, dtype=DT, generator=g)
        _INPUTS[S] = (q, k, v, do)
    return _INPUTS[S]


def cute_fwd_bhnd(q, k, v):
    return fcute._ffpa_attn_forward_cute(q, k, v, SCALE, True, return_lse=True)


def get_fwd(S):
    """CuTeDSL forward O [B,H,S,D] and lse [B,H,S] (natural log), computed once per seq."""
    if S not in _FWD:
        q, k, v, _ = get_inputs(S)
        with torch.no_grad():
            O, lse = cute_fwd_bhnd(q, k, v)
        torch.cuda.synchronize()
        _FWD[S] = (O, lse)
    return _FWD[S]


def _to_nhd(t):
    return t.transpose(1, 2).contiguous()


def _to_hnd(t):
    return t.transpose(1, 2)


# ----------------------------------------------------------------------------
# fp32 reference (chunked per query head), S=8192 only
# ----------------------------------------------------------------------------
def reference_fp32(q, k, v, do):
    Bq, H, S, Dd = q.shape
    G = H // k.shape[1]
    dq = torch.empty(Bq, H, S, Dd, device=DEV, dtype=torch.float32)
    dk = torch.zeros(Bq, k.shape[1], S, Dd, device=DEV, dtype=torch.float32)
    dv = torch.zeros_like(dk)
    o = torch.empty(Bq, H, S, Dd, device=DEV, dtype=torch.float32)
    keep = torch.ones(S, S, device=DEV, dtype=torch.bool).tril_()
    for b in range(Bq):
        for h in range(H):
            g = h // G
            qh = q[b, h].float()
            kh = k[b, g].float()
            vh = v[b, g].float()
            doh = do[b, h].float()
            s = (qh @ kh.T).mul_(SCALE)
            s.masked_fill_(~keep, float("-inf"))
            p = torch.softmax(s, dim=-1)
            del s
            oh = p @ vh
            dp = doh @ vh.T
            di = (doh * oh).sum(-1, keepdim=True)
            ds = p * (dp - di)
            del dp
            dq[b, h] = (ds @ kh) * SCALE
            dk[b, g] += (ds.T @ qh) * SCALE
            dv[b, g] += p.T @ doh
            o[b, h] = oh
            del p, ds, oh
    return o, dq, dk, dv


# ----------------------------------------------------------------------------
# Settings. Each builds (fwd_fn, bwd_fn, fwdbwd_fn, to_bhnd) for a seq.
#   fwd_fn()    -> anything (timed)
#   bwd_fn()    -> (dq, dk, dv) in native layout (timed; uses precomputed O/lse)
#   fwdbwd_fn() -> (dq, dk, dv)
#   to_bhnd(grads) -> (dq, dk, dv) in [B,H,S,D]
# ----------------------------------------------------------------------------
def _ident(gr):
    return tuple(gr[:3])


def _nhd_back(gr):
    return tuple(_to_hnd(t) for t in gr[:3])


def _public_api_builder(backend):
    """What a user gets from ffpa_attn_func(backend=...): 'cutedsl' runs the SM90 D512 kernels,
    'triton' the default Triton forward+backward (TritonBackend defaults)."""

    def build(S):
        q, k, v, do = get_inputs(S)
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

        def fwd():
            return ffpa_attn_func(qg, kg, vg, is_causal=True, scale=SCALE, enable_gqa=True, backend=backend)

        state = {}

        def bwd():
            if "out" not in state:
                state["out"] = fwd()
            return torch.autograd.grad(state["out"], (qg, kg, vg), do, retain_graph=True)

        def fwdbwd():
            out = fwd()
            return torch.autograd.grad(out, (qg, kg, vg), do)

        return fwd, bwd, fwdbwd, _ident, state

    return build


build_public_api_cutedsl = _public_api_builder("cutedsl")
build_public_api_triton = _public_api_builder("triton")


def build_cute_sm90_op(S):
    """Low-level BHND entry _ffpa_attn_backward_cute (torch.ops.ffpa_attn._bwd_cute)."""
    q, k, v, do = get_inputs(S)
    O, lse = get_fwd(S)

    def fwd():
        return cute_fwd_bhnd(q, k, v)

    def bwd():
        return fcute._ffpa_attn_backward_cute(do, q, k, v, O, lse, SCALE, True)

    def fwdbwd():
        O2, lse2 = cute_fwd_bhnd(q, k, v)
        return fcute._ffpa_attn_backward_cute(do, q, k, v, O2, lse2, SCALE, True)

    return fwd, bwd, fwdbwd, _ident, {}


def build_cute_sm90_nhd_direct(S):
    """Same SM90 kernels, fed BNHD-contiguous tensors directly (no transpose copies)."""
    q, k, v, do = get_inputs(S)
    O, lse = get_fwd(S)
    qn, kn, vn, don, On = (_to_nhd(t) for t in (q, k, v, do, O))
    lse_c = lse.contiguous()

    def fwd():
        return _ffpa_attn_forward_sm90(qn, kn, vn, softmax_scale=SCALE, causal=True, return_lse=True)

    def bwd():
        return _ffpa_attn_backward_sm90(qn, kn, vn, On, don, lse_c, softmax_scale=SCALE, causal=True)

    def fwdbwd():
        O2, lse2 = _ffpa_attn_forward_sm90(qn, kn, vn, softmax_scale=SCALE, causal=True, return_lse=True)
        return _ffpa_attn_backward_sm90(qn, kn, vn, O2, don, lse2, softmax_scale=SCALE, causal=True)

    return fwd, bwd, fwdbwd, _nhd_back, {}


def build_cute_sm80_splitd(S):
    """CuTeDSL SM80 Split-D generic backward (what D>512 / non-Hopper uses). JIT key includes seqlen."""
    q, k, v, do = get_inputs(S)
    O, lse = get_fwd(S)
    qn, kn, vn, don, On = (_to_nhd(t) for t in (q, k, v, do, O))
    lse_c = lse.contiguous()

    def fwd():
        return cute_fwd_bhnd(q, k, v)

    def bwd():
        return _ffpa_attn_backward_sm80(qn, kn, vn, On, don, lse_c, softmax_scale=SCALE, causal=True)

    def fwdbwd():
        O2, lse2 = cute_fwd_bhnd(q, k, v)
        return _ffpa_attn_backward_sm80(qn, kn, vn, _to_nhd(O2), don, lse2, softmax_scale=SCALE, causal=True)

    return fwd, bwd, fwdbwd, _nhd_back, {}


def _make_triton_builder(env=None, **kw):
    def build(S):
        q, k, v, do = get_inputs(S)
        O, lse = get_fwd(S)

        def call(O_, lse_):
            old = {}
            if env:
                for key, val in env.items():
                    old[key] = os.environ.get(key)
                    os.environ[key] = val
            try:
                r = _ffpa_attn_backward_triton(
                    grad_out=do, q=q, k=k, v=v, o=O_, lse=lse_, causal=True, softmax_scale=SCALE, **kw
                )
            finally:
                if env:
                    for key, val in old.items():
                        if val is None:
                            os.environ.pop(key, None)
                        else:
                            os.environ[key] = val
            return r[:3]

        def fwd():
            return cute_fwd_bhnd(q, k, v)

        def bwd():
            return call(O, lse)

        def fwdbwd():
            O2, lse2 = cute_fwd_bhnd(q, k, v)
            return call(O2, lse2)

        return fwd, bwd, fwdbwd, _ident, {}

    return build


def build_sdpa_efficient(S):
    q, k, v, do = get_inputs(S)
    O, lse = get_fwd(S)

    def fwd():
        return cute_fwd_bhnd(q, k, v)

    def bwd():
        return _efficient_attn_backward_aten(do, q, k, v, O, lse, True, SCALE)[:3]

    def fwdbwd():
        O2, lse2 = cute_fwd_bhnd(q, k, v)
        return _efficient_attn_backward_aten(do, q, k, v, O2, lse2, True, SCALE)[:3]

    return fwd, bwd, fwdbwd, _ident, {}


# name -> (builder, description, cost_hint)
SETTINGS = [
    (
        "public_api_cutedsl",
        build_public_api_cutedsl,
        "BASELINE: ffpa_attn_func(backend='cutedsl') -> SM90 SplitD preprocess+dKdV+dQ, tiles 64x64 hard-coded",
    ),
    (
        "cute_sm90_op",
        build_cute_sm90_op,
        "same kernels via ffpa_attn.cute._ffpa_attn_backward_cute (torch.ops.ffpa_attn._bwd_cute)",
    ),
    (
        "cute_sm90_nhd_direct",
        build_cute_sm90_nhd_direct,
        "same kernels via _ffpa_attn_backward_sm90 on BNHD-contiguous tensors (skips the 5 input copies)",
    ),
    (
        "triton_tma",
        _make_triton_builder(enable_tma=True),
        "Triton SM90 TMA bwd (K/V repeat_interleave to Hq, fused dKdV+dQ launch, BLOCK_M=128,N=64,HD=64,w8,s2)",
    ),
    (
        "triton_generic",
        _make_triton_builder(),
        "Triton generic bwd (TritonBackend default; native GQA, fp32 dK/dV atomics)",
    ),
    (
        "triton_tma_split_launch",
        _make_triton_builder(enable_tma=True, enable_split_launch=True),
        "Triton TMA bwd, separate dKdV and dQ launches",
    ),
    (
        "triton_tma_persist_dkdv",
        _make_triton_builder(enable_tma=True, enable_persist_dkdv=True),
        "Triton TMA bwd, fp32 register-resident dK/dV (BLOCK_HEADDIM=128)",
    ),
    (
        "triton_tma_fuse_dkdvdq",
        _make_triton_builder(env={"FFPA_TRITON_BWD_FUSE_DKDVDQ": "1"}, enable_tma=True),
        "Triton TMA bwd with FFPA_TRITON_BWD_FUSE_DKDVDQ=1 (dQ atomics; valid since K/V expanded -> group 1)",
    ),
    (
        "triton_generic_split_launch",
        _make_triton_builder(enable_split_launch=True),
        "Triton generic bwd, separate dKdV and dQ launches",
    ),
    (
        "triton_tma_ws",
        _make_triton_builder(enable_tma=True, enable_ws=True),
        "Triton TMA bwd with warp_specialize (needs Triton WS support)",
    ),
    (
        "cute_sm80_splitd",
        build_cute_sm80_splitd,
        "CuTeDSL SM80 Split-D generic bwd on Hopper (mma.sync; recompiles per seqlen)",
    ),
    ("sdpa_efficient", build_sdpa_efficient, "aten mem-efficient attention backward (K/V expanded, causal)"),
    (
        "triton_generic_preprocess_d_chunk",
        _make_triton_builder(preprocess_d_chunk=True),
        "Triton generic bwd with preprocess_d_chunk=True",
    ),
    (
        "public_api_triton",
        build_public_api_triton,
        "ffpa_attn_func(backend='triton'): Triton fwd + Triton bwd defaults",
    ),
    (
        "triton_tma_autotune_fast",
        _make_triton_builder(enable_tma=True, autotune=True, autotune_mode="fast"),
        "Triton TMA bwd with autotune (8 configs, expensive)",
    ),
    (
        "triton_generic_autotune_fast",
        _make_triton_builder(autotune=True, autotune_mode="fast"),
        "Triton generic bwd with autotune (8+ configs, expensive)",
    ),
]
BASELINE = "public_api_cutedsl"
# Settings whose first call is known to be costly (JIT per seqlen / autotune
# sweeps) are only started when at least this much budget is left.
MIN_REMAINING_S = {
    "cute_sm80_splitd": 60.0,
    "public_api_triton": 45.0,
    "triton_tma_autotune_fast": 150.0,
    "triton_generic_autotune_fast": 150.0,
}

_sel = os.environ.get("PROBE_SETTINGS", "").strip()
if _sel:
    wanted = [s.strip() for s in _sel.split(",") if s.strip()]
    by_name = {n: (n, b, d) for n, b, d in SETTINGS}
    unknown = [w for w in wanted if w not in by_name]
    if unknown:
        RESULTS["errors_global"].append(f"unknown settings ignored: {unknown}")
    SETTINGS = [by_name[BASELINE]] + [by_name[w] for w in wanted if w in by_name and w != BASELINE]
RESULTS["meta"]["settings"] = [{"name": n, "desc": d} for n, _, d in SETTINGS]


# ----------------------------------------------------------------------------
# Runner
# ----------------------------------------------------------------------------
def run_one(name, builder, desc, S):
    rec = {"setting": name, "desc": desc, "seq": S, "status": "started", "t_start_s": round(_elapsed(), 1)}
    RESULTS["results"].append(rec)
    _dump()
    ff = _fwd_flops(S)
    grads_bhnd = None
    try:
        torch.cuda.reset_peak_memory_stats()
    except Exception:
        pass
    try:
        fwd, bwd, fwdbwd, to_bhnd, state = builder(S)
        # forward
        fwd_ms, fwd_all, fwd_first, fo = _time_cuda(fwd)
        del fo
        rec.update(
            fwd_ms=fwd_ms, fwd_ms_all=fwd_all, fwd_first_call_s=fwd_first, fwd_tflops=_tflops(ff, fwd_ms)
        )
        # backward only (precomputed O/lse or retained graph)
        bwd_ms, bwd_all, bwd_first, last = _time_cuda(bwd)
        rec.update(
            bwd_ms=bwd_ms,
            bwd_ms_all=bwd_all,
            bwd_first_call_s=bwd_first,
            bwd_tflops=_tflops(2.5 * ff, bwd_ms),
        )
        grads_bhnd = to_bhnd(last)
        del last
        state.clear()
        # correctness (before the fwd+bwd timing so a failure there keeps these)
        if name == BASELINE:
            _DEFAULT_GRADS[S] = tuple(t.detach() for t in grads_bhnd)
        elif S in _DEFAULT_GRADS:
            rec.update(_compare(grads_bhnd, _DEFAULT_GRADS[S], "vs_default"))
        if S in _tensors:
            rec.update(_compare(grads_bhnd, _tensors[S][1:], "vs_fp32ref"))
        grads_bhnd = None
        _dump()
        # forward + backward
        fb_ms, fb_all, fb_first, last2 = _time_cuda(fwdbwd)
        del last2
        rec.update(
            fwdbwd_ms=fb_ms,
            fwdbwd_ms_all=fb_all,
            fwdbwd_first_call_s=fb_first,
            fwdbwd_tflops=_tflops(3.5 * ff, fb_ms),
        )
        rec["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        rec["status"] = "ok"
    except Exception as exc:  # noqa: BLE001
        rec["status"] = "error"
        rec["exception"] = f"{type(exc).__name__}: {exc}"[:2000]
        rec["traceback"] = traceback.format_exc()[-4000:]
        try:
            torch.cuda.synchronize()
        except Exception as exc2:  # noqa: BLE001
            rec["cuda_context_poisoned"] = f"{type(exc2).__name__}: {exc2}"[:500]
    finally:
        grads_bhnd = None
        try:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        except Exception:
            pass
        rec["t_end_s"] = round(_elapsed(), 1)
        _dump()
    return rec


_tensors = {}  # S -> (O_ref, dq_ref, dk_ref, dv_ref), fp32


def build_reference():
    if not DO_REF or REF_SEQ not in SEQS:
        return
    t = time.time()
    try:
        q, k, v, do = get_inputs(REF_SEQ)
        with torch.no_grad():
            o_ref, dq_ref, dk_ref, dv_ref = reference_fp32(q, k, v, do)
        torch.cuda.synchronize()
        _tensors[REF_SEQ] = (o_ref, dq_ref, dk_ref, dv_ref)
        info = {"seconds": time.time() - t}
        try:
            O, _ = get_fwd(REF_SEQ)
            info["fwd_O_max_abs_vs_fp32ref"] = _maxabs(O, o_ref)
            info["fwd_O_relfro_vs_fp32ref"] = _relfro(O, o_ref)
        except Exception as exc:  # noqa: BLE001
            info["fwd_compare_error"] = f"{type(exc).__name__}: {exc}"
        RESULTS["reference"][str(REF_SEQ)] = info
    except Exception as exc:  # noqa: BLE001
        RESULTS["reference"][str(REF_SEQ)] = {
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-3000:],
        }
        _tensors.pop(REF_SEQ, None)
    torch.cuda.empty_cache()
    _dump()


def main():
    # Build the fp32 reference before the baseline so the baseline also gets
    # vs_fp32ref numbers.
    build_reference()
    for name, builder, desc in SETTINGS:
        failed_before = False
        for S in SEQS:
            if _over_budget():
                RESULTS["skipped"].append(
                    {"setting": name, "seq": S, "reason": f"budget {BUDGET_S}s exceeded at {_elapsed():.0f}s"}
                )
                _dump()
                continue
            need = MIN_REMAINING_S.get(name, 0.0)
            if BUDGET_S - _elapsed() < need:
                RESULTS["skipped"].append(
                    {
                        "setting": name,
                        "seq": S,
                        "reason": f"needs >= {need:.0f}s of budget left, has {BUDGET_S - _elapsed():.0f}s",
                    }
                )
                _dump()
                continue
            if failed_before:
                RESULTS["skipped"].append({"setting": name, "seq": S, "reason": "failed at a smaller seq"})
                _dump()
                continue
            rec = run_one(name, builder, desc, S)
            print(
                f"[{_elapsed():6.1f}s] {name:36s} S={S:6d} {rec['status']:5s} "
                f"fwd={rec.get('fwd_ms')} bwd={rec.get('bwd_ms')} f+b={rec.get('fwdbwd_ms')} "
                f"{rec.get('exception', '')[:160]}",
                flush=True,
            )
            if rec["status"] != "ok":
                failed_before = True
                if rec.get("cuda_context_poisoned"):
                    RESULTS["errors_global"].append(f"CUDA context poisoned after {name} S={S}; stopping")
                    _dump()
                    return
    # Free the reference tensors
    _tensors.clear()


def _fmt(x, nd=1):
    if x is None:
        return "-"
    if isinstance(x, float):
        if x != 0 and (abs(x) < 1e-2 or abs(x) >= 1e5):
            return f"{x:.2e}"
        return f"{x:.{nd}f}"
    return str(x)


def print_table():
    cols = [
        "setting",
        "S",
        "fwd ms",
        "fwd TF/s",
        "bwd ms",
        "bwd TF/s",
        "f+b ms",
        "f+b TF/s",
        "|ddq|def",
        "|ddk|def",
        "|ddv|def",
        "rel dq ref",
        "rel dk ref",
        "rel dv ref",
        "status",
    ]
    rows = []
    for r in RESULTS["results"]:
        rows.append(
            [
                r["setting"],
                str(r["seq"]),
                _fmt(r.get("fwd_ms"), 2),
                _fmt(r.get("fwd_tflops")),
                _fmt(r.get("bwd_ms"), 2),
                _fmt(r.get("bwd_tflops")),
                _fmt(r.get("fwdbwd_ms"), 2),
                _fmt(r.get("fwdbwd_tflops")),
                _fmt(r.get("vs_default_max_abs_dq"), 4),
                _fmt(r.get("vs_default_max_abs_dk"), 4),
                _fmt(r.get("vs_default_max_abs_dv"), 4),
                _fmt(r.get("vs_fp32ref_relfro_dq"), 5),
                _fmt(r.get("vs_fp32ref_relfro_dk"), 5),
                _fmt(r.get("vs_fp32ref_relfro_dv"), 5),
                r["status"] + ((" " + r.get("exception", "")[:60]) if r["status"] != "ok" else ""),
            ]
        )
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(cols)]
    line = " | ".join(c.ljust(w) for c, w in zip(cols, widths))
    print()
    print(line)
    print("-" * len(line))
    for row in rows:
        print(" | ".join(x.ljust(w) for x, w in zip(row, widths)))
    for s in RESULTS["skipped"]:
        print(f"skipped: {s['setting']} S={s['seq']}: {s['reason']}")
    ref = RESULTS["reference"]
    if ref:
        print("fp32 reference:", json.dumps(ref, default=str))
    print(f"JSON: {OUT_JSON}   total {_elapsed():.1f}s")


if __name__ == "__main__":
    try:
        if IMPORT_ERRORS.get("ffpa_attn") or IMPORT_ERRORS.get("ffpa_attn.cute"):
            print("Import failure:\n", IMPORT_ERRORS)
        main()
    except Exception:  # noqa: BLE001
        RESULTS["errors_global"].append(traceback.format_exc()[-4000:])
    finally:
        RESULTS["meta"]["total_s"] = _elapsed()
        _dump()
        print_table()
