"""Loading a model file (`model.py`) or a `package.module:build_model` reference, and calling it.

Owns: the model-file contract (`build_model()`, `example_inputs()`, optional `run(model, inputs)`,
optional `INCLUDE` / `EXCLUDE` pattern lists), normalising example inputs to `(args, kwargs)`, and
turning every failure (missing function, a file that raises, inputs the model rejects) into one
`ModelFileError` line naming the file and the cause. A model file is Python and is executed.
Must not know: discovery, measurement, the solver, the CLI.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flextensor_runtime.errors import BudgetError, ModelFileError

__all__ = ["Inputs", "ModelSpec", "build_model", "call_run", "load_model_spec", "make_inputs",
           "normalize_inputs"]  # fmt: skip

RunFn = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class Inputs:
    """Example inputs: `raw` as `example_inputs()` returned them (what `run` receives), and the
    positional / keyword arguments of the default run `model(*args, **kwargs)`."""

    raw: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class ModelSpec:
    """What a model file provides. `source` names it in messages (a path or `pkg.mod:fn`)."""

    source: str
    build: Callable[[], Any]
    example_inputs: Callable[[], Any] | None = None
    run: Callable[..., Any] | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()


def _cause(exc: BaseException, in_file: str | None = None) -> str:
    """`Type: first line of message` plus the line in `in_file` where it was raised, if any."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text if len(text) <= 200 else text[:197] + "..."
    where = ""
    if in_file is not None:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == in_file]
        if frames:
            where = f" (line {frames[-1].lineno})"
    return f"{type(exc).__name__}: {text}{where}" if text else f"{type(exc).__name__}{where}"


def _exec_file(path: Path) -> Any:
    if path.is_dir():
        raise ModelFileError(
            f"{path}: is a folder, not a model file; pass the .py file that defines build_model()"
        )
    if path.exists() and not path.is_file():
        raise ModelFileError(
            f"{path}: is not a regular file (a device or a pipe); pass the .py model file"
        )
    if not path.is_file():
        raise ModelFileError(
            f"{path}: no such model file; pass a .py file or package.module:function"
        )
    name = f"_ftc_model_{abs(hash(str(path.resolve()))):x}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelFileError(f"{path}: cannot be loaded as Python; pass a .py model file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    folder = str(path.parent.resolve())  # now: the file may change the working folder
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        sys.modules.pop(name, None)
        at = f" at line {exc.lineno}" if exc.lineno else ""  # null bytes have no line
        raise ModelFileError(f"{path}: syntax error{at}: {exc.msg}; fix the model file") from None
    except (Exception, SystemExit) as exc:
        sys.modules.pop(name, None)
        raise ModelFileError(
            f"{path}: running the file raised {_cause(exc, str(path.resolve()))}; fix the model file"
        ) from None
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return module


def _import_ref(ref: str, what: str) -> tuple[Any, str]:
    """`pkg.mod:attr` -> (module, attr); `pkg.mod` -> (module, "")."""
    mod_name, _, attr = ref.partition(":")
    cwd = str(Path.cwd())
    added = cwd not in sys.path
    if added:  # like `python -m`: modules in the current folder are importable
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(mod_name)
    except (Exception, SystemExit) as exc:
        if isinstance(exc, ModuleNotFoundError) and ":" not in ref and what == "model":
            raise ModelFileError(
                f"{ref}: no such model file or module ({_cause(exc)}); pass a .py model file or "
                "package.module:build_model"
            ) from None
        raise ModelFileError(
            f"{ref}: importing {mod_name!r} raised {_cause(exc)}; check the {what} reference"
        ) from None
    finally:
        if added:
            sys.path.remove(cwd)
    return module, attr


def _function(module: Any, name: str, source: str, required: bool) -> Callable[..., Any] | None:
    fn = getattr(module, name, None)
    if fn is None:
        if required:
            hint = (
                "def build_model() -> torch.nn.Module" if name == "build_model" else f"def {name}()"
            )
            raise ModelFileError(f"{source}: defines no {name}(); add `{hint}`")
        return None
    if not callable(fn):
        raise ModelFileError(
            f"{source}: {name} is a {type(fn).__name__}, not a function; define it with def"
        )
    return fn


def _patterns(module: Any, name: str, source: str) -> tuple[str, ...]:
    value = getattr(module, name, ())
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
        raise ModelFileError(
            f"{source}: {name} must be a list of pattern strings, got {value!r:.60}"
        )
    return tuple(value)


def load_model_spec(ref: str, inputs_ref: str | None = None) -> ModelSpec:
    """Load `path/to/model.py[:build_model]` or `package.module[:build_model]` (optionally
    `--inputs pkg.mod:fn`)."""
    file_part, _, fn_part = ref.rpartition(":")
    if file_part.endswith(".py") and Path(file_part).is_file() and fn_part:  # file.py:function
        module, source, build_name = _exec_file(Path(file_part)), ref, fn_part
    elif ref.endswith(".py") or Path(ref).is_file() or "/" in ref:
        module, source, build_name = _exec_file(Path(ref)), ref, "build_model"
    else:
        module, build_name = _import_ref(ref, "model")
        build_name = build_name or "build_model"
        source = ref
    build = _function(module, build_name, source, required=True)
    assert build is not None
    inputs_fn = _function(module, "example_inputs", source, required=False)
    if inputs_ref is not None:
        inputs_fn = _inputs_function(inputs_ref, module, ref)
    return ModelSpec(
        source=source,
        build=build,
        example_inputs=inputs_fn,
        run=_function(module, "run", source, required=False),
        include=_patterns(module, "INCLUDE", source),
        exclude=_patterns(module, "EXCLUDE", source),
    )


def _inputs_function(inputs_ref: str, model_module: Any, model_ref: str) -> Callable[..., Any]:
    """`--inputs`: `package.module:fn`, or a file `inputs.py:fn` (the model file itself when it
    names that file: it is not run twice)."""
    file_part, _, fn_part = inputs_ref.rpartition(":")
    if file_part.endswith(".py") and fn_part:
        model_file = model_ref.rpartition(":")[0] if ":" in model_ref else model_ref
        same = (
            Path(model_file).is_file() and Path(file_part).resolve() == Path(model_file).resolve()
        )
        module = model_module if same else _exec_file(Path(file_part))
        name = fn_part
    else:
        module, name = _import_ref(inputs_ref, "inputs")
    fn = _function(module, name or "example_inputs", inputs_ref, True)
    assert fn is not None
    return fn


def build_model(spec: ModelSpec) -> Any:
    """Call `build_model()`; it must return an `nn.Module`."""
    import torch

    try:
        model = spec.build()
    except (Exception, SystemExit) as exc:
        raise ModelFileError(
            f"{spec.source}: build_model() raised {_cause(exc)}; fix build_model()"
        ) from None
    if not isinstance(model, torch.nn.Module):
        raise ModelFileError(
            f"{spec.source}: build_model() returned {type(model).__name__}, not a torch.nn.Module; "
            "return the model"
        )
    if next(iter(model.parameters()), None) is None and next(iter(model.buffers()), None) is None:
        raise ModelFileError(
            f"{spec.source}: build_model() returned a {type(model).__name__} with no parameters "
            "or buffers: there are no weights to offload; return the model with its weights"
        )
    return model


def make_inputs(spec: ModelSpec) -> Inputs:
    """Call `example_inputs()` and normalise what it returns."""
    if spec.example_inputs is None:
        raise ModelFileError(
            f"{spec.source}: defines no example_inputs(); add one returning the forward's "
            "arguments (tuple, dict, or (args, kwargs)), or pass --inputs package.module:function"
        )
    name = getattr(spec.example_inputs, "__name__", "example_inputs")  # or --inputs' function
    try:
        value = spec.example_inputs()
    except (Exception, SystemExit) as exc:
        raise ModelFileError(
            f"{spec.source}: {name}() raised {_cause(exc)}; fix {name}()"
        ) from None
    return normalize_inputs(value, spec.source)


def normalize_inputs(value: Any, source: str = "example_inputs") -> Inputs:
    """tuple -> args; a mapping (a dict, a tokenizer's BatchEncoding) -> kwargs; `(tuple, dict)`
    -> (args, kwargs); anything else -> (value,)."""
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], (tuple, list))
        and isinstance(value[1], Mapping)
    ):
        return Inputs(value, tuple(value[0]), dict(value[1]))
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise ModelFileError(
                f"{source}: example_inputs() returned a dict with non-string keys; "
                "key it by the forward's parameter names"
            )
        return Inputs(value, (), dict(value))
    if isinstance(value, (tuple, list)):
        return Inputs(value, tuple(value), {})
    return Inputs(value, (value,), {})


def _raise_if_out_of_memory(exc: BaseException, source: str) -> None:
    """Running out of GPU memory is not a fault of the inputs: say so, and what helps."""
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        raise BudgetError(
            f"{source}: the forward ran out of GPU memory while profiling ({_cause(exc)}); free "
            "GPU memory, use smaller example inputs, or time on the CPU with --device cpu"
        ) from None


def inputs_on(inputs: Inputs, device: Any) -> Inputs:
    """The inputs with every tensor on `device` (".to(device)"), in containers torch's pytree
    knows (tuple, list, dict, ...) and in mappings that move themselves with `.to` (a
    tokenizer's BatchEncoding: a copy is moved); other objects are passed as they are. The
    caller's inputs are not changed."""
    import torch
    from torch.utils._pytree import tree_map

    def on(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.to(device)
        move = getattr(copy.copy(x), "to", None) if isinstance(x, Mapping) else None
        return move(device) if callable(move) else x  # a copy: BatchEncoding.to is in place

    return normalize_inputs(tree_map(on, inputs.raw))


def call_run(run: RunFn | None, model: Any, inputs: Inputs, source: str) -> Any:
    """One iteration of the workload: `run(model, inputs)` or `model(*args, **kwargs)`.

    Errors become one line naming the model file and the cause.
    """
    try:
        if run is None:
            return model(*inputs.args, **inputs.kwargs)
        return run(model, inputs.raw)
    except ModelFileError:
        raise
    except (Exception, SystemExit) as exc:
        _raise_if_out_of_memory(exc, source)
        if run is None:
            raise ModelFileError(
                f"{source}: the model's forward rejected the example inputs: {_cause(exc)}; fix "
                "example_inputs() or run()"
            ) from None
        in_file = str(Path(source).resolve()) if source.endswith(".py") else None
        raise ModelFileError(
            f"{source}: run(model, inputs) raised {_cause(exc, in_file)}; fix run() or "
            "example_inputs()"
        ) from None
