"""The profile reader's and writer's shortcuts for tensor entries agree with the checked,
field-by-field code they stand in for (hypothesis)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flextensor_runtime.errors import ProfileFormatError
from flextensor_runtime.profile.fields import MAX_BYTES, MAX_COUNT, Reader
from flextensor_runtime.profile.schema import TensorEntry, _normalize
from flextensor_runtime.profile.wire import _canonical, _tensor, _tensor_doc, _tensors

_KEYS = ("name", "bytes", "dtype", "shape", "stride", "placement", "block", "offset", "tie", "kind")
_ODD = st.sampled_from([None, True, -1, 1.5, "x", "", [], [1], {}, MAX_BYTES + 1, MAX_COUNT + 1,
                        "y" * 4097, ["a"], [True], [-1], 2**70])  # fmt: skip
_GOOD: dict[str, Any] = {
    "name": st.text(max_size=8),
    "bytes": st.integers(0, 1 << 40),
    "dtype": st.sampled_from(["bfloat16", "float32", "int8"]),
    "shape": st.lists(st.integers(0, 1 << 20), max_size=3),
    "stride": st.lists(st.integers(0, 1 << 20), max_size=3),
    "placement": st.sampled_from(["resident", "streamed", "disk"]),
    "block": st.none() | st.integers(0, 8),
    "offset": st.none() | st.integers(0, 1 << 30),
    "tie": st.none() | st.text(max_size=8),
    "kind": st.sampled_from(["parameter", "buffer", "inner"]),
}


@st.composite
def _tensor_docs(draw: st.DrawFn) -> Any:
    """A tensor entry as decoded msgpack: mostly well formed, some fields odd, missing or extra."""
    doc = {k: draw(_ODD if draw(st.integers(0, 12)) == 0 else _GOOD[k]) for k in _KEYS}
    if draw(st.integers(0, 15)) == 0:
        del doc[draw(st.sampled_from(_KEYS))]
    if draw(st.integers(0, 15)) == 0:
        doc["extra"] = 1
    return doc if draw(st.integers(0, 30)) else draw(_ODD)


_GOOD_DOC = {"name": "w", "bytes": 4, "dtype": "float32", "shape": [1], "stride": [1],
             "placement": "streamed", "block": 0, "offset": 0, "tie": None,
             "kind": "parameter"}  # fmt: skip


def _outcome(read: Any, docs: list[Any]) -> Any:
    try:
        return read(Reader(docs, "traps[0].tensors"))
    except ProfileFormatError as exc:
        return ("error", str(exc))


@settings(max_examples=600, deadline=None)
@given(st.lists(_tensor_docs(), max_size=4))
def test_tensor_list_reads_as_the_checked_reader_does(docs: list[Any]) -> None:
    checked = _outcome(lambda r: tuple(_tensor(x) for x in r.as_list()), docs)
    assert _outcome(_tensors, docs) == checked


@settings(max_examples=300, deadline=None)
@given(st.fixed_dictionaries(_GOOD))
def test_tensor_entries_are_normalized_and_written_canonically(fields: dict[str, Any]) -> None:
    entry = TensorEntry(**fields)  # shape and stride given as lists
    assert isinstance(entry.shape, tuple) and isinstance(entry.stride, tuple)
    again = TensorEntry(**fields)
    _normalize(again)  # the general normalization changes nothing more
    assert again == entry and type(again.shape) is tuple
    assert _tensor_doc(entry) == _canonical(_tensor_doc(entry))
    assert list(_tensor_doc(entry)) == sorted(_tensor_doc(entry))


def test_a_tensor_list_with_one_bad_entry_names_it() -> None:
    with pytest.raises(ProfileFormatError, match=r"traps\[0\]\.tensors\[1\]\.bytes"):
        _tensors(Reader([_GOOD_DOC, {**_GOOD_DOC, "bytes": -4}], "traps[0].tensors"))


@pytest.mark.parametrize(
    ("field", "value"),
    [(f, "s" * n) for f in ("name", "dtype", "tie") for n in (4096, 4097)]
    + [(f, v) for f in ("bytes", "offset") for v in (MAX_BYTES, MAX_BYTES + 1, -1)]
    + [("block", v) for v in (MAX_COUNT, MAX_COUNT + 1, -1)]
    + [(f, v) for f in ("shape", "stride") for v in ([MAX_BYTES], [MAX_BYTES + 1], [-1], (1,))],
)
def test_limits_read_as_the_checked_reader_does(field: str, value: Any) -> None:
    docs = [{**_GOOD_DOC, field: value}]
    checked = _outcome(lambda r: tuple(_tensor(x) for x in r.as_list()), docs)
    assert _outcome(_tensors, docs) == checked
