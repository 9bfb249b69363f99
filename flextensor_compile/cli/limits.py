"""Upper limits on `ftc`'s numeric options, checked before any work.

Owns: refusing counts and fractions so large that they can only be typing mistakes (a run that
would never end, or a number the profile cannot store), each as one `ConfigError` line naming
the option, the value and the limit. Lower limits and meaning stay with the configuration.
Must not know: what the options do.
"""

from __future__ import annotations

from flextensor_runtime.errors import ConfigError

__all__ = ["MAX_BLOCKS", "MAX_FRACTION", "MAX_ITERS", "MAX_SEED", "check_at_most", "check_fractions",
           "check_seed"]  # fmt: skip

MAX_BLOCKS = 100_000  # more memory blocks than any model has tensors
MAX_ITERS = 10_000  # timed or warm-up forwards: the median settles within a few
MAX_SEED = 2**63 - 1  # the profile stores the seed as a 64-bit integer
MAX_FRACTION = 1000.0  # x the weight bytes; 1.0 already keeps every weight resident


def check_at_most(
    values: dict[str, int | None], limit: int, why: str, signed: bool = False
) -> None:
    """Each `--option value` (None: not given) is at most `limit` (in size, when `signed`)."""
    for option, value in values.items():
        if value is None:
            continue
        if value > limit:
            raise ConfigError(f"{option} {value} is too large; give at most {limit} ({why})")
        if signed and value < -limit - 1:
            raise ConfigError(f"{option} {value} is too small; give at least {-limit - 1} ({why})")


def check_seed(seed: int) -> None:
    """A seed the profile can record: 0 to `MAX_SEED`."""
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"--seed {seed} is out of range; give at least 0 and at most {MAX_SEED} (the "
                          "profile stores it as an unsigned 64-bit integer)")  # fmt: skip


def check_fractions(spec: str, fractions: tuple[float, ...]) -> None:
    """Sweep fractions of the weight bytes are at most `MAX_FRACTION`."""
    big = max(fractions, default=0.0)
    if big > MAX_FRACTION:
        raise ConfigError(
            f"--fractions {spec}: {big:g} x the weight bytes is too large; give fractions at "
            f"most {MAX_FRACTION:g} (1.0 already keeps every weight resident)"
        )
