"""Fuzzing the reader with mutated valid profiles: it either loads or raises a one-line
ProfileError/BudgetError; never another exception, a hang, or a memory blow-up.

`make fuzz` runs many more examples (FLEXTENSOR_FUZZ_EXAMPLES)."""

from __future__ import annotations

import os
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flextensor_runtime.errors import BudgetError, ProfileError
from flextensor_runtime.profile import dumps, loads, to_document
from profiles.golden import format_golden

EXAMPLES = int(os.environ.get("FLEXTENSOR_FUZZ_EXAMPLES", "150"))
GOOD = dumps(format_golden())
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


def _load_or_clean_error(data: bytes) -> None:
    try:
        profile = loads(data)
    except (ProfileError, BudgetError) as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    assert loads(dumps(profile)) == profile  # whatever loads is internally consistent


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(0, 255)), min_size=1,
                max_size=8))  # fmt: skip
def test_byte_flips(flips: list[tuple[int, int]]) -> None:
    data = bytearray(GOOD)
    for pos, value in flips:
        data[pos] = value
    _load_or_clean_error(bytes(data))


@FUZZ
@given(st.integers(0, len(GOOD)), st.binary(max_size=64))
def test_splices(cut: int, junk: bytes) -> None:
    _load_or_clean_error(GOOD[:cut] + junk + GOOD[cut:])


_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True),
    st.text(max_size=8), st.binary(max_size=8),
    st.lists(st.integers(-(2**63), 2**64 - 1), max_size=3),
)  # fmt: skip


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


DOC = to_document(format_golden())
PATHS = [p for p in _paths(DOC) if p]


@FUZZ
@given(st.sampled_from(PATHS), _LEAVES)
def test_structural_mutations(path: tuple, value: Any) -> None:
    doc = to_document(format_golden())
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    _load_or_clean_error(msgpack.packb(doc, use_bin_type=True))
