"""The one error hierarchy of flextensor.

Owns: every exception type the runtime and the compiler raise on purpose. Each message says
what failed, the offending value, and what to do about it.
Must not know: torch, msgpack, the CLI. It is imported by the torch-free format module.
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "BudgetError",
    "CacheUsageError",
    "ConfigError",
    "DiskMapError",
    "FlextensorError",
    "InferenceOnlyError",
    "InstallError",
    "ModelFileError",
    "ProfileError",
    "ProfileFormatError",
    "ProfileMismatchError",
    "ProfileVersionError",
    "StatsFormatError",
    "TokenPruneError",
    "VramManagementError",
]


class FlextensorError(Exception):
    """Base of every error flextensor raises on purpose; the message is one line with the fix."""


class ConfigError(FlextensorError, ValueError):
    """An option or configuration value is invalid (wrong type, out of range, misspelt)."""


class ProfileError(FlextensorError):
    """Base for problems with an offload profile file."""


class ProfileFormatError(ProfileError):
    """The file is not a well-formed offload profile (bytes, shape, or cross-references)."""


class ProfileVersionError(ProfileError):
    """The profile was written by an older or newer format version than this reader supports."""


class ProfileMismatchError(ProfileError):
    """The profile was compiled for a different model (names, shapes or dtypes differ)."""


class BudgetError(FlextensorError):
    """A plan does not fit its memory budget, or the device has less free memory than needed.
    `least_bytes`: the smallest budget a plan fits, when the solver found it."""

    def __init__(self, message: str, least_bytes: int | None = None) -> None:
        super().__init__(message)
        self.least_bytes = least_bytes


class StatsFormatError(FlextensorError):
    """A recorded-measurements (stats) file is malformed."""


class ModelFileError(FlextensorError):
    """A model file or `module:function` reference could not be loaded or run."""


class InstallError(FlextensorError):
    """Installing offloading on a model failed; the model is left unchanged."""


class InferenceOnlyError(FlextensorError, RuntimeError):
    """An offloaded model was used for training or under autograd that needs weight gradients."""


class BackendUnavailableError(FlextensorError, RuntimeError):
    """A requested backend (CUDA, Triton, FP8 matmul) is not available on this machine."""


class DiskMapError(FlextensorError, KeyError):
    """A checkpoint file or tensor name could not be resolved by a DiskMap."""

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0]) if self.args else ""


class VramManagementError(FlextensorError, RuntimeError):
    """VRAM management was configured or used incorrectly."""


class CacheUsageError(FlextensorError, RuntimeError):
    """A cross-step cache was used incorrectly (e.g. an invalid step or configuration)."""


class TokenPruneError(FlextensorError, RuntimeError):
    """Token pruning state was misused (e.g. a prune not paired with a restore)."""
