"""Regenerate the golden profiles in this folder (`make golden`): only on purpose, when the wire
format or the solver changes intentionally. Tests pin these bytes."""

from __future__ import annotations

from pathlib import Path

from flextensor_runtime.profile import save
from profiles.golden import format_golden

HERE = Path(__file__).parent


def main() -> None:
    path = save(format_golden(), HERE / "format_golden.msgpack")
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
