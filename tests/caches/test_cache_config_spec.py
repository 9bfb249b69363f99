"""The one-line cache spec gives each key once, as the --vram spec does."""

from __future__ import annotations

import pytest

from flextensor_runtime.cache_section import parse_cache_spec
from flextensor_runtime.errors import ConfigError


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("fixed-step:skip=3;skip=4", r"key 'skip_steps' is given twice \('skip=3' and 'skip=4'\)"),
        ("fixed-step:skip=3;skip_steps=4", "key 'skip_steps' is given twice"),
        ("fixed-step:dense-last=1;dense_last=2", "key 'dense_last' is given twice"),
        ("adaptive-residual:threshold=0.1;threshold=0.2", "key 'threshold' is given twice"),
        ("fixed-step:module=a;module=b", "key 'module' is given twice"),
    ],
)
def test_a_repeated_key_is_refused_naming_it(spec: str, message: str) -> None:
    """The last value used to win silently."""
    with pytest.raises(ConfigError, match=message + ".*give each key once"):
        parse_cache_spec(spec)


def test_the_policy_is_only_given_before_the_colon() -> None:
    """`policy=` used to replace the policy named before ':'."""
    with pytest.raises(ConfigError, match=r"the policy goes before ':'.*'fixed-step'"):
        parse_cache_spec("fixed-step:policy=adaptive-residual;threshold=0.1")


def test_distinct_keys_still_parse() -> None:
    data = parse_cache_spec("fixed-step:skip=3;dense-last=2;module=m")
    assert data == {"policy": "fixed-step", "skip_steps": [3], "dense_last": 2, "module": "m"}
