"""The package's shape, as the routing design promises it (docs/design.md)."""
import ast
import os

import pytest

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ffpa_patch")


def imports_of(path: str) -> set[str]:
    """The ffpa_patch modules a file imports (relative imports resolved), at any depth."""
    module = os.path.relpath(path, os.path.dirname(PKG))[:-3].replace(os.sep, ".").removesuffix(".__init__")
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if base.startswith("ffpa_patch"):
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("ffpa_patch"))
    return found


def modules(sub: str):
    folder = os.path.join(PKG, sub)
    return {os.path.join(folder, f): f"ffpa_patch.{sub}.{f[:-3]}".removesuffix(".__init__")
            for f in os.listdir(folder) if f.endswith(".py")}


def test_kernels_import_nothing_from_routing():
    for path in modules("kernels"):
        assert not {m for m in imports_of(path) if m.startswith("ffpa_patch.routing")}, path


def test_routing_has_no_import_cycle():
    routing = modules("routing")
    names = set(routing.values())
    graph = {name: {m for m in imports_of(path) if m in names and m != name} for path, name in routing.items()}

    def visit(node, stack):
        assert node not in stack, " -> ".join(stack + [node])
        for nxt in graph[node]:
            visit(nxt, stack + [node])

    for name in graph:
        visit(name, [])


def test_the_lifecycle_does_not_reach_into_kernel_modules():
    source = open(os.path.join(PKG, "lifecycle.py")).read()
    assert "ffpa_patch.kernels." not in source and "_swapped" not in source


@pytest.mark.parametrize("name", ["record_at_trace_time", "sdpa_pinned"])
def test_policy_marks_its_trace_time_functions_as_torch_does(name):
    """policy.py marks these for Dynamo without importing torch; torch's own decorator must still
    mark a function the same way, or they would be traced instead of called once."""
    import torch

    from ffpa_patch.routing import policy

    def probe():
        return 0

    marked = torch.compiler.assume_constant_result(probe)
    extra = set(vars(marked)) - set()
    assert extra and all(getattr(getattr(policy, name), attr, None) == getattr(marked, attr) for attr in extra)


def _package_files():
    for folder, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                yield os.path.join(folder, f)


def test_only_hf_reaches_into_transformers():
    """hf.py is the one adapter: no other module imports Transformers, names one of its modules,
    or reads its registries' private mappings (so a Transformers change is one edit there)."""
    offenders = {}
    for path in _package_files():
        if path.endswith(os.path.join("ffpa_patch", "hf.py")):
            continue
        tree = ast.parse(open(path).read())
        for node in ast.walk(tree):
            bad = (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "transformers"
                   or isinstance(node, ast.Import) and any(a.name.split(".")[0] == "transformers" for a in node.names)
                   or isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("transformers.")
                   or isinstance(node, ast.Attribute) and node.attr in ("_global_mapping", "_local_mapping"))
            if bad:
                offenders.setdefault(os.path.relpath(path, PKG), []).append(node.lineno)
    assert offenders == {}


def test_decisions_name_no_kernel():
    """Routing, the plan, the CLI and the demo take kernel names from the kernel table: no string
    in them is a kernel's name (the catalog's), so a kernel under another name routes the same."""
    from ffpa_patch.kernels import CATALOG

    names = {k.name for k in CATALOG}
    files = [p for p in _package_files() if os.sep + "routing" + os.sep in p
             or os.path.basename(p) in ("plan.py", "cli.py", "demo.py", "machine.py", "checkpointing.py")]
    found = [(os.path.relpath(p, PKG), node.lineno) for p in files for node in ast.walk(ast.parse(open(p).read()))
             if isinstance(node, ast.Constant) and node.value in names]
    assert found == []


def test_public_exceptions_live_in_one_module():
    import ffpa_patch
    from ffpa_patch import errors

    for name in ("UnsupportedVersionError", "FFPANotAppliedError", "FFPAFallbackError", "FFPAPatchWarning"):
        assert getattr(ffpa_patch, name) is getattr(errors, name)
        assert getattr(ffpa_patch, name).__module__ == "ffpa_patch.errors"
