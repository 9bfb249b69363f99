"""How memory records match a query: the words of a text and equality of metadata values.

Owns: splitting a text into the words a `MemoryQuery(text=...)` compares, and comparing a
record's metadata with a filter's, including array values (tensors, numpy arrays) without
importing either library.
Must not know: stores, ranking, capacity (see `memory_records`). It imports no torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["matches_metadata", "same_value", "words"]

_WORD = re.compile(r"\w+")


def words(text: str) -> set[str]:
    """Lower-case words: runs of letters, digits and underscores (punctuation separates them,
    so "opened." and "door," are the words "opened" and "door")."""
    return set(_WORD.findall(text.lower()))


def same_value(stored: Any, wanted: Any) -> bool:
    """Whether a metadata value equals the one a filter asks for. Two arrays (a tensor pose, a
    numpy latent) are equal when their shapes are and every element is: `==` on them gives an
    array, whose truth value is an error ("ambiguous"), and would broadcast other shapes. An
    array against a plain value compares only when it holds one element."""
    if stored is wanted:
        return True
    shape, wanted_shape = getattr(stored, "shape", None), getattr(wanted, "shape", None)
    try:
        if shape is not None and wanted_shape is not None:
            return bool(shape == wanted_shape and (stored == wanted).all())
        return bool(stored == wanted)
    except Exception:  # values that do not compare (devices, types, several elements): unequal
        return False


def matches_metadata(record: Mapping[str, Any], wanted: Mapping[str, Any] | None) -> bool:
    """Whether `record`'s metadata holds every item of `wanted` (see `same_value`)."""
    meta = record.get("metadata") or {}
    return all(k in meta and same_value(meta[k], v) for k, v in (wanted or {}).items())
