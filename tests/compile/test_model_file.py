"""The model-file contract and each bad-input case: one line naming the file and the cause."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from flextensor_compile.cli.app import app
from flextensor_compile.cli.errors import run_guarded
from flextensor_compile.model_file import (
    build_model,
    call_run,
    inputs_on,
    load_model_spec,
    make_inputs,
    normalize_inputs,
)
from flextensor_runtime.errors import ModelFileError

GOOD = """
import torch
INCLUDE = ["?"]
def build_model():
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
def example_inputs():
    return (torch.ones(1, 4),)
"""


def _write(tmp_path: Path, text: str, name: str = "model.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_good_file_gives_functions_and_patterns(tmp_path):
    spec = load_model_spec(_write(tmp_path, GOOD))
    assert spec.include == ("?",) and spec.run is None
    model = build_model(spec)
    out = call_run(spec.run, model, make_inputs(spec), spec.source)
    assert out.shape == (1, 4)


def test_module_reference_with_inputs_reference():
    spec = load_model_spec(
        "profiles.tiny_transformer:build_model", "profiles.tiny_transformer:example_inputs"
    )
    assert spec.source == "profiles.tiny_transformer:build_model"
    assert make_inputs(spec).args[0].shape == (1, 32)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "import torch\n",
            r"model\.py: defines no build_model\(\); add `def build_model\(\) -> torch\.nn\.Module`",
        ),
        (
            "x = 1\nraise RuntimeError('boom')\n",
            r"model\.py: running the file raised RuntimeError: boom \(line 2\)",
        ),
        ("def build_model(:\n", r"model\.py: syntax error at line 1"),
        ("build_model = 3\n", r"build_model is a int, not a function"),
        (
            "INCLUDE = 3\ndef build_model():\n    return None\n",
            r"INCLUDE must be a list of pattern strings",
        ),
    ],
)
def test_bad_files(tmp_path, text, message):
    with pytest.raises(ModelFileError, match=message):
        load_model_spec(_write(tmp_path, text))


def test_inputs_reference_to_a_model_file(tmp_path):
    """`--inputs model.py:fn` (as `model.py:make` builds) was imported as a module named
    '/path/model' and failed with ModuleNotFoundError; a file reference works now, and names
    the model file itself without running it again."""
    model = tmp_path / "model.py"
    model.write_text(GOOD + "RUNS = []\nRUNS.append(1)\ndef wide():\n    return (torch.ones(3, 4),)\n")
    spec = load_model_spec(str(model), f"{model}:wide")
    assert make_inputs(spec).args[0].shape == (3, 4)
    assert spec.example_inputs.__globals__ is spec.build.__globals__  # one run of the file
    assert spec.build.__globals__["RUNS"] == [1]
    other = tmp_path / "inputs.py"
    other.write_text("import torch\ndef example_inputs():\n    return (torch.ones(5, 4),)\n")
    spec = load_model_spec(f"{model}:build_model", f"{other}:example_inputs")
    assert make_inputs(spec).args[0].shape == (5, 4)
    with pytest.raises(ModelFileError, match="defines no nope\\(\\)"):
        load_model_spec(str(model), f"{model}:nope")


def test_build_and_inputs_failures(tmp_path):
    spec = load_model_spec(_write(tmp_path, "def build_model():\n    return 3\n"))
    with pytest.raises(
        ModelFileError, match=r"build_model\(\) returned int, not a torch\.nn\.Module"
    ):
        build_model(spec)
    with pytest.raises(ModelFileError, match="defines no example_inputs\\(\\)"):
        make_inputs(spec)
    spec = load_model_spec(_write(tmp_path, "def build_model():\n    raise KeyError('w')\n"))
    with pytest.raises(ModelFileError, match="build_model\\(\\) raised KeyError: 'w'"):
        build_model(spec)


def test_inputs_the_model_rejects(tmp_path):
    spec = load_model_spec(_write(tmp_path, GOOD.replace("torch.ones(1, 4)", "torch.ones(1, 5)")))
    with pytest.raises(
        ModelFileError,
        match=r"model\.py: the model's forward rejected the example inputs: RuntimeError: mat1 and mat2",
    ) as info:
        call_run(spec.run, build_model(spec), make_inputs(spec), spec.source)
    assert "\n" not in str(info.value)


def test_missing_file_and_module():
    with pytest.raises(ModelFileError, match="no such model file"):
        load_model_spec("does/not/exist.py")
    with pytest.raises(
        ModelFileError, match="importing 'no_such_pkg_xyz' raised ModuleNotFoundError"
    ):
        load_model_spec("no_such_pkg_xyz:build_model")


def test_input_forms():
    x = torch.ones(1)
    assert normalize_inputs((x,)).args == (x,)
    assert normalize_inputs({"a": x}).kwargs == {"a": x}
    both = normalize_inputs(((x,), {"b": x}))
    assert both.args == (x,) and both.kwargs == {"b": x}
    assert normalize_inputs(x).args == (x,)


def test_a_tokenizer_batch_is_keyword_inputs_and_moves_whole():
    # example_inputs() returning tokenizer(...) output: a BatchEncoding, a mapping that is not
    # a dict; its tensors are keyword arguments and it moves itself with .to(device)
    from transformers import BatchEncoding

    batch = BatchEncoding({"input_ids": torch.ones(1, 3, dtype=torch.long)})
    inputs = normalize_inputs(batch)
    assert inputs.args == () and list(inputs.kwargs) == ["input_ids"]
    moved = inputs_on(inputs, "meta")
    assert isinstance(moved.raw, BatchEncoding) and moved.kwargs["input_ids"].device.type == "meta"
    nested = inputs_on(normalize_inputs(((torch.ones(2),), {"mask": torch.ones(2)})), "meta")
    assert nested.args[0].device.type == nested.kwargs["mask"].device.type == "meta"
    assert batch["input_ids"].device.type == "cpu"  # the caller's inputs are not changed


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("import torch\n", "defines no build_model()"),
        (
            "raise ValueError('bad config')\n",
            "running the file raised ValueError: bad config (line 1)",
        ),
        (GOOD.replace("torch.ones(1, 4)", "torch.ones(1, 5)"), "rejected the example inputs"),
    ],
)
def test_cli_bad_input_is_one_line_exit_1(tmp_path, capsys, text, cause):
    path = _write(tmp_path, text)
    out = str(tmp_path / "p.msgpack")
    code = run_guarded(lambda: app(["profile", path, "-o", out, "--quiet"], prog_name="ftc"), False)
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1 and err.startswith(f"ftc: model file: {path}: ")
    assert cause in err
    assert not Path(out).exists()


def test_folder_is_named_as_a_folder(tmp_path):
    with pytest.raises(ModelFileError, match=r"is a folder, not a model file; pass the \.py file"):
        load_model_spec(str(tmp_path))


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("import sys\nsys.exit(3)\n", "running the file raised SystemExit: 3 (line 2)"),
        (
            "import sys\ndef build_model():\n    sys.exit('no weights')\n",
            "build_model() raised SystemExit: no weights",
        ),
        (
            GOOD.replace("return (torch.ones(1, 4),)", "raise SystemExit(2)"),
            "example_inputs() raised SystemExit: 2",
        ),
    ],
)
def test_sys_exit_in_the_model_file_is_one_line_exit_1(tmp_path, capsys, text, cause):
    path = _write(tmp_path, text)
    out = str(tmp_path / "p.msgpack")
    code = run_guarded(lambda: app(["profile", path, "-o", out, "--quiet"], prog_name="ftc"), False)
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert err.startswith(f"ftc: model file: {path}: ") and cause in err
    assert not Path(out).exists()


def test_model_without_weights_is_refused(tmp_path):
    text = "import torch\ndef build_model():\n    return torch.nn.Sequential(torch.nn.ReLU())\n"
    spec = load_model_spec(_write(tmp_path, text))
    with pytest.raises(
        ModelFileError, match=r"returned a Sequential with no parameters or buffers: there are no"
    ):
        build_model(spec)


def test_missing_file_without_py_suffix_is_named_as_missing():
    with pytest.raises(
        ModelFileError, match=r"notes\.txt: no such model file or module \(ModuleNotFoundError"
    ):
        load_model_spec("notes.txt")


def test_run_that_raises_is_named_with_its_line(tmp_path):
    text = GOOD + "def run(model, inputs):\n    raise KeyError('steps')\n"
    spec = load_model_spec(_write(tmp_path, text))
    with pytest.raises(
        ModelFileError, match=r"run\(model, inputs\) raised KeyError: 'steps' \(line 9\); fix run"
    ):
        call_run(spec.run, build_model(spec), make_inputs(spec), spec.source)


def test_a_model_file_may_name_its_build_function(tmp_path):
    """`model.py:make` builds with `make()`, as `package.module:make` does."""
    path = _write(tmp_path, GOOD.replace("def build_model", "def make"))
    spec = load_model_spec(f"{path}:make")
    assert spec.source == f"{path}:make" and isinstance(build_model(spec), torch.nn.Sequential)
    with pytest.raises(ModelFileError, match=r"defines no nope\(\)"):
        load_model_spec(f"{path}:nope")


def test_a_failing_inputs_function_is_named_as_given(tmp_path):
    path = _write(tmp_path, GOOD + "def bad_inputs():\n    raise KeyError('x')\n")
    spec = load_model_spec(path)
    spec = dataclasses.replace(spec, example_inputs=spec.build.__globals__["bad_inputs"])
    with pytest.raises(ModelFileError, match=r"bad_inputs\(\) raised KeyError.*fix bad_inputs\(\)"):
        make_inputs(spec)
