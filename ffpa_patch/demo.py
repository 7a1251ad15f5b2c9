"""ffpa-patch demo: the main job on an embedded default, with nothing to download.

Builds a random-weight Gemma4 text model with the released attention shapes (sliding layers
head_dim 256 with a window, full layers head_dim 512 with grouped K/V, 5 sliding : 1 full),
trains it a few steps on stock SDPA, then the same steps from the same weights with ffpa_patch,
and prints the step times, where every layer went and the loss difference. On a GPU the
layers have Gemma4-31B's shapes (hidden 5376, 32 query heads); elsewhere a narrow model that
runs in seconds, and the routes then say why nothing was fused.
"""
from __future__ import annotations

import statistics
import time


def _config(layers: int, big: bool) -> dict:
    shape = dict(hidden_size=5376, intermediate_size=21504, num_attention_heads=32, num_key_value_heads=16,
                 num_global_key_value_heads=4, sliding_window=1024) if big else \
        dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
             num_global_key_value_heads=1, sliding_window=64)
    return dict(
        vocab_size=4096, num_hidden_layers=layers, head_dim=256, global_head_dim=512, attention_k_eq_v=True,
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=4096, final_logit_softcapping=30.0,
        tie_word_embeddings=True, use_cache=False, attention_dropout=0.0,
        layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)], **shape)


def _train(model, ids, steps: int, sync) -> tuple[list[float], list[float]]:
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    times, losses = [], []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    return times, losses


#: exit codes beyond 0 (ran): as `ffpa-patch status` uses them; 2 as a bad argument
BAD_SAVE, CANNOT_RUN_HERE, OFF, UNSUPPORTED = 2, 3, 4, 5


def _not_ready(status, backend_patch: str) -> tuple[int, str] | None:
    """(exit code, what to say) when ffpa_patch cannot serve attn_implementation="ffpa" here, else None."""
    from .lifecycle import ACTIVE, UNSUPPORTED_VERSIONS

    if status.state == UNSUPPORTED_VERSIONS:
        return UNSUPPORTED, f"ffpa_patch is off ({status.message})"
    if status.state != ACTIVE:
        return OFF, f"ffpa_patch is off ({status.message})"
    row = next(p for p in status.patches if p["name"] == backend_patch)
    if row["state"] in ("skipped", "not applied", "unsupported versions", "failed"):
        return OFF, f"the {backend_patch} patch, which the demo needs, is {row['state']}: {row['reason']}"
    return None


def _full_layers_fuse_here(device, dtype) -> str | None:
    """None when a full layer of the demo would run a fused kernel here, else why not (asked before any
    step, so strict mode stops the demo at once instead of after the stock steps)."""
    from ffpa_patch.kernels import active
    from ffpa_patch.names import Backend, Layer

    offers = active().offers(Layer.FULL, Backend.FFPA, device, dtype, 512)
    if any(o.problem is None for o in offers):
        return None
    return "; ".join(o.problem for o in offers) or "no kernel serves full layers"


def run(steps: int | None = None, seq: int | None = None, layers: int = 6, out=print, save: str | None = None) -> int:
    """0 when the demo ran; 4/5 (as `ffpa-patch status`) when ffpa_patch is off here; 3 when strict
    mode stopped it on a machine where the full layers cannot run fused. ``save``: a folder to write
    the model to (config and weights: what ``from_pretrained`` takes)."""
    import ffpa_patch
    from ffpa_patch.lifecycle import BACKEND_PATCH

    problem = _not_ready(ffpa_patch.status(), BACKEND_PATCH)
    if problem:
        out(f"ffpa-patch demo: nothing to show: {problem[1]}. `ffpa-patch status` says more.")
        return problem[0]
    import torch

    from ffpa_patch import hf
    from ffpa_patch.names import Backend, Fallback

    cuda = torch.cuda.is_available()
    steps = steps or (5 if cuda else 3)
    seq = seq or (4096 if cuda else 256)
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    strict = ffpa_patch.status().strict
    why_not = _full_layers_fuse_here(torch.device(device), dtype) if strict else None
    if why_not:
        out(f"ffpa-patch demo: strict mode (FFPA_PATCH_STRICT) and no fused kernel can run the full layers here "
            f"({why_not}): nothing run. `ffpa-patch status` says why; without strict mode they run stock SDPA.")
        return CANNOT_RUN_HERE
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    config = _config(layers, big=cuda)
    torch.manual_seed(0)
    with torch.device(device):
        model = hf.causal_lm(hf.GEMMA4, **config).to(dtype)
    config = model.config
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    if save:
        try:
            model.save_pretrained(save)
            hf.byte_level_tokenizer(config).save_pretrained(save)
        except OSError as exc:  # the CLI checked the place; the disk can still be full
            out(f"ffpa-patch demo: --save {save}: cannot write there ({exc.strerror or exc})")
            return BAD_SAVE
        out(f"ffpa-patch demo: wrote the model and a byte-level tokenizer to {save} (random weights, the released "
            f'attention shapes): AutoModelForCausalLM.from_pretrained("{save}", attn_implementation="ffpa") and '
            "AutoTokenizer load them, no download")
    ids = torch.randint(0, config.vocab_size, (1, seq), device=device, generator=torch.Generator(device).manual_seed(1))
    out(f"ffpa-patch demo: {layers} layers (hidden {config.hidden_size}; sliding head_dim 256, window "
        f"{config.sliding_window}; full head_dim 512), {seq} tokens a step, {steps} steps, {device} {str(dtype)[6:]}")

    ffpa_patch.revert()
    model.set_attn_implementation("sdpa")
    stock_times, stock_losses = _train(model, ids, steps, sync)
    model.load_state_dict(weights)
    ffpa_patch.apply(strict=strict)
    ffpa_patch.reset_stats()
    model.set_attn_implementation(Backend.FFPA.value)
    try:
        times, losses = _train(model, ids, steps, sync)
    except ffpa_patch.FFPAFallbackError as exc:
        out(f"  stopped by strict mode (FFPA_PATCH_STRICT): {exc}. No fused kernel can run the full layers on this "
            "machine (`ffpa-patch status` says why); without strict mode they run stock SDPA.")
        return CANNOT_RUN_HERE

    def steady(t):
        return statistics.median(t[1:]) if len(t) > 1 else t[0]

    fused = sum(r["count"] for r in ffpa_patch.stats() if r["kernel"] not in tuple(Fallback))
    out(f"  stock sdpa : first step {stock_times[0]:.2f} s, then {steady(stock_times) * 1e3:.0f} ms a step")
    if fused:
        out(f"  ffpa_patch : first step {times[0]:.2f} s (kernel builds, kept on disk for the next run), then "
            f"{steady(times) * 1e3:.0f} ms a step: {steady(stock_times) / steady(times):.2f}x stock")
    else:
        out(f"  ffpa_patch : first step {times[0]:.2f} s, then {steady(times) * 1e3:.0f} ms a step: no fused kernel "
            "ran here, so both sides ran stock SDPA and there is no speed-up to show")
    out("  where each attention call went (layer -> kernel: reason  count):")
    for r in ffpa_patch.stats():
        out(f"    {r['layer']:<7} -> {r['kernel']:<5}: {r['reason']}  {r['count']}")
    diff = max(abs(a - b) for a, b in zip(losses, stock_losses))
    out(f"  loss, stock vs ffpa_patch, step by step: {' '.join(f'{a:.4f}/{b:.4f}' for a, b in zip(stock_losses, losses))}"
        f" (largest difference {diff:.2e})")
    if not fused:
        out("  nothing was fused here: the FFPA / flash-attn-4 kernels need a Hopper GPU (Blackwell: untested) with "
            "ffpa-attn installed (`ffpa-patch status` says what is missing); every call ran stock SDPA (with the "
            "repeat-K/V fix on Transformers 5.5-5.12), so the losses match stock's to rounding.")
    return 0
