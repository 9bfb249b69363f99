"""Profiles made by the compiler (`compile_profile`) deploy with bit-identical outputs in every
transfer mode, follow their schedule (no stalls) and stay within their predicted peak.
Skipped where the compiler is not installed."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.runtime.conftest import assert_same, deploy, snapshot

compile_api = pytest.importorskip("flextensor_compile.compile_api", reason="no compiler here")
config = pytest.importorskip("flextensor_compile.config")


def _first(out):
    out = out[0] if isinstance(out, tuple) else out
    for attr in ("last_hidden_state", "sample", "logits"):
        out = getattr(out, attr, out)
    return out


@pytest.mark.parametrize("name", ["tiny_transformer", "llama_small", "flux_small"])
@pytest.mark.parametrize("mode", ["allocation_block_transfer", "strategy", "raw_block_transfer"])
def test_compiled_profile(name: str, mode: str) -> None:
    module = pytest.importorskip(f"profiles.{name}", reason="bundled example not here")
    run = getattr(module, "run", None)
    call = run or (lambda model, inputs: model(**inputs))
    reference = module.build_model()
    cfg = config.OffloadConfig(max_gpu_mem_fraction=0.9, profiling_iters=1, warmup_iters=0)
    profile = compile_api.compile_profile(reference, module.example_inputs, cfg, run=run)
    profile = replace(profile, config=replace(profile.config, transfer_mode=mode))
    inputs = module.example_inputs()
    with torch.no_grad():
        expected = _first(call(reference, inputs))
    model = module.build_model()
    before = snapshot(model)
    h = deploy(model, profile)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(_first(call(model, inputs)), expected)
    assert h.report().stalls == 0
    assert h.backend.peak_held_bytes <= profile.predicted.peak_bytes
    issued = {(e["transfer"], e["at"]) for e in h.events.of_kind("issue") if e["at"] >= 0}
    assert issued <= {(t.trap, t.issue_at) for t in profile.schedule}
    h.remove()
    assert_same(model, before)
