"""The offload profile: the compiled artifact `ftc` writes and `offload_from_profile` reads.

This package is the only code that knows the wire format (msgpack keys, version, fingerprint).
It imports only the standard library, msgpack and the errors and counts modules: never
torch.
"""

from flextensor_runtime.profile.check import check_profile, occupied_slots
from flextensor_runtime.profile.schema import (
    DTYPE_ITEMSIZE,
    FORMAT,
    PLACEMENTS,
    TENSOR_KINDS,
    TIMING_SOURCES,
    TRAP_KINDS,
    VERSION,
    BandwidthPoint,
    Block,
    DeviceSpec,
    Meta,
    ModelFingerprint,
    PlanConfig,
    Predicted,
    Profile,
    TensorEntry,
    Transfer,
    Trap,
    fingerprint,
    issue_time,
)
from flextensor_runtime.profile.wire import MAX_FILE_BYTES, dumps, load, loads, save, to_document

__all__ = [
    "DTYPE_ITEMSIZE",
    "FORMAT",
    "MAX_FILE_BYTES",
    "PLACEMENTS",
    "TENSOR_KINDS",
    "TIMING_SOURCES",
    "TRAP_KINDS",
    "VERSION",
    "BandwidthPoint",
    "Block",
    "DeviceSpec",
    "Meta",
    "ModelFingerprint",
    "PlanConfig",
    "Predicted",
    "Profile",
    "TensorEntry",
    "Transfer",
    "Trap",
    "check_profile",
    "dumps",
    "fingerprint",
    "issue_time",
    "load",
    "loads",
    "occupied_slots",
    "save",
    "to_document",
]
