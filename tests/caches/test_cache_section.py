"""The `caches` profile section: data round trips, one-line errors, the CLI spec syntax."""

from __future__ import annotations

import msgpack
import pytest

from flextensor_runtime.cache_section import (
    AdaptiveResidualPolicy,
    CacheSection,
    FixedStepPolicy,
    cache_section_from_extensions,
    cache_section_to_data,
    parse_cache_section,
    parse_cache_spec,
)
from flextensor_runtime.errors import ConfigError

FIXED = {"module": "transformer", "policy": "fixed-step", "skip_steps": [7, 3, 5, 3],
         "delta_scale": 1, "dense_last": 2}  # fmt: skip
ADAPTIVE = {"module": "", "policy": "adaptive-residual", "threshold": 0.1,
            "signal": "hidden_states", "residual_input": "hidden_states", "subsample": 4}  # fmt: skip


def test_parse_fixed_step_section() -> None:
    section = parse_cache_section(FIXED)
    assert section == CacheSection(
        "transformer", FixedStepPolicy(skip_steps=(3, 5, 7), delta_scale=1.0, dense_last=2)
    )
    assert section.policy_name == "fixed-step"
    assert isinstance(section.policy.delta_scale, float)


@pytest.mark.parametrize("data", [FIXED, ADAPTIVE])
def test_data_round_trips_through_msgpack(data: dict) -> None:
    section = parse_cache_section(data)
    written = cache_section_to_data(section)
    assert parse_cache_section(msgpack.unpackb(msgpack.packb(written))) == section
    assert None not in written.values()


def test_adaptive_section_defaults() -> None:
    section = parse_cache_section({"policy": "adaptive-residual", "threshold": 0.2})
    assert section.module == ""
    assert section.policy == AdaptiveResidualPolicy(threshold=0.2)
    assert cache_section_to_data(section) == {
        "module": "", "policy": "adaptive-residual", "threshold": 0.2, "warmup_steps": 1,
        "max_consecutive_hits": 3, "dense_last": 1, "subsample": 1, "eps": 1e-6, "signal": "0",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "is a list; write a map"),
        ({"policy": "teacache"}, "policy 'teacache' is unknown"),
        ({"policy": "fixed-step", "threshold": 0.1}, "unknown field 'threshold'"),
        ({"policy": "fixed-step", "dense_first": True}, "'dense_first'=True is invalid"),
        ({"policy": "fixed-step", "skip_steps": [1, "2"]}, "pass a list of integers"),
        ({"policy": "fixed-step", "skip_steps": [-1]}, "skip_steps entry=-1 is invalid"),
        ({"policy": "fixed-step", "module": 3}, "module=3 is invalid"),
        ({"policy": "adaptive-residual"}, "lacks 'threshold'"),
        ({"policy": "adaptive-residual", "threshold": "0.1"}, "pass a number"),
        ({"policy": "adaptive-residual", "threshold": 0.1, "eps": 0}, "eps=0.0 is invalid"),
        ({"policy": "adaptive-residual", "threshold": 0.1, "signal": ""}, "signal='' is invalid"),
    ],
)
def test_bad_sections_raise_one_line_config_errors(data: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_cache_section(data)
    assert "\n" not in str(info.value)
    assert str(info.value).startswith("profile section 'caches'")


def test_spec_syntax() -> None:
    data = parse_cache_spec("fixed-step:module=transformer;skip=1,3, 8-12/2;dense-first=1")
    assert data == {"policy": "fixed-step", "module": "transformer",
                    "skip_steps": [1, 3, 8, 10, 12], "dense_first": 1}  # fmt: skip
    section = parse_cache_section(data)
    assert section.policy == FixedStepPolicy(skip_steps=(1, 3, 8, 10, 12))
    assert parse_cache_spec("fixed-step") == {"policy": "fixed-step"}
    adaptive = parse_cache_spec(" adaptive-residual : threshold=0.05; signal=timestep ;")
    assert adaptive == {"policy": "adaptive-residual", "threshold": 0.05, "signal": "timestep"}
    assert parse_cache_spec("fixed-step:skip=2-5")["skip_steps"] == [2, 3, 4, 5]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fixed-step:skip=a", "skip value 'a' is invalid"),
        ("fixed-step:skip=5-2", "is empty"),
        ("fixed-step:dense_first", "write KEY=VALUE"),
        ("fixed-step:dense_first=x", "dense_first='x' is invalid"),
        ("fixed-step:bogus=1", "unknown field 'bogus'"),
        ("adaptive:threshold=1", "policy 'adaptive' is unknown"),
    ],
)
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_cache_spec(spec)


def test_section_from_profile_extensions() -> None:
    assert cache_section_from_extensions({}) is None
    assert cache_section_from_extensions({"caches": FIXED}) == parse_cache_section(FIXED)


def test_section_survives_the_profile_wire_format() -> None:
    from flextensor_runtime.profile import (
        DeviceSpec,
        Meta,
        PlanConfig,
        Predicted,
        Profile,
        TensorEntry,
        Trap,
        dumps,
        fingerprint,
        loads,
    )

    section = parse_cache_section(
        parse_cache_spec("adaptive-residual:module=transformer;threshold=0.1")
    )
    entry = TensorEntry(name="w", bytes=16, dtype="float32", shape=(4,), stride=(1,))
    profile = Profile(
        meta=Meta("0.1.0", "2.13", "ftc profile m.py --cache ...", "synthetic"),
        model=fingerprint([entry]),
        device=DeviceSpec("cpu", 1 << 30, 1e10, kind="cpu"),
        config=PlanConfig(),
        traps=(Trap("layer", "module", 1.0, (entry,)),),
        blocks=(),
        schedule=(),
        predicted=Predicted(1.0, 1.0, 0.0, 16, 16, 0),
        extensions={"caches": cache_section_to_data(section)},
    )
    assert cache_section_from_extensions(loads(dumps(profile)).extensions) == section


def test_policies_built_in_code_normalise_skip_steps() -> None:
    section = CacheSection("transformer", FixedStepPolicy(skip_steps={5, 3}))  # type: ignore[arg-type]
    assert section.policy.skip_steps == (3, 5)
    assert msgpack.unpackb(msgpack.packb(cache_section_to_data(section)))["skip_steps"] == [3, 5]
