"""Tables (markdown) and a plot (PNG) from the committed benchmark JSON.

python benchmarks/report.py benchmarks/results  -> prints tables, writes e2e.png
"""
import json
import os
import sys

EARLY = "2026-12-03-h200-a"  # the first sessions' files (H200, 2026-12-03 to 05)
FULL = "2026-12-06-h100-d"  # full-depth models and the routing core's before/after (one H100)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def load(folder, name):
    path = os.path.join(folder, name)
    return json.load(open(path)) if os.path.exists(path) else None


def kernel_table(data):
    lines = ["| N | variant | fwd ms | fwd+bwd ms | fwd TF/s | held for bwd MiB | extra peak GiB |", "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {r['n']} | {r['variant']} | {r['fwd_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | {r['fwd_tflops']:.0f} | {r['held_for_backward_mib']:.0f} | {r['extra_peak_gib']:.2f} |")
    return "\n".join(lines)


def mark_order(data):
    """Flag rows that ran after a patched model in the same process before the leak fix
    (rows without ``dead_models_freed``): ~5.5 GiB more peak (README)."""
    patched_before = 0
    for r in data["rows"]:
        r["_after_patched"] = r.get("patched_before_in_process", patched_before) > 0 and not r.get("dead_models_freed")
        patched_before += "error" not in r and not r["backend"].endswith("-stock")
    return data


def _recipe(r):
    """Rows compare with the stock row of the same recipe, compiled or not (stock without Liger)."""
    return r["seq"], r.get("padded"), r.get("ckpt"), r.get("packed") or 0, bool(r.get("mixed")), bool(r.get("compiled"))


def _stock_rates(rows):
    """tokens/s of each recipe's stock row (stock without Liger), the denominator of "vs stock"."""
    return {_recipe(r): r["tokens_per_s"] for r in rows if r["backend"] == "sdpa-stock" and not r.get("liger")}


def _label(r):
    return r["backend"] + (" + liger" if r.get("liger") else "") + (" compiled" if r.get("compiled") else "")


def e2e_table(data):
    mark_order(data)
    rows = [r for r in data["rows"] if "error" not in r]
    base = _stock_rates(rows)
    lines = ["| seq | backend | tokens/s | vs stock sdpa | peak GiB | first step s | final loss |", "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['seq']} | {r['backend']} | {r['error'][:40]} | | | | |")
            continue
        b = base.get(_recipe(r))
        ratio = f"{r['tokens_per_s'] / b:.2f}x" if b else "-"
        peak = f"{r['peak_gib']:.1f}" + (" *" if r["_after_patched"] else "")
        lines.append(f"| {r['seq']} | {_label(r)} | {r['tokens_per_s']:,.0f} | {ratio} | {peak} | {r['first_step_s']:.1f} | {r['losses'][-1]:.4f} |")
    return "\n".join(lines)


def long_context_table(data):
    lines = ["| seq | backend | checkpointing | packing | tokens/s | vs stock | peak GiB | first step s |", "|---|---|---|---|---|---|---|---|"]
    rows = [r for r in data["rows"] if "error" not in r and "invalid" not in r]
    base = _stock_rates(rows)
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['seq']:,} | {r['backend']} | {r.get('ckpt') or '-'} | | {r['error'][:50]} | | | |")
            continue
        if "invalid" in r:
            lines.append(f"| {r['seq']:,} | {_label(r)} | {r.get('ckpt') or '-'} | | (invalid: {r['invalid'][:60]}...) | | | |")
            continue
        b = base.get(_recipe(r))
        packing = f"{r['packed']} docs" + (" (mixed)" if r.get("mixed") else "") if r.get("packed") else "-"
        ratio = f"{r['tokens_per_s'] / b:.2f}x" if b else "-"
        lines.append(f"| {r['seq']:,} | {_label(r)} | {r.get('ckpt') or '-'} | {packing} | {r['tokens_per_s']:,.0f} | "
                     f"{ratio} | {r['peak_gib']:.1f} | {r['first_step_s']:.1f} |")
    return "\n".join(lines)


def bwd_probe_table(data):
    """ffpa_bwd_probe.py: each backward ffpa-attn ships, D=512, B=1, Hq=32, Hkv=4, causal."""
    lines = ["| backward | seq | fwd ms | bwd ms | bwd TF/s | fwd+bwd ms | dq/dk/dv rel. err vs fp32 (8k) |", "|---|---|---|---|---|---|---|"]
    for r in data["results"]:
        if r.get("status") != "ok":
            lines.append(f"| {r['setting']} | {r['seq']} | {r.get('status')} | | | | |")
            continue
        err = "/".join(f"{r[f'vs_fp32ref_relfro_{g}']:.1e}" for g in ("dq", "dk", "dv")) if "vs_fp32ref_relfro_dq" in r else ""
        lines.append(f"| {r['setting']} | {r['seq']} | {r['fwd_ms']:.2f} | {r['bwd_ms']:.2f} | {r['bwd_tflops']:.0f} | "
                     f"{r['fwdbwd_ms']:.2f} | {err} |")
    return "\n".join(lines)


def trainer_profile_table(rows):
    """trainer.py --profile-step: GPU ms per kernel class in one step, against the step's wall time."""
    from profile_split import split

    heads = [f"{r['backend']} {r['precision']} {r['collator']}" for r in rows]
    splits = [split(r["profile"]["kernels_ms"]) for r in rows]
    classes = list(dict.fromkeys(c for s in splits for c in s["split_ms"]))
    lines = ["| ms per step | " + " | ".join(heads) + " |", "|---|" + "---|" * len(rows)]
    lines.append("| **wall (median step)** | " + " | ".join(f"**{r['median_step_ms']:.1f}**" for r in rows) + " |")
    lines.append("| GPU busy (sum of kernels) | " + " | ".join(f"{s['total_gpu_ms']:.1f}" for s in splits) + " |")
    for c in classes:
        lines.append(f"| {c} | " + " | ".join(f"{s['split_ms'].get(c, 0.0):.1f}" for s in splits) + " |")
    return "\n".join(lines)


def host_ops_table(rows, top=12):
    """trainer.py --profile-step: host (CPU) self ms and calls of the busiest ops and CUDA
    runtime calls in the profiled step, one column per row (the profiler slows the host)."""
    names = list(dict.fromkeys(o["op"] for r in rows for o in r["profile"].get("host_ops_self_ms", [])[:top]))
    by_row = [{o["op"]: o for o in r["profile"].get("host_ops_self_ms", [])} for r in rows]
    lines = ["| host op (self) | " + " | ".join(f"{r['backend']}: ms (calls)" for r in rows) + " |", "|---|" + "---|" * len(rows)]
    for n in names:
        cells = [f"{d[n]['ms']:.1f} ({d[n]['calls']})" if n in d else "-" for d in by_row]
        lines.append(f"| {n[:70]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def profile_table(data):
    from profile_split import split

    rows = [r for r in data["rows"] if "profile" in r]
    splits = {r["backend"]: split(r["profile"]["kernels_ms"]) for r in rows}
    classes = list(dict.fromkeys(c for s in splits.values() for c in s["split_ms"]))
    lines = ["| GPU ms per step | " + " | ".join(splits) + " |", "|---|" + "---|" * len(splits)]
    for c in classes + ["total"]:
        vals = [s["total_gpu_ms"] if c == "total" else s["split_ms"].get(c, 0.0) for s in splits.values()]
        lines.append(f"| {c} | " + " | ".join(f"{v:.1f}" for v in vals) + " |")
    return "\n".join(lines)


def clocks_table(folder):
    """Median SM clock and power while the GPU was busy, one row per gpu_clocks.py summary."""
    lines = ["| run | busy samples | SM MHz (median) | power W (median) | power limit W |", "|---|---|---|---|---|"]
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".json")):
        d = json.load(open(os.path.join(folder, name)))
        med = lambda k: d.get(k, {}).get("median", float("nan"))  # noqa: E731
        lines.append(f"| {name[:-5]} | {d['busy_samples']} | {med('clocks.sm'):.0f} | {med('power.draw'):.0f} | {med('power.limit'):.0f} |")
    return "\n".join(lines)


def plot(data, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if "error" not in r]
    seqs = sorted({r["seq"] for r in rows})
    backends = sorted(dict.fromkeys(r["backend"] for r in rows), key=lambda b: not b.endswith("-stock"))  # stock first
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(backends)
    for i, b in enumerate(backends):
        vals = {r["seq"]: r for r in rows if r["backend"] == b}
        xs = [j + i * width for j in range(len(seqs))]
        axes[0].bar(xs, [vals[s]["tokens_per_s"] if s in vals else 0 for s in seqs], width, label=b)
        bars = axes[1].bar(xs, [vals[s]["peak_gib"] if s in vals else 0 for s in seqs], width, label=b)
        for bar, s in zip(bars, seqs):
            if s in vals and vals[s].get("_after_patched"):
                bar.set_hatch("//")
    for ax, panel in zip(axes, ("tokens/s (higher is better)", "peak GiB (hatched: 2nd patched model)")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(seqs))], [str(s) for s in seqs])
        ax.set_xlabel("sequence length")
        ax.set_title(panel)
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def long_context_plot(rows, path, title, card_gib):
    """tokens/s and peak memory against length, one line per backend (+ liger); a row that ran
    out of memory is an x at the card's size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (speed, memory) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = sorted({_label(r) for r in rows if not r.get("compiled")}, key=lambda b: (not b.startswith("sdpa"), b))
    for i, label in enumerate(labels):
        color = f"C{i}"
        ok = sorted((r for r in rows if _label(r) == label and "error" not in r), key=lambda r: r["seq"])
        xs = [r["seq"] // 1024 for r in ok]
        speed.plot(xs, [r["tokens_per_s"] for r in ok], "o-", color=color, label=label)
        memory.plot(xs, [r["peak_gib"] for r in ok], "o-", color=color, label=label)
        for r in rows:
            if _label(r) == label and "error" in r and "OutOfMemory" in r["error"]:
                memory.plot([r["seq"] // 1024], [card_gib], "x", color=color, markersize=10, mew=2)
                speed.plot([r["seq"] // 1024], [0], "x", color=color, markersize=10, mew=2)
    memory.axhline(card_gib, color="grey", lw=0.8, ls="--")
    for ax, what in ((speed, "tokens/s (x: out of memory)"), (memory, f"peak GiB (dashed: the card, {card_gib:.0f} GiB)")):
        ax.set_xlabel("sequence length, k tokens")
        ax.set_title(what)
        ax.set_xticks(sorted({r["seq"] // 1024 for r in rows}))
    speed.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def trainer_long_table(rows):
    """trainer.py --model slice31b: steps of packed documents of different lengths, so tokens/s."""
    base = next((r["tokens_per_s"] for r in rows if r["backend"] == "sdpa-stock"), None)
    lines = ["| backend | tokens per step | tokens/s | vs stock | median step s | first step s | peak GiB |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = _ratio(r["tokens_per_s"] / base if base else None)
        lines.append(f"| {r['backend']} | {min(r['tokens_per_step']):,}-{max(r['tokens_per_step']):,} | {r['tokens_per_s']:,.0f} | {ratio} | "
                     f"{r['median_step_ms'] / 1e3:.2f} | {r['first_step_ms'] / 1e3:.1f} | {r['peak_gib']:.1f} |")
    return "\n".join(lines)


def trainer_rows(folder, name=os.path.join("trainer", "trainer.json"), first_only=True):
    """Trainer rows (the matrix, trainer/trainer.json, by default): with ``first_only`` the first
    run of each recipe; speed-up against the first stock row of the same recipe ("-" without one)."""
    rows = load(folder, name) or []
    stock = {}
    for r in rows:
        if r["backend"] == "sdpa-stock":
            stock.setdefault((r["precision"], r["collator"]), r["median_step_ms"])
    seen, out = set(), []
    for r in rows:
        key = (r["backend"], r["precision"], r["collator"], r["sliding"])
        if first_only and key in seen:
            continue
        seen.add(key)
        base = stock.get((r["precision"], r["collator"]))
        out.append(dict(r, speedup=base / r["median_step_ms"] if base else None))
    return out


def _ratio(x):
    return f"{x:.2f}x" if x else "-"


def trainer_table(rows):
    lines = ["| backend | precision | collator | median step ms | vs stock | first step s | peak GiB | CuTeDSL compiles (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        jit = ", ".join(f"{k} {n} ({t:.0f} s)" for k, (n, t) in r["cutedsl_jit"].items()) or "none"
        lines.append(f"| {r['backend']} | {r['precision']} | {r['collator']} | {r['median_step_ms']:.1f} | "
                     f"{_ratio(r['speedup'])} | {r['first_step_ms'] / 1e3:.1f} | {r['peak_gib']:.1f} | {jit} |")
    return "\n".join(lines)


def trainer_plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recipes = [(p, c) for p in ("autocast", "bf16") for c in ("packing", "padding")]
    backends = ("sdpa-stock", "sdpa-dropin", "ffpa")
    fig, (bars, curves) = plt.subplots(1, 2, figsize=(13, 4.5))
    for i, backend in enumerate(backends):
        ms = [next((r["median_step_ms"] for r in rows if (r["backend"], r["precision"], r["collator"]) == (backend, p, c)), 0)
              for p, c in recipes]
        bars.bar([x + 0.27 * (i - 1) for x in range(len(recipes))], ms, 0.27, label=backend)
    bars.set_xticks(range(len(recipes)), [f"{p}\n{c}" for p, c in recipes])
    bars.set_ylabel("median step, ms (first step excluded)")
    bars.set_title("HF Trainer, small Gemma4 (6 layers, hd 256/512), H200")
    bars.legend()
    for r in rows:
        if r["precision"] == "autocast" and r["collator"] == "packing" and r["sliding"] == "fa4":
            curves.plot(range(1, len(r["losses"]) + 1), r["losses"], label=r["backend"])
    curves.set_xlabel("step")
    curves.set_ylabel("training loss")
    curves.set_title("autocast + packing: loss per step (random model, random tokens)")
    curves.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    results = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results"
    folder = os.path.join(results, EARLY)  # the first H200 sessions' files (their own folder since manifests)
    k = load(folder, "kernel.json")
    if k:
        print("### Kernel (one full layer)\n\n" + kernel_table(k) + "\n")
    names = ("e2e_noopt_4k.json", "e2e_noopt_8k.json", "e2e_noopt_16k.json", "e2e_ab_sliding_mask_8k.json",
             "e2e_ab_sliding_mask_16k.json", "e2e_after_leak_fix_8k.json", "e2e_import_main_thread_8k.json",
             "e2e_import_helper_thread_8k.json", "e2e_clocks_8k.json", "e2e_packed.json", "e2e_compile.json",
             "e2e_compile_after_mask_skip.json", "e2e_compile_fa4_op_uncached.json", "e2e_compile_fa4_op.json", "e2e_8k.json", "e2e_16k.json", "e2e_order.json",
             "e2e_order_after_fix.json", "e2e_loss20.json", "e2e_padded.json", "e2e_ckpt_plain.json",
             "e2e_ckpt_selective.json", "e2e_t512.json")
    for name in names:
        e = load(folder, name)
        if e:
            print(f"### {name}\n\n" + e2e_table(e) + "\n")
            if any("profile" in r for r in e["rows"]):
                print(f"### {name}: profile split\n\n" + profile_table(e) + "\n")
    rows = trainer_rows(folder)
    if rows:
        print("### trainer/trainer.json (benchmarks/trainer_matrix.sh)\n\n" + trainer_table(rows) + "\n")
        trainer_plot(rows, os.path.join(folder, "trainer", "trainer.png"))
    folder = results
    h100 = "2026-12-06-h100-a"
    for name in ("trainer_floor.json", "trainer_floor_repeat.json"):
        rows = trainer_rows(folder, os.path.join(h100, name), first_only=False)
        if rows:
            print(f"### {h100}/{name} (the floor under any attention kernel)\n\n" + trainer_table(rows) + "\n")
    for name in ("liger_8k.json", "compile_8k.json"):
        data = load(folder, os.path.join(h100, name))
        if data:
            print(f"### {h100}/{name}\n\n" + e2e_table(data) + "\n")
    run = "2026-12-06-h100-b"  # three H100 machines, a, b and c (benchmarks/results/2026-12-06-h100-b/gpu_session.sh)
    for name, what in (("h100_a/trainer_floor.json", "floors, autocast + padding"), ("h100_b/ab.json", "masks.analyse with one read-back"),
                       ("h100_b/ab_base.json", "masks.analyse as before (seven syncs)")):
        rows = trainer_rows(folder, os.path.join(run, name), first_only=False)
        if rows:
            print(f"### {run}/{name} ({what})\n\n" + trainer_table(rows) + "\n")
    prof = load(folder, os.path.join(run, "h100_a", "trainer_profile.json"))
    if prof:
        print(f"### {run}/h100_a/trainer_profile.json (GPU)\n\n" + trainer_profile_table(prof) + "\n")
        print(f"### {run}/h100_a/trainer_profile.json (host)\n\n" + host_ops_table(prof) + "\n")
    for names, note in ((("h100_a/long_context_32k.json", "h100_a/liger_32k.json"), ""), (("h100_b/long_context_32k.json",), ""),
                        (("h100_c/long_context_64k.json", "h100_c/long_context_64k_expandable.json"),
                         " (selective checkpointing; the last two rows with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)")):
        parts = [load(folder, os.path.join(run, n)) for n in names]
        if all(parts):
            print(f"### {run}/{' + '.join(names)}{note}\n\n" + long_context_table({"rows": [r for d in parts for r in d["rows"]]}) + "\n")
    run = "2026-12-06-h100-c"  # one H100 (d); benchmarks/results/2026-12-06-h100-c/gpu_session.sh
    long = load(folder, os.path.join(run, "h100_d", "long.json"))
    if long:
        print(f"### {run}/h100_d/long.json\n\n" + long_context_table(long) + "\n")
        c64 = load(folder, os.path.join("2026-12-06-h100-b", "h100_c", "long_context_64k_expandable.json"))
        oom = [r for r in (c64 or {"rows": []})["rows"] if "error" in r]  # stock at 64k, machine c
        long_context_plot(long["rows"] + oom, os.path.join(folder, run, "long_context.png"),
                          "31B-shaped 6-layer slice, selective checkpointing, AdamW, one H100 80GB", 79.1)
    for name, table in (("h100_d/short.json", e2e_table), ("h100_d/trainer_long.json", trainer_long_table),
                        ("h100_e/long.json", long_context_table), ("h100_e/short.json", e2e_table)):
        data = load(folder, os.path.join(run, name))
        if data:
            print(f"### {run}/{name}\n\n" + table(data) + "\n")
    folder = os.path.join(results, EARLY)
    prof = load(folder, os.path.join("trainer", "trainer_profile.json"))
    if prof:
        print("### trainer/trainer_profile.json (trainer.py --profile-step 8)\n\n" + trainer_profile_table(prof) + "\n")
    for name, table in (("long_context.json", long_context_table), ("liger.json", long_context_table),
                        ("ffpa_bwd_probe.json", bwd_probe_table)):
        data = load(folder, os.path.join("long_context", name))
        if data:
            print(f"### long_context/{name}\n\n" + table(data) + "\n")
    for sub in ("clocks_8k", "clocks_adamw_8k"):
        if os.path.isdir(os.path.join(folder, sub)):
            print(f"### {sub}/ (gpu_clocks.py, busy samples)\n\n" + clocks_table(os.path.join(folder, sub)) + "\n")
    for files, png, what in ((("e2e_noopt_4k.json", "e2e_noopt_8k.json", "e2e_noopt_16k.json"), "e2e_noopt.png",
                              "forward+backward"),
                             (("e2e_8k.json", "e2e_16k.json"), "e2e.png", "forward+backward+AdamW")):
        rows = [r for n in files if load(folder, n) for r in mark_order(load(folder, n))["rows"]]
        if rows:
            plot({"rows": rows}, os.path.join(folder, png), f"Gemma4 31B-shaped 6-layer slice, {what}, H200")


def full_model_table(rows) -> str:
    """Full-depth rows: tokens/s, against stock and against the attention-free floor, MFU, memory."""
    key = lambda r: (r["model"], r["recipe"], r["ckpt"], r["seq"])  # noqa: E731
    stock = {key(r): r["tokens_per_s"] for r in rows if r["backend"] == "sdpa-stock" and "error" not in r}
    floor = {key(r): r["tokens_per_s"] for r in rows if r["backend"] == "floor" and "error" not in r}
    out = ["| model | recipe | seq | backend | tokens/s | vs stock | % of floor | MFU | peak GiB | first step s |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (*key(r), r["backend"])):
        if "error" in r:
            out.append(f"| {r['model']} | {r['recipe']}, {r['ckpt']} ckpt | {r['seq']} | {r['backend']} | {r['error'][:60]} | | | | | |")
            continue
        vs = f"{r['tokens_per_s'] / stock[key(r)]:.2f}x" if key(r) in stock else "-"
        pf = f"{100 * r['tokens_per_s'] / floor[key(r)]:.1f}%" if key(r) in floor and r["backend"] != "floor" else "-"
        out.append(f"| {r['model']} | {r['recipe']}, {r['ckpt']} ckpt | {r['seq']} | {r['backend']} | {r['tokens_per_s']:,.0f} | {vs} | {pf} "
                   f"| {100 * r['mfu']:.1f}% | {r['peak_gib']:.1f} | {r['first_step_s']:.1f} |")
    return "\n".join(out)


def full_model_plot(rows, path):
    """Grouped bars per (model, length): stock, ffpa_patch and the attention-free floor in tokens/s,
    and ffpa_patch's share of the floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "error" not in r and r["recipe"] == "lora" and r["ckpt"] == "plain"]
    groups = sorted({(r["model"], r["seq"]) for r in rows}, key=lambda g: (g[0], g[1]))
    speed = {(r["model"], r["seq"], r["backend"]): r["tokens_per_s"] for r in rows}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    width = 0.27
    for i, (backend, colour) in enumerate((("sdpa-stock", "tab:gray"), ("ffpa", "tab:green"), ("floor", "tab:blue"))):
        xs = [g for g, key in enumerate(groups) if (*key, backend) in speed]
        left.bar([x + (i - 1) * width for x in xs], [speed[(*groups[x], backend)] for x in xs], width,
                 color=colour, label={"sdpa-stock": "stock sdpa", "ffpa": "ffpa_patch", "floor": "attention-free floor"}[backend])
    labels = [f"{m}\n{s // 1024}k" for m, s in groups]
    left.set_xticks(range(len(groups)), labels)
    left.set_yscale("log")
    left.set_ylabel("tokens/s (log)")
    left.set_title("released Gemma4 shapes, full depth, LoRA r=16, checkpointing, one H100")
    left.legend()
    share = [(x, 100 * speed[(*g, "ffpa")] / speed[(*g, "floor")]) for x, g in enumerate(groups)
             if (*g, "ffpa") in speed and (*g, "floor") in speed]
    right.bar([labels[x] for x, _ in share], [v for _, v in share], color="tab:green")
    for x, (_, v) in enumerate(share):
        right.text(x, v + 1, f"{v:.0f}%", ha="center")
    right.set_ylim(0, 105)
    right.set_ylabel("ffpa_patch, % of the floor")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def before_after_tables(folder) -> str:
    """The routing core rewrite against 0a52d15, same machine, same call: host time and the 8k slice."""
    import glob

    lines = ["| package | backend | batch | host us per attention call |", "|---|---|---|---|"]
    for path in sorted(glob.glob(os.path.join(folder, "overhead_*.json"))):
        for r in json.load(open(path)):
            lines.append(f"| {r['label']} | {r['backend']} | {r['batch']} | {r['overhead_us_per_call']:.1f} |")
    lines += ["", "| package | batch | tokens/s | step ms | peak GiB |", "|---|---|---|---|---|"]
    for name in ("e2e_8k_after.json", "e2e_8k_before.json", "e2e_8k_stock.json"):
        data = load(folder, name)
        for r in (data or {"rows": []})["rows"]:
            label = {"e2e_8k_after.json": "after", "e2e_8k_before.json": "before (0a52d15)"}.get(name, "stock sdpa")
            lines.append(f"| {label} | {'padded' if r['padded'] else 'text'} | {r['tokens_per_s']:,.0f} | {1e3 * r['step_s']:.1f} | {r['peak_gib']:.2f} |")
    return "\n".join(lines)


def report_full(results):
    folder = os.path.join(results, FULL)
    data = load(folder, "full_model.json")
    if data:
        print(f"### {FULL}/full_model.json\n\n" + full_model_table(data["rows"]) + "\n")
        full_model_plot(data["rows"], os.path.join(folder, "full_model.png"))
    print(f"### {FULL}: before/after the routing core\n\n" + before_after_tables(folder) + "\n")


def images_table(rows) -> str:
    """Image batches (benchmarks/images.py): tokens/s against the stock row of the same model and batch."""
    key = lambda r: (r["model"], r["seq"], r["layers"], bool(r.get("text_only")), r.get("lora"), r.get("ckpt"))  # noqa: E731
    stock = {key(r): r["tokens_per_s"] for r in rows if r["backend"] == "sdpa-stock" and "error" not in r}
    out = ["| model | layers | batch | backend | tokens/s | vs stock | first step s | peak GiB |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        batch = "text" if r.get("text_only") else f"{r.get('images')} images x {r.get('image_tokens')} tokens"
        if "error" in r:
            out.append(f"| {r['model']} | {r.get('layers')} | {batch} | {r['backend']} | {r['error'][:50]} | | | |")
            continue
        vs = f"{r['tokens_per_s'] / stock[key(r)]:.2f}x" if key(r) in stock else "-"
        out.append(f"| {r['model']} | {r['layers']} | {batch} | {r['backend']} | {r['tokens_per_s']:,.0f} | {vs} "
                   f"| {r['first_step_s']:.1f} | {r['peak_gib']:.1f} |")
    return "\n".join(out)


def projection_table(rows) -> str:
    """Ulysses SP projected (benchmarks/ulysses_projection.py)."""
    out = ["| model | N | seq | tokens/rank | attention s | all-to-all s (GB) | rest s | step s | tokens/s/GPU |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['degree']} | {r['seq'] // 1024}k | {r['tokens_per_rank']} | {r['attention_s']:.2f} "
                   f"| {r['exchange_s']:.2f} ({r['exchange_gb']:.0f}) | {r['rest_s']:.2f} | {r['step_s']:.1f} | {r['tokens_per_s_per_gpu']:,.0f} |")
    return "\n".join(out)


def report_2026_12_07(results):
    """This session's runs: full depth (12B) and image batches on an H100; the SP projection on an H200."""
    folder = os.path.join(results, "2026-12-07-h100-a")
    data = load(folder, "full_model.json")
    if data:
        print("### 2026-12-07-h100-a/full_model.json\n\n" + full_model_table(data["rows"]) + "\n")
    data = load(folder, "images.json")
    if data:
        print("### 2026-12-07-h100-a/images.json\n\n" + images_table(data["rows"]) + "\n")
    folder = os.path.join(results, "2026-12-07-h200-b")
    rows = [r for name in ("ulysses_projection_31b.json", "ulysses_projection_26b.json") if load(folder, name)
            for r in load(folder, name)["rows"]]
    if rows:
        print("### 2026-12-07-h200-b/ulysses_projection_*.json (a projection: kernels on an H200, floors from an H100)\n\n"
              + projection_table(rows) + "\n")
    stock = load(os.path.join(results, "2026-12-07-cpu-ulysses"), "stock_error.json")
    if stock:
        lines = ["| layout | rank | loss | one process | logits error | worst gradient error |", "|---|---|---|---|---|---|"]
        for rank, rows in enumerate(stock["ranks"]):
            for r in rows:
                lines.append(f"| {r['layout']} | {rank} | {r['loss']:.4f} | {r['one_process_loss']:.4f} "
                             f"| {r['logits_error_this_rank']:.2f} | {r['worst_gradient_error']:.2f} |")
        print("### 2026-12-07-cpu-ulysses/stock_error.json (stock DeepSpeed Ulysses + SDPA, tiny Mistral, CPU)\n\n"
              + "\n".join(lines) + "\n")


def kernel_map_table(rows, layout="dense") -> str:
    """kernel_map.py: fwd / bwd TF/s per model, layer kind and kernel, one column per length."""
    seqs = sorted({r["n"] for r in rows if "fwd_tflops" in r})
    out = ["| model | layer | kernel | layout | heads (q/kv) | " + " | ".join(f"{n // 1024}k" for n in seqs) + " |",
           "|---|---|---|---|---|" + "---|" * len(seqs)]
    keys = sorted({(r["model"], r["layer"], r["kernel"], r["layout"], r["hq"], r["hkv"]) for r in rows if "fwd_tflops" in r},
                  key=lambda k: (k[1], -k[4], k[0], k[2], k[3]))
    for key in keys:
        if layout and key[3] not in (layout if isinstance(layout, tuple) else (layout,)):
            continue
        cells = {r["n"]: f"{r['fwd_tflops']:.0f} / {r['bwd_tflops']:.0f}" for r in rows
                 if "fwd_tflops" in r and (r["model"], r["layer"], r["kernel"], r["layout"], r["hq"], r["hkv"]) == key}
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]}/{key[5]} | "
                   + " | ".join(cells.get(n, "") for n in seqs) + " |")
    return "\n".join(out)


def kernel_map_plot(rows, path, peak):
    """Backward and forward TF/s against length: FFPA (full layers) and flash-attn-4 (sliding), dense."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, (layer, kernel) in zip(axes, (("full", "ffpa"), ("sliding", "fa4"))):
        models = [m for m in ("31B", "26B-A4B", "12B", "E4B", "E2B")]
        for i, model in enumerate(models):
            for pass_, style in (("fwd", "--"), ("bwd", "-")):
                rs = sorted((r for r in rows if r.get("sp", 1) == 1 and r["layout"] == "dense" and r["model"] == model
                             and r["layer"] == layer and r["kernel"] == kernel and "fwd_tflops" in r), key=lambda r: r["n"])
                ax.plot([r["n"] for r in rs], [r[f"{pass_}_tflops"] for r in rs], style, color=f"C{i}", marker="o", ms=3,
                        label=f"{model} {pass_}")
        ax.axhline(peak, color="grey", lw=0.8)
        ax.text(2048, peak * 0.95, f"bf16 GEMM {peak:.0f}", fontsize=7, va="top")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens (B=1)")
        ax.set_title(f"{layer} layers: {'FFPA, head_dim 512' if kernel == 'ffpa' else 'flash-attn-4, head_dim 256'}", fontsize=9)
    axes[0].set_ylabel("TF/s")
    axes[1].legend(fontsize=6, ncol=2)
    fig.suptitle("attention kernels at the released Gemma 4 shapes, one H100 (dashed: forward, solid: backward)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def attention_share_table(rows) -> str:
    out = ["| model | tokens | attention s (full fwd x2 / bwd, sliding fwd x2 / bwd) | step s | attention share | measured attention s "
           "| 1.5x faster full bwd |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['model']} | {r['n'] // 1024}k | {r['attention_s']:.2f} ({r['full_fwd_s']:.2f} / {r['full_bwd_s']:.2f}, "
                   f"{r['sliding_fwd_s']:.2f} / {r['sliding_bwd_s']:.2f}) | {r['step_s']:.2f} | {100 * r['attention_share']:.0f}% "
                   f"| {r.get('measured_attention_s', float('nan')):.2f} | +{100 * r['gain_bwd1.5x']:.1f}% |")
    return "\n".join(out).replace("| nan |", "| - |")


def report_2026_12_07c(results):
    """The kernel map (issue: kernels, item 2), the attention share, cuDNN's sm90 forward; one H100."""
    folder = os.path.join(results, "2026-12-07-h100-c")
    dense, packed, sp = (load(folder, f"kernel_map_{n}.json") for n in ("dense", "packed", "sp"))
    if dense:
        print("### 2026-12-07-h100-c/kernel_map_dense.json (fwd / bwd TF/s)\n\n" + kernel_map_table(dense["rows"]) + "\n")
        kernel_map_plot(dense["rows"], os.path.join(folder, "kernel_map.png"), dense["matmul_peak_tflops"])
    if packed:
        print("### 2026-12-07-h100-c/kernel_map_packed.json (4 equal documents: varlen, and as a dense batch of 4)\n\n"
              + kernel_map_table(packed["rows"], layout=("varlen", "batched")) + "\n")
    if sp:
        print("### 2026-12-07-h100-c/kernel_map_sp.json (one Ulysses rank's heads)\n\n" + kernel_map_table(sp["rows"]) + "\n")
    share = load(folder, "attention_share.json")
    if share:
        print("### 2026-12-07-h100-c/attention_share.json\n\n" + attention_share_table(share["rows"]) + "\n")
    cudnn = load(folder, "cudnn_d512_forward.json")
    if cudnn:
        lines = ["| heads (q/kv) | tokens | FFPA fwd TF/s | cuDNN sm90 fwd TF/s |", "|---|---|---|---|"]
        lines += [f"| {r['hq']}/{r['hkv']} | {r['s'] // 1024}k | {r['ffpa_tflops']:.0f} | {r.get('cudnn_tflops', float('nan')):.0f} |"
                  for r in cudnn["rows"]]
        print("### 2026-12-07-h100-c/cudnn_d512_forward.json\n\n" + "\n".join(lines) + "\n")


def d512_backward_plot(rows, path):
    """ffpa-attn's head_dim-512 backward against ffpa_patch's (Triton), counted TF/s per shape, 1 GiB scratch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in rows if "cfg0" in r and r["scratch_gb"] > 1]
    labels = [f"{r['model']}\n{r['n'] // 1024}k" for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(8, 3.4))
    ax.bar([x - 0.2 for x in xs], [r["ffpa_tflops"] for r in rows], 0.4, label="ffpa-attn 0.2.4")
    ax.bar([x + 0.2 for x in xs], [r["cfg0"]["tflops"] for r in rows], 0.4, label="ffpa_patch (Triton, kernels/d512_bwd.py)")
    for x, r in zip(xs, rows):
        ax.text(x + 0.2, r["cfg0"]["tflops"] + 5, f"{r['cfg0']['speedup']:.2f}x", ha="center", fontsize=7)
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("counted TF/s")
    ax.set_ylim(0, 540)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    ax.set_title("head_dim-512 causal backward, dense, B=1, bf16, one H100", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report_2026_12_08(results):
    """ffpa_patch's head_dim-512 backward against ffpa-attn's (issue: kernels, item 4); one H100."""
    folder = os.path.join(results, "2026-12-08-h100-b")
    data = load(folder, "d512_bwd_triton.json")
    if data:
        lines = ["| shape (q/kv heads) | tokens | scratch GiB | ffpa-attn ms, TF/s | ffpa_patch ms, TF/s | speed-up |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['model']} ({r['hq']}/{r['hkv']}) | {r['n'] // 1024}k | {r['scratch_gb'] * 1e9 / 2**30:.2f} | "
                  f"{r['ffpa_ms']:.1f}, {r['ffpa_tflops']:.0f} | {r['cfg0']['ms']:.1f}, {r['cfg0']['tflops']:.0f} | {r['cfg0']['speedup']:.2f}x |"
                  for r in data["rows"] if "cfg0" in r]
        print("### 2026-12-08-h100-b/d512_bwd_triton.json\n\n" + "\n".join(lines) + "\n")
        d512_backward_plot(data["rows"], os.path.join(folder, "d512_bwd.png"))


if __name__ == "__main__":
    main()
    report_full(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results")
    report_2026_12_07(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results")
    report_2026_12_07c(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results")
    report_2026_12_08(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results")
