"""The host-to-device copy model: how long a copy of N bytes takes, and how many bytes fit in T ms.

Owns: a monotone piecewise-linear time curve built from measured (bytes, bytes_per_s) points, each
the rate of a whole copy (its per-copy latency included); a linear fallback (latency plus one
rate) when no curve was measured.
Must not know: traps, plans, devices beyond their bandwidth figures.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property

from flextensor_runtime.errors import ConfigError

__all__ = ["BandwidthModel"]

_MAX_MS = 1e15  # longer windows are treated as this long (keeps byte counts finite)


@dataclass(frozen=True)
class BandwidthModel:
    """Copy time = `latency_ms` + a monotone curve of bytes -> ms.

    `points` are (bytes, ms) knots, strictly increasing in bytes and non-decreasing in ms; below
    the first knot time grows linearly from 0, beyond the last knot at `tail_bytes_per_ms`.
    """

    points: tuple[tuple[int, float], ...]
    tail_bytes_per_ms: float
    latency_ms: float = 0.0

    @staticmethod
    def linear(bytes_per_s: float, latency_ms: float = 0.0) -> BandwidthModel:
        if not bytes_per_s > 0:
            raise ConfigError(
                f"host-to-device bandwidth must be positive, got {bytes_per_s} bytes/s; "
                "record the device's bandwidth in the stats file"
            )
        return BandwidthModel(points=(), tail_bytes_per_ms=bytes_per_s / 1000.0,
                              latency_ms=latency_ms)  # fmt: skip

    @staticmethod
    def from_curve(
        curve: tuple[tuple[int, float], ...], bytes_per_s: float, latency_ms: float = 0.0
    ) -> BandwidthModel:
        """Build from measured (bytes, bytes_per_s) points; falls back to `linear` when empty.

        A point's rate is the whole copy's (bytes over its measured time, the per-copy latency
        included), so the knots hold the measured time less the latency: a copy of a measured
        size is predicted to take the time it was measured at, not that plus the latency again.
        Knots are clamped to be non-negative and non-decreasing (a measured time under the
        latency, or under a smaller copy's, is raised to the smallest monotone curve above it).
        """
        pts = sorted((int(b), float(r)) for b, r in curve if b > 0 and r > 0)
        if not pts:
            return BandwidthModel.linear(bytes_per_s, latency_ms)
        lat = max(0.0, latency_ms)
        knots: list[tuple[int, float]] = []
        for b, rate in pts:
            if knots and b == knots[-1][0]:
                continue
            ms = max(0.0, b / rate * 1000.0 - lat)
            if knots:
                ms = max(ms, knots[-1][1])
            knots.append((b, ms))
        return BandwidthModel(points=tuple(knots), tail_bytes_per_ms=pts[-1][1] / 1000.0,
                              latency_ms=latency_ms)  # fmt: skip

    def copy_ms(self, nbytes: int) -> float:
        """Time of one copy of `nbytes` (0 for an empty copy)."""
        if nbytes <= 0:
            return 0.0
        return self.latency_ms + self._curve_ms(nbytes)

    def _curve_ms(self, nbytes: float) -> float:
        pts = self.points
        if not pts:
            return nbytes / self.tail_bytes_per_ms
        if nbytes >= pts[-1][0]:
            return pts[-1][1] + (nbytes - pts[-1][0]) / self.tail_bytes_per_ms
        k = bisect_right(self._knot_bytes, nbytes)
        b0, t0 = (0, 0.0) if k == 0 else pts[k - 1]
        b1, t1 = pts[k]
        return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)

    @cached_property
    def _knot_bytes(self) -> tuple[int, ...]:
        return tuple(b for b, _ in self.points)

    def bytes_within(self, ms: float) -> int:
        """The most bytes one copy moves in `ms` (latency included); 0 if `ms` <= latency."""
        budget = ms - self.latency_ms
        if not budget > 0:  # also NaN
            return 0
        budget = min(budget, _MAX_MS)
        pts = self.points
        if not pts:
            return int(budget * self.tail_bytes_per_ms)
        if budget >= pts[-1][1]:
            return int(pts[-1][0] + (budget - pts[-1][1]) * self.tail_bytes_per_ms)
        prev_b, prev_t = 0, 0.0
        for b, t in pts:
            if budget < t:
                if t == prev_t:
                    return prev_b
                return int(prev_b + (b - prev_b) * (budget - prev_t) / (t - prev_t))
            prev_b, prev_t = b, t
        return prev_b  # unreachable: budget < last knot's time
