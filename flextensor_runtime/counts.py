"""How a count reads in a message: `1 tensor`, `2 tensors`, `0 copies`.

Owns: the plural rule every user-facing count follows, in the runtime and the compiler alike.
Must not know: anything beyond the standard library (the torch-free profile package uses it).
"""

from __future__ import annotations

__all__ = ["count_of"]


def count_of(n: int, noun: str) -> str:
    """`1 block`, `2 blocks`, `0 copies`: a count and its noun (plural by -s, -y -> -ies)."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun[:-1]}ies" if noun.endswith("y") else f"{n} {noun}s"
