"""Tables (markdown) and a plot (PNG) from the committed benchmark JSON.

python benchmarks/report.py benchmarks/results  -> prints tables, writes e2e.png
"""
import json
import os
import sys


def load(folder, name):
    path = os.path.join(folder, name)
    return json.load(open(path)) if os.path.exists(path) else None


def kernel_table(data):
    lines = ["| N | variant | fwd ms | fwd+bwd ms | fwd TF/s | held for bwd MiB | extra peak GiB |", "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(f"| {r['n']} | {r['variant']} | {r['fwd_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | {r['fwd_tflops']:.0f} | {r['held_for_backward_mib']:.0f} | {r['extra_peak_gib']:.2f} |")
    return "\n".join(lines)


def e2e_table(data):
    rows = [r for r in data["rows"] if "error" not in r]
    base = {(r["seq"], r.get("padded"), r.get("ckpt")): r["tokens_per_s"] for r in rows if r["backend"] == "sdpa-stock"}
    lines = ["| seq | backend | tokens/s | vs stock sdpa | peak GiB | first step s | final loss |", "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['seq']} | {r['backend']} | {r['error'][:40]} | | | | |")
            continue
        b = base.get((r["seq"], r.get("padded"), r.get("ckpt")))
        ratio = f"{r['tokens_per_s'] / b:.2f}x" if b else "-"
        lines.append(f"| {r['seq']} | {r['backend']} | {r['tokens_per_s']:,.0f} | {ratio} | {r['peak_gib']:.1f} | {r['first_step_s']:.1f} | {r['losses'][-1]:.4f} |")
    return "\n".join(lines)


def plot(data, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if "error" not in r]
    seqs = sorted({r["seq"] for r in rows})
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(backends)
    for i, b in enumerate(backends):
        vals = {r["seq"]: r for r in rows if r["backend"] == b}
        xs = [j + i * width for j in range(len(seqs))]
        axes[0].bar(xs, [vals[s]["tokens_per_s"] if s in vals else 0 for s in seqs], width, label=b)
        axes[1].bar(xs, [vals[s]["peak_gib"] if s in vals else 0 for s in seqs], width, label=b)
    for ax, title in zip(axes, ("tokens/s (higher is better)", "peak memory GiB")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(seqs))], [str(s) for s in seqs])
        ax.set_xlabel("sequence length")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.suptitle("Gemma4 31B-shaped 6-layer slice, one training step, H200")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results"
    k = load(folder, "kernel.json")
    if k:
        print("### Kernel (one full layer)\n\n" + kernel_table(k) + "\n")
    for name in ("e2e.json", "e2e_padded.json", "e2e_ckpt_plain.json", "e2e_ckpt_selective.json", "e2e_t512.json"):
        e = load(folder, name)
        if e:
            print(f"### {name}\n\n" + e2e_table(e) + "\n")
            if name == "e2e.json":
                plot(e, os.path.join(folder, "e2e.png"))


if __name__ == "__main__":
    main()
