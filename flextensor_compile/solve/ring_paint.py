"""The ring's paint: which placement last wrote each byte of the ring's block, and where a range
of bytes frees up first.

Owns: the segments (sorted, disjoint, maximal: neighbours were written at different times) and
their updates; `earliest`, the range whose latest writer is oldest (never one the trap being
placed wrote, and clear of the bytes to avoid unless nothing else fits); `free_beside`, the bytes
beside a stretch that are free by a given time.
Must not know: traps, tensors, transfers, the problem (times here are the placer's counters).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

__all__ = ["RingPaint"]

_OWN = 1 << 62  # "held by the trap being placed": never overwritten by its own tensors
_AVOID = _OWN - 1  # bytes the next trap (next iteration) reads: only if nothing else fits
_SCAN_SEGMENTS = 16  # `earliest` over this few segments: range by range (as fast, measured)


class RingPaint:
    """Which placement last wrote each byte of the ring: sorted, disjoint segments covering it
    (each ends where the next starts, the last at `ring`), maximal (neighbours were written at
    different times), so bytes painted at once or piece by piece give the same segments."""

    def __init__(self, ring_bytes: int) -> None:
        self.ring = ring_bytes
        self.starts = [0]
        self.when = [-1]  # global placement time of the writer's trap (-1: never written)

    def earliest(
        self, size: int, own: int, avoid: tuple[tuple[int, int], ...] = ()
    ) -> tuple[int, int]:
        """(offset, availability) of the `size`-byte range whose latest writer is oldest, never
        one `own` (the latest time painted: the trap being placed) wrote; a range overlapping
        `avoid` only when no other fits. The lowest offset of the oldest writer wins ties."""
        starts, when = self.starts, self.when
        last = bisect_right(starts, self.ring - size)  # ranges starting in these fit
        if last <= _SCAN_SEGMENTS:
            return self._scan(size, own, avoid)
        low = min(when[:last]) if last < len(when) else min(when)
        i = when.index(low)
        # no range is older than the oldest segment it may start in: the first range that
        # starts there and holds nothing newer is the answer
        while low != own and i < last:
            a = starts[i]
            end = a + size
            j = bisect_left(starts, end, i + 1)
            if (j == i + 1 or max(when[i:j]) == low) and not (
                avoid and any(a < y and x < end for x, y in avoid)
            ):
                return a, low
            if low not in when[i + 1 : last]:
                break
            i = when.index(low, i + 1)
        return self._scan(size, own, avoid)

    def _scan(self, size: int, own: int, avoid: tuple[tuple[int, int], ...]) -> tuple[int, int]:
        """`earliest`, range by range."""
        best_at, best_time = -1, _OWN
        starts, when, ring = self.starts, self.when, self.ring
        for i, a in enumerate(starts):
            end = a + size
            if end > ring:
                break
            latest = when[i]
            if latest >= best_time:  # its latest writer is no older: not better
                continue
            j = bisect_left(starts, end, i + 1)
            if j > i + 1:
                latest = max(when[i:j])
            if latest == own:  # `own` is the latest time painted: it counts as `_OWN`
                continue
            if latest < best_time and any(a < y and x < end for x, y in avoid):
                latest = _AVOID
            if latest < best_time:
                best_at, best_time = a, latest
        return best_at, best_time

    def write(self, a: int, b: int, when: int) -> None:
        """Paint [a, b) as written at `when`; neighbours painted at the same time merge (a
        window starting inside such a run is never better than one starting at its start)."""
        starts, whens = self.starts, self.when
        i = bisect_right(starts, a) - 1
        j = bisect_left(starts, b, i)  # the first segment starting at or after b
        count = len(starts)
        if j == i + 1 and self._within(i, a, b, when):
            return
        new_s, new_w = [a], [when]
        if starts[i] < a:
            new_s, new_w = [starts[i], a], [whens[i], when]
        if (starts[j] if j < count else self.ring) > b:  # the last segment goes on after b
            new_s.append(b)
            new_w.append(whens[j - 1])
        if i > 0 and new_w[0] == whens[i - 1]:  # merge with the run before
            i -= 1
            new_s[0] = starts[i]
        if j < count and new_w[-1] == whens[j]:  # and with the run after
            j += 1
        starts[i:j], whens[i:j] = new_s, new_w

    def _within(self, i: int, a: int, b: int, when: int) -> bool:
        """`write` of [a, b) inside segment i, in the two common cases, with no list made:
        from its start (after a run of `when`, which grows), or up to its end; False (nothing
        done) otherwise."""
        starts, whens = self.starts, self.when
        j = i + 1
        end = starts[j] if j < len(starts) else self.ring
        kept = whens[i]
        if i > 0 and whens[i - 1] == (when if starts[i] == a else kept):
            if starts[i] == a and end > b and (j == len(starts) or whens[j] != kept):
                starts[i] = b  # the run of `when` before grows over [a, b)
                return True
            return False
        if starts[i] == a:
            if end > b and (j == len(starts) or whens[j] != kept):
                whens[i] = when
                starts.insert(j, b)
                whens.insert(j, kept)
                return True
            return False
        if end == b:
            if j < len(starts) and whens[j] == when:
                starts[j] = a  # the run of `when` after grows over [a, b)
            else:
                starts.insert(j, a)
                whens.insert(j, when)
            return True
        return False

    def free_beside(
        self, a: int, b: int, needed: int, now: int, avoid: tuple[tuple[int, int], ...]
    ) -> tuple[int, int]:
        """(low, high): the bytes [low, a) and [b, high) beside [a, b) that are free by
        `needed` (their latest writer is no later and not `now`, the trap being placed), inside
        the ring and clear of `avoid`."""
        starts, when = self.starts, self.when
        low, high = 0, self.ring
        for x, y in avoid:
            if y > b and x < high:
                high = x if x > b else b
            if x < a and y > low:
                low = y if y < a else a
        i = bisect_right(starts, b) - 1
        while i < len(starts) and starts[i] < high:
            w = when[i]
            if w > needed or w == now:
                high = starts[i] if starts[i] > b else b
                break
            i += 1
        i = bisect_left(starts, a) - 1  # the segment holding byte a - 1
        while i >= 0:
            top = starts[i + 1] if i + 1 < len(starts) else self.ring
            if top <= low:
                break
            w = when[i]
            if w > needed or w == now:
                low = top if top < a else a
                break
            i -= 1
        return low, high
