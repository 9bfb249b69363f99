"""`python -m profiles.demo MODEL_FILE PROFILE` (the deploy step of `make demo`) on the bundled
model files whose outputs are not one tensor: the real MiniLM checkpoint (a transformers
`ModelOutput`) and the small Llama, whose model file runs `generate`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers.modeling_outputs import BaseModelOutput

from flextensor_compile.cli.app import app
from flextensor_compile.cli.errors import run_guarded
from profiles import demo

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("model_file", ["profiles/minilm.py", "profiles/llama_small.py"])
def test_demo_deploys_model_files_with_structured_outputs(tmp_path, capsys, monkeypatch,
                                                          model_file):  # fmt: skip
    out = tmp_path / "p.msgpack"
    code = run_guarded(lambda: app(["profile", str(ROOT / model_file), "--mem-fraction", "0.9",
                                    "--profiling-iters", "1", "--warmup-iters", "0", "--quiet",
                                    "-o", str(out)], prog_name="ftc"), False)  # fmt: skip
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    monkeypatch.setattr(sys, "argv", ["demo", str(ROOT / model_file), str(out)])
    assert demo.main() == 0
    printed = capsys.readouterr().out
    assert "outputs bit-identical to the plain model: True" in printed
    assert "after remove(): outputs bit-identical: True" in printed


def test_same_outputs_compares_structure_and_every_tensor():
    a = BaseModelOutput(last_hidden_state=torch.ones(2, 3), hidden_states=(torch.zeros(1),))
    same = BaseModelOutput(last_hidden_state=torch.ones(2, 3), hidden_states=(torch.zeros(1),))
    assert demo.same_outputs(a, same)
    inner = BaseModelOutput(last_hidden_state=torch.ones(2, 3), hidden_states=(torch.ones(1),))
    assert not demo.same_outputs(a, inner)  # a tensor deep inside differs
    assert not demo.same_outputs(a, BaseModelOutput(last_hidden_state=torch.ones(2, 3)))
    assert not demo.same_outputs((torch.ones(1),), (torch.ones(1), torch.ones(1)))
    assert not demo.same_outputs({"a": torch.ones(1)}, {"b": torch.ones(1)})  # other keys
    assert not demo.same_outputs(torch.ones(1), 1.0)
    assert demo.same_outputs([torch.ones(1), None], (torch.ones(1), None))
