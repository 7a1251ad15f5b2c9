"""What the README tells a user works: its Python snippets run, every ``ffpa_patch.*`` name
it shows resolves after ``import ffpa_patch``, its switches are the ones read, and its
version facts match the installed Transformers."""
import os
import re

import pytest

import ffpa_patch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.S)


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """What the snippets leave to the reader: a model folder (``path``) and tokenized documents."""
    import tiny

    model = tiny.causal_lm("dense31b", attn="sdpa")
    model.save_pretrained(tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    docs = [{"input_ids": list(range(1, 9 + i))} for i in range(8)]
    return {"path": str(tmp_path / "model"), "tokenized": docs}


def test_the_readme_has_the_snippets_this_file_runs():
    blocks = python_blocks()
    assert len(blocks) == 3
    assert 'attn_implementation="ffpa"' in blocks[0] and "Trainer(" in blocks[1]
    assert 'sp_backend="deepspeed"' in blocks[2]


def test_the_sequence_parallel_recipe_compiles_and_its_imports_exist():
    """Across GPUs: its imports resolve in this accelerate, and it asks for what the Ulysses tests run
    (tests/ulysses_trainer_worker.py trains exactly this configuration on 2 gloo ranks)."""
    block = python_blocks()[2]
    compile(block, "README.md Across GPUs", "exec")
    dataclasses = pytest.importorskip("accelerate.utils.dataclasses")
    if not hasattr(dataclasses, "DeepSpeedSequenceParallelConfig"):
        pytest.skip("this accelerate has no DeepSpeed sequence parallelism")
    exec("\n".join(line for line in block.splitlines() if line.startswith(("from ", "import "))), {})
    assert 'sp_attn_implementation="sdpa"' in block and 'attn_implementation="sdpa"' in block


def test_quick_start_runs_and_status_shows_the_calls(user_files, capsys, patched):
    quick = python_blocks()[0]
    hub = 'path = "google/gemma-4-E2B-it"'
    assert hub in quick
    quick = quick.replace(hub, f"path = {user_files['path']!r}")  # the one change a machine without the Hub needs
    scope = {}
    exec(compile(quick, "README.md quick start", "exec"), scope)
    assert scope["model"].config._attn_implementation == "ffpa"
    printed = capsys.readouterr().out
    assert "attention calls (layer -> kernel: reason  count):" in printed  # the forward ran before status()
    assert {r["layer"] for r in ffpa_patch.status().routes} == {"full", "sliding"}  # every layer type was routed


def test_the_first_command_after_install_is_the_demo():
    install, quick = README.index("## Install"), README.index("## Quick start")
    first = re.search(r"```bash\n(.*?)```", README[quick:], re.S).group(1).strip()
    assert first == "ffpa-patch demo" and install < quick


def test_trainer_snippet_trains(user_files, patched):
    scope = dict(user_files)
    ffpa_patch.reset_stats()
    snippet = python_blocks()[1]
    assert "bf16=True," in snippet
    snippet = snippet.replace("bf16=True,", "bf16=True, use_cpu=True,")  # the one change a CPU machine needs
    exec(compile(snippet, "README.md Trainer", "exec"), scope)  # bf16=True: CPU autocast over fp32 weights
    assert ffpa_patch.stats() and all(r["count"] > 0 for r in ffpa_patch.stats())
    assert os.path.isdir("out")


def test_every_ffpa_patch_name_in_the_readme_resolves():
    names = set(re.findall(r"ffpa_patch\.([A-Za-z_][\w.]*\w)", README))
    assert {"status", "checkpointing.context_fn", "FFPAFallbackError", "revert"} <= names
    for dotted in names:
        obj = ffpa_patch
        for part in dotted.split("."):
            obj = getattr(obj, part)  # AttributeError names the README's broken promise


def test_the_switches_table_lists_exactly_the_variables_read():
    from ffpa_patch import env

    source = open(env.__file__, encoding="utf-8").read()
    read = set(re.findall(r'"(FFPA_PATCH_[A-Z0-9_]+)"', source))
    table = README[README.index("## Environment switches"):README.index("## Guarantees")]
    assert set(re.findall(r"`(FFPA_PATCH_[A-Z0-9_]+)", table)) == read


def test_patch_names_in_the_readme_are_the_patches():
    table = README[README.index("## Environment switches"):README.index("## Guarantees")]
    row = next(line for line in table.splitlines() if "FFPA_PATCH_TARGETS" in line)
    assert set(re.findall(r"`([a-z0-9_]+)`", row)) == set(ffpa_patch.PATCH_NAMES)


def test_the_checkpointing_rename_happened_where_the_readme_says():
    """README: Transformers 5.23 renamed gradient_checkpointing to activation_checkpointing."""
    import transformers
    from packaging.version import Version
    from transformers import PreTrainedModel, TrainingArguments

    assert "Transformers 5.23 renamed it `activation_checkpointing`" in README
    renamed = Version(transformers.__version__) >= Version("5.23")
    assert hasattr(PreTrainedModel, "activation_checkpointing_enable") == renamed
    assert ("activation_checkpointing" in TrainingArguments.__dataclass_fields__) == renamed
    assert hasattr(PreTrainedModel, "gradient_checkpointing_enable")  # the old name works everywhere


def test_the_readme_stays_a_page():
    assert len(README.splitlines()) <= 200  # measurements and their stories live in benchmarks/README.md
