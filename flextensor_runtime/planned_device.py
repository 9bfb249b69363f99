"""Whether a profile is deployed on the kind of device it was planned for.

Owns: the note, given as a `PlannedDeviceWarning`, that a profile measured on one GPU is
deployed on another device (its compute times, copy rate and so its schedule were made for the
GPU it names; the memory check at deployment holds either way).
Must not know: how a profile is installed, the compiler.
"""

from __future__ import annotations

import warnings

from flextensor_runtime.backend import DeviceBackend
from flextensor_runtime.profile import DeviceSpec

__all__ = ["PlannedDeviceWarning", "planned_device_note", "warn_if_other_device"]


class PlannedDeviceWarning(UserWarning):
    """A profile measured on one GPU is deployed on another device: its predictions (and the
    plan's balance of resident and streamed weights) were made for the GPU it names."""


def planned_device_note(spec: DeviceSpec, actual_name: str) -> str | None:
    """The warning's text when `spec` (the profile's device) was a measured GPU whose name is not
    `actual_name`; None when they match, or when the plan was made for a named target, an
    emulated or a CPU device (nothing measured to compare)."""
    if spec.kind != "cuda" or spec.name.strip().lower() == actual_name.strip().lower():
        return None
    return (
        f"this profile was measured on {spec.name!r} and is deployed on {actual_name!r}: its "
        "predicted times and its split of resident and streamed weights were made for the "
        "other device (the memory check still holds); run ftc profile on this device for a "
        "plan made for it"
    )


def warn_if_other_device(spec: DeviceSpec, backend: DeviceBackend) -> None:
    """Warn (`PlannedDeviceWarning`) when `planned_device_note` has a note for `backend`."""
    note = planned_device_note(spec, backend.device_name())
    if note is not None:
        warnings.warn(note, PlannedDeviceWarning, stacklevel=3)
