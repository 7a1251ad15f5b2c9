"""The status object ``apply()`` and ``status()`` return: readable as text, dumpable as JSON."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .versions import VersionCheck


@dataclass
class Status:
    active: bool
    strict: bool
    message: str
    state: str = "not applied"  # active, disabled, misconfigured, unsupported versions, failed, reverted
    versions: list[VersionCheck] = field(default_factory=list)
    patches: list[dict] = field(default_factory=list)
    routes: list[dict] = field(default_factory=list)
    compiles: dict = field(default_factory=dict)  # {"flex_attention": compiles, "ffpa-attn": kernels held, ...}
    kernel_cache: dict = field(default_factory=dict)  # package -> where its compiled kernels are kept
    backwards: dict = field(default_factory=dict)  # the FFPA full layers' backward: {"triton": n, "ffpa-attn (why)": m}

    def as_dict(self) -> dict:
        data = asdict(self)
        data["versions"] = [dict(asdict(v), message=v.message) for v in self.versions]
        return data

    def __str__(self) -> str:
        lines = [f"ffpa_patch: {self.message}" + (" [strict]" if self.strict else "")]
        lines.append("  packages:")  # missing optional ones too, as --json has them
        lines += [f"    {v.name:<16} {v.installed or '-':<12} {v.state:<14} works with {v.supported}"
                  + ("" if v.required or v.installed else " (optional)") for v in self.versions]
        lines.append("  patches:")
        shown = set()  # a machine-wide warning (no GPU, a kernel package missing) is printed once
        for p in self.patches:
            lines.append(f"    {p['name']:<22} {p['state']:<20} {p['reason']}")
            warned = p.get("warnings", [])
            lines += [f"      WARNING: {w}" for w in warned if w not in shown]
            if warned and set(warned) <= shown:
                lines.append("      WARNING: as above")
            shown.update(warned)
        if self.routes:
            lines.append("  attention calls (layer -> kernel: reason  count):")
            lines += [f"    {r['layer']:<7} -> {r['kernel']:<5}: {r['reason']}  {r['count']}" for r in self.routes]
        for what, n in self.compiles.items():
            if what == "flex_attention":
                lines.append(f"  {what} compiles: {n} (automatic dynamic shapes: 2 expected, a new one per step means recompiling)")
            else:
                lines.append(f"  {what} kernels built or loaded: {n} (one per dtype/head_dim/pass/varlen, never per length: "
                             "a count that grows every step means recompiling)")
        if self.backwards:
            lines.append("  full layers' backward (head_dim 512; count): "
                         + ", ".join(f"{which} {n}" for which, n in self.backwards.items()))
        for package, where in self.kernel_cache.items():
            lines.append(f"  {package} compiled kernels: {where}")
        return "\n".join(lines)
