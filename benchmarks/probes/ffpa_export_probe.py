"""Can an ffpa-attn kernel be kept on disk? Export a compiled varlen forward with
CuTeDSL's export_to_c, load it back with cute.runtime.load_module (as flash-attn-4's
disk cache does) and call it with the arguments ffpa-attn passes; compare the outputs.
Prints one JSON line. python benchmarks/probes/ffpa_export_probe.py [OBJ_DIR]
"""
import json
import os
import sys
import time

import torch

out_dir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/ffpa-export-probe"
os.makedirs(out_dir, exist_ok=True)
t0 = time.perf_counter()
import ffpa_attn.cute._ffpa_fwd_sm90 as fwd  # noqa: E402
from ffpa_attn import ffpa_attn_varlen_func  # noqa: E402

captured = []
launch = fwd._call_with_tvm_ffi_current_stream


def capture(fn, *args, device):
    captured.append((fn, args, device))
    return launch(fn, *args, device=device)


fwd._call_with_tvm_ffi_current_stream = capture
torch.manual_seed(0)
q, k, v = (torch.randn(3000, h, 512, device="cuda", dtype=torch.bfloat16) for h in (8, 1, 1))
cu = torch.tensor([0, 1000, 3000], device="cuda", dtype=torch.int32)
t1 = time.perf_counter()
ffpa_attn_varlen_func(q, k, v, cu, cu, 2000, 2000, causal=True, enable_gqa=True, softmax_scale=0.05)
torch.cuda.synchronize()
row = {"import_s": round(t1 - t0, 2), "first_call_s": round(time.perf_counter() - t1, 2)}
fn, args, device = captured[0]
out = args[3]
want = out.clone()
path = os.path.join(out_dir, "ffpa_fwd.o")
try:
    import cutlass.cute as cute

    fn.export_to_c(object_file_path=path, function_name="func")
    row["exported_bytes"] = os.path.getsize(path)
    t2 = time.perf_counter()
    loaded = getattr(cute.runtime.load_module(path, enable_tvm_ffi=True), "func")
    row["load_s"] = round(time.perf_counter() - t2, 3)
    out.zero_()
    launch(loaded, *args, device=device)
    torch.cuda.synchronize()
    row["loaded_matches"] = bool(torch.equal(out, want))
    row["max_abs_diff"] = (out.float() - want.float()).abs().max().item()
except Exception as exc:
    row["error"] = f"{type(exc).__name__}: {exc}"[:500]
print(json.dumps(row))
