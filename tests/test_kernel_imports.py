"""The kernel packages are imported so that the import keeps nothing of the caller alive."""
import gc
import sys
import weakref

from ffpa_patch.kernels import import_problem


class Model:
    """Stands for the model whose first forward triggers the lazy import."""


def first_forward(model, module):
    return import_problem(module, "a kernel package")


def test_a_kernel_import_keeps_none_of_the_callers_frames(tmp_path, monkeypatch):
    # Like CuTeDSL's decorators, the module keeps the frame that defines it; a finished
    # frame keeps its f_back chain, which must not reach first_forward's ``model``.
    (tmp_path / "keeps_its_frame.py").write_text("import sys\nFRAME = sys._getframe()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        model = Model()
        alive = weakref.ref(model)
        assert first_forward(model, "keeps_its_frame") is None
        frame = sys.modules["keeps_its_frame"].FRAME
        assert frame.f_back is not None  # the chain is there; it ends in the helper thread
        del model, frame
        gc.collect()
        assert alive() is None
    finally:
        sys.modules.pop("keeps_its_frame", None)


def test_import_problem_says_what_is_missing():
    assert import_problem("json", "json") is None
    missing = import_problem("no_such_kernel_package", "no-such-kernels")
    assert missing.startswith("no-such-kernels not importable (ModuleNotFoundError")
    assert "no_such_attr" in import_problem("json", "json", attr="no_such_attr")


def test_the_table_built_at_install_imports_no_kernel_package():
    """The routing patches build (and check) the production table when Transformers' registry is
    imported; the kernel packages themselves still wait for the first attention call. A fake
    ffpa_attn on the path records whether anything imported it."""
    from conftest import run_python

    code = ("import sys, os, tempfile\n"
            "d = tempfile.mkdtemp(); os.makedirs(os.path.join(d, 'ffpa_attn'))\n"
            "open(os.path.join(d, 'ffpa_attn', '__init__.py'), 'w').write('raise SystemExit(\"imported\")')\n"
            "sys.path.insert(0, d)\n"
            "import ffpa_patch, transformers.modeling_utils\n"
            "from ffpa_patch import kernels\n"
            "print(kernels._active is not None, 'ffpa_attn' in sys.modules, 'flash_attn' in sys.modules)\n")
    assert run_python(code).strip().splitlines()[-1] == "True False False"
