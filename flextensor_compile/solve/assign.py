"""Block assignment and the prefetch schedule: which memory block each transfer uses, and when.

Owns: the block orders, "strict" (transfer j -> block j mod K), "least-growth" (each transfer
goes to the block that grows least, least recently used first, never a block whose last reader
is the trap just before) and "size-classes" (large transfers rotate over K - 1 blocks, small ones
share one); when an order cannot be scheduled the next one is tried. Block sizes
(each block as large as the largest transfer it carries), and the schedule: a transfer is issued
at the entry of the trap after the block's previous reader (as early as the block allows,
cyclically, so the first traps' weights are fetched during the tail of the previous iteration);
its block is released after its own trap (the last reader) finishes. `assigned_bytes` gives the
total block bytes alone (what a memory check needs) without building the schedule.
Both assignments are O(transfers x blocks): no cliff in the number of traps.
Must not know: time, tensors, how the streamed set was chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import sub

__all__ = [
    "ASSIGNMENTS",
    "ORDERS",
    "Assignment",
    "assign_blocks",
    "assigned_bytes",
    "orders_for",
]

# what a config may name; "ring" places every streamed tensor in one block (`solve/ring.py`)
ASSIGNMENTS = ("strict-round-robin", "optimized-round-robin", "ring")
ORDERS = ("strict", "least-growth", "size-classes")


def orders_for(assignment: str, num_blocks: int) -> tuple[str, ...]:
    """Strict round robin uses the strict order; optimized round robin tries least-growth and
    strict with two blocks, size-classes with three or more (falling back to least-growth, then
    strict), and the planner keeps the best plan."""
    if assignment == "strict-round-robin" or num_blocks < 2:
        return ("strict",)
    return ("least-growth", "strict") if num_blocks == 2 else ("size-classes",)


@dataclass(frozen=True)
class Assignment:
    """Per transfer (in trap order): block, issue_at, release_after; and the block sizes."""

    blocks: tuple[int, ...]
    issue_at: tuple[int, ...]
    release_after: tuple[int, ...]
    block_bytes: tuple[int, ...]


def assign_blocks(
    traps: tuple[int, ...],
    sizes: tuple[int, ...],
    n_traps: int,
    num_blocks: int,
    mode: str,
    min_blocks: int = 1,
) -> Assignment | None:
    """Assign transfers (trap orders ascending, packed sizes) to at most `num_blocks` blocks,
    and to at least `min_blocks` when there are that many transfers (an order that leaves
    blocks unused is then passed over for the next).

    Returns None when no schedule exists with that many blocks (a block would be reused by two
    adjacent traps, leaving no trap at whose entry the copy could be issued).
    """
    if not traps:
        return Assignment((), (), (), ())
    counts = _block_counts(len(traps), n_traps, num_blocks, min_blocks)
    if counts is None:
        return None
    k, least = counts
    for order in _tries(mode):
        blocks = order(traps, sizes, n_traps, k, least)
        done = None if blocks is None else _schedule(traps, sizes, n_traps, blocks)
        if done is not None and len(done.block_bytes) >= least:
            return done
    return None


def assigned_bytes(
    traps: tuple[int, ...],
    sizes: tuple[int, ...],
    n_traps: int,
    num_blocks: int,
    mode: str,
    min_blocks: int = 1,
) -> int | None:
    """The total block bytes of `assign_blocks` with the same arguments (None where it returns
    None), without building the schedule: what a memory check needs."""
    if not traps:
        return 0
    counts = _block_counts(len(traps), n_traps, num_blocks, min_blocks)
    if counts is None:
        return None
    k, least = counts
    for order in _tries(mode):
        total: int | None
        if order is _strict:  # uses all k blocks
            total = _strict_bytes(traps, sizes, n_traps, k)
        elif order is _least_growth:  # its blocks always schedule (it checks both gaps)
            grown = _grow(traps, sizes, n_traps, k, least)
            used = grown is not None and sum(1 for b in grown[1] if b) >= least
            total = sum(grown[1]) if grown is not None and used else None
        else:
            blocks = order(traps, sizes, n_traps, k, least)
            done = None if blocks is None else _schedule(traps, sizes, n_traps, blocks)
            used = done is not None and len(done.block_bytes) >= least
            total = sum(done.block_bytes) if done is not None and used else None
        if total is not None:
            return total
    return None


def _block_counts(m: int, n_traps: int, num_blocks: int, min_blocks: int
                  ) -> tuple[int, int] | None:  # fmt: skip
    """For `m` > 0 transfers: the most blocks to use and the fewest an order must use (None
    when no assignment can: fewer than two traps, no blocks, or more required than allowed)."""
    if n_traps < 2 or num_blocks < 1:
        return None
    k, least = min(num_blocks, m), min(min_blocks, m)
    return None if least > k else (k, least)


_Order = Callable[[tuple[int, ...], tuple[int, ...], int, int, int], "tuple[int, ...] | None"]


def _tries(mode: str) -> tuple[_Order, ...]:
    """The block orders to try for `mode`, in turn (the first that schedules is kept)."""
    if mode == "size-classes":
        return (_size_classes, _least_growth, _strict)
    if mode == "least-growth":
        return (_least_growth, _strict)
    return (_strict, _least_growth)


def _strict_bytes(traps: tuple[int, ...], sizes: tuple[int, ...], n_traps: int, k: int
                  ) -> int | None:  # fmt: skip
    """`_schedule` of the strict order, reduced to its block bytes: transfer j reuses the block
    of transfer j - k (two traps apart at least), and each block's first follows its last."""
    m = len(traps)
    if m > k and min(map(sub, traps[k:], traps[:-k])) < 2:
        return None
    for b in range(k):
        last = b + (m - 1 - b) // k * k
        if ((traps[b] - traps[last]) % n_traps or n_traps) < 2:
            return None
    return sum(max(sizes[b::k]) for b in range(k))


def _strict(
    traps: tuple[int, ...], sizes: tuple[int, ...], n_traps: int, k: int, least: int = 1
) -> tuple[int, ...] | None:
    return tuple(j % k for j in range(len(traps)))


def _least_growth(
    traps: tuple[int, ...], sizes: tuple[int, ...], n_traps: int, k: int, least: int = 1
) -> tuple[int, ...] | None:
    grown = _grow(traps, sizes, n_traps, k, least)
    return None if grown is None else _compact(grown[0])


def _grow(
    traps: tuple[int, ...], sizes: tuple[int, ...], n_traps: int, k: int, least: int = 1
) -> tuple[list[int], list[int]] | None:
    """Per transfer its block (each to the block that grows least), and the block sizes; when
    that leaves fewer than `least` blocks in use, the first `least` transfers each open one."""
    grown = _grow_two(traps, sizes, n_traps) if k == 2 else _grow_any(traps, sizes, n_traps, k)
    if least < 2 or grown is None or sum(1 for b in grown[1] if b) >= least:
        return grown
    return _grow_any(traps, sizes, n_traps, k, least)


def _grow_any(
    traps: tuple[int, ...], sizes: tuple[int, ...], n_traps: int, k: int, least: int = 1
) -> tuple[list[int], list[int]] | None:
    opened = 0  # blocks in use: 0 .. opened - 1 (an unused block is chosen lowest first)
    size = [0] * k
    first_user = [-1] * k
    last_user = [-1] * k
    used_at = [-1] * k  # transfer index that last used the block (for LRU tie-breaks)
    out = []
    blocks = range(k)
    for j, (t, s) in enumerate(zip(traps, sizes, strict=True)):
        best, best_grow, best_used = -1, 0, 0  # least (growth, last use), the first on ties
        for b in blocks if opened >= least else (opened,):
            last = last_user[b]
            if last >= 0 and (t - last < 2 or (first_user[b] - t) % n_traps < 2):
                continue
            grow = s - size[b] if s > size[b] else 0
            if best < 0 or grow < best_grow or (grow == best_grow and used_at[b] < best_used):
                best, best_grow, best_used = b, grow, used_at[b]
        if best < 0:
            return None
        if s > size[best]:
            size[best] = s
        if first_user[best] < 0:
            first_user[best] = t
            opened += 1
        last_user[best] = t
        used_at[best] = j
        out.append(best)
    return out, size


def _grow_two(
    traps: tuple[int, ...], sizes: tuple[int, ...], n_traps: int
) -> tuple[list[int], list[int]] | None:
    """`_grow_any` with two blocks (the common case), their state in locals."""
    size0 = size1 = 0
    first0 = first1 = last0 = last1 = used0 = used1 = -1
    out = []
    for j, (t, s) in enumerate(zip(traps, sizes, strict=True)):
        ok0 = last0 < 0 or (t - last0 >= 2 and (first0 - t) % n_traps >= 2)
        ok1 = last1 < 0 or (t - last1 >= 2 and (first1 - t) % n_traps >= 2)
        if ok0 and ok1:  # least growth, then least recently used, then block 0
            grow0 = s - size0 if s > size0 else 0
            grow1 = s - size1 if s > size1 else 0
            ok0 = not (grow1 < grow0 or (grow1 == grow0 and used1 < used0))
        elif not ok0 and not ok1:
            return None
        if ok0:
            size0 = s if s > size0 else size0
            first0 = t if first0 < 0 else first0
            last0, used0 = t, j
        else:
            size1 = s if s > size1 else size1
            first1 = t if first1 < 0 else first1
            last1, used1 = t, j
        out.append(0 if ok0 else 1)
    return out, [size0, size1]


def _size_classes(
    traps: tuple[int, ...], sizes: tuple[int, ...], n_traps: int, k: int, least: int = 1
) -> tuple[int, ...] | None:
    """Transfers over half the largest rotate over k - 1 blocks, the rest over one block, so a
    large copy can be issued two large transfers ahead while small ones do not grow the blocks."""
    top = max(sizes)
    big = [s * 2 > top for s in sizes]
    if k < 3 or all(big) or not any(big):
        return None
    out, nbig = [], 0
    for is_big in big:
        if is_big:
            out.append(nbig % (k - 1))
            nbig += 1
        else:
            out.append(k - 1)
    return _compact(out)


def _compact(blocks: list[int]) -> tuple[int, ...]:
    """Renumber blocks in order of first use (unused blocks disappear)."""
    ids: dict[int, int] = {}
    for b in blocks:
        if b not in ids:
            ids[b] = len(ids)
    return tuple([ids[b] for b in blocks])


def _schedule(
    traps: tuple[int, ...], sizes: tuple[int, ...], n_traps: int, blocks: tuple[int, ...]
) -> Assignment | None:
    count = max(blocks) + 1
    last_user = [-1] * count  # per block: transfer index of its latest user so far
    first_user = [-1] * count
    block_bytes = [0] * count
    issue = [0] * len(traps)
    for j, b in enumerate(blocks):
        prev = last_user[b]
        if prev >= 0:
            if traps[j] - traps[prev] < 2:
                return None
            issue[j] = traps[prev] + 1
        else:
            first_user[b] = j
        last_user[b] = j
        if sizes[j] > block_bytes[b]:
            block_bytes[b] = sizes[j]
    for b in range(count):  # cyclic: a block's first user follows its last user
        first, last = first_user[b], last_user[b]
        gap = (traps[first] - traps[last]) % n_traps or n_traps
        if gap < 2:
            return None
        issue[first] = (traps[last] + 1) % n_traps
    return Assignment(blocks, tuple(issue), tuple(traps), tuple(block_bytes))
