"""OffloadConfig: glossary names, validation messages, misspelt options, PlanConfig mapping."""

from __future__ import annotations

import pytest

from flextensor_compile.config import OffloadConfig
from flextensor_runtime.errors import ConfigError


def test_misspelt_option_suggests_the_right_name():
    with pytest.raises(
        ConfigError, match="no option 'max_gpu_mem_fractoin'; did you mean 'max_gpu_mem_fraction'"
    ):
        OffloadConfig(max_gpu_mem_fractoin=0.5)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match="did you mean 'include_patterns'"):
        OffloadConfig.from_options({"include_pattern": ["layers.*"]})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_gpu_mem_fraction": 1.5}, r"max_gpu_mem_fraction 1.5 must be in \(0, 1\]"),
        ({"max_gpu_mem_fraction": 0.5, "budget_bytes": 10}, "give only one of"),
        ({"profiling_iters": 0}, "profiling_iters 0 must be a positive integer"),
        ({"num_blocks": 1, "min_blocks": 2}, "num_blocks 1 is below min_blocks 2"),
        (
            {"load_strategy": "knapsak"},
            "load_strategy 'knapsak' is not known; did you mean 'knapsack'",
        ),
        ({"transfer_mode": "raw"}, "transfer_mode 'raw' is not known"),
        ({"target": "h100"}, "unknown target 'h100'; did you mean"),
        ({"include_patterns": ("",)}, "must be non-empty strings"),
        ({"h2d_bytes_per_s": -1.0}, "h2d_bytes_per_s -1.0 must be a positive number"),
    ],
)
def test_invalid_values_give_one_line(options, message):
    with pytest.raises(ConfigError, match=message) as info:
        OffloadConfig.from_options(options)
    assert "\n" not in str(info.value)


def test_plan_config_uses_the_glossary_fields():
    cfg = OffloadConfig(include_patterns="layers.*", max_gpu_mem_fraction=0.6, load_strategy="greedy",
                        num_blocks=3, target="H100-SXM", seed=7)  # fmt: skip
    assert cfg.include_patterns == ("layers.*",) and cfg.target == "h100-sxm"
    plan = cfg.to_plan_config()
    assert (plan.include_patterns, plan.mem_fraction, plan.strategy, plan.num_blocks, plan.seed) == (
        ("layers.*",), 0.6, "greedy", 3, 7)  # fmt: skip
    assert cfg.replace(seed=8).seed == 8 and cfg.seed == 7


def test_model_file_patterns_only_fill_in_missing_ones():
    cfg = OffloadConfig(include_patterns=("a.*",))
    filled = cfg.with_patterns(("b.*",), ("c",))
    assert filled.include_patterns == ("a.*",) and filled.exclude_patterns == ("c",)


def test_config_and_target_table_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from flextensor_compile.config import OffloadConfig; "
            "OffloadConfig(target='h200', budget_bytes=2**30); assert 'torch' not in sys.modules")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)


def test_plan_command_is_canonical():
    from flextensor_compile.config import plan_command

    cfg = OffloadConfig(max_gpu_mem_fraction=0.6, num_blocks=3, seed=2)
    assert plan_command(cfg.to_plan_config()) == (
        "ftc plan --mem-fraction 0.6 --strategy adaptive --num-blocks 3 --seed 2")  # fmt: skip
    assert plan_command(OffloadConfig(budget_bytes=1024).to_plan_config()) == (
        "ftc plan --budget 1024 --strategy adaptive")  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "flag"),
    [
        ({"max_gpu_mem_fraction": 0.0}, "(--mem-fraction)"),
        ({"load_strategy": "knapsak"}, "(--strategy)"),
        ({"num_blocks": 0}, "(--num-blocks)"),
        ({"warmup_iters": -1}, "(--warmup-iters)"),
        ({"device": "tpu"}, "(--device)"),
    ],
)
def test_option_errors_name_the_ftc_option(kwargs, flag):
    with pytest.raises(ConfigError) as info:
        OffloadConfig(**kwargs)
    assert str(info.value).endswith(flag)
