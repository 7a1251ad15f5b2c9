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
