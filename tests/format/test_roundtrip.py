"""Round trips, canonical bytes, the pinned golden, atomic saves."""

from __future__ import annotations

import dataclasses
import os
import random
import stat
from pathlib import Path

import pytest

from flextensor_runtime.errors import ConfigError, ProfileFormatError
from flextensor_runtime.profile import dumps, load, loads, save
from profiles.golden import format_golden

GOLDEN = Path(__file__).parents[2] / "profiles" / "format_golden.msgpack"


def test_round_trip_gives_equal_object_and_identical_bytes() -> None:
    profile = format_golden()
    data = dumps(profile)
    again = loads(data)
    assert again == profile
    assert dumps(again) == data


def test_golden_bytes_are_pinned() -> None:
    # Regenerated only on purpose by `make golden` when the format changes.
    assert dumps(format_golden()) == GOLDEN.read_bytes()
    assert load(GOLDEN) == format_golden()


def test_unknown_sections_survive_a_round_trip() -> None:
    profile = dataclasses.replace(
        format_golden(), extensions={"zz-future": {"b": [1, 2], "a": None}, "vram": {"k": 1.5}}
    )
    again = loads(dumps(profile))
    assert again.extensions == {"zz-future": {"a": None, "b": [1, 2]}, "vram": {"k": 1.5}}


def _shuffled(profile, seed: int):
    rng = random.Random(seed)
    traps = []
    for trap in profile.traps:
        tensors = list(trap.tensors)
        rng.shuffle(tensors)
        traps.append(dataclasses.replace(trap, tensors=tuple(tensors)))
    blocks, schedule, untrapped = (
        list(profile.blocks),
        list(profile.schedule),
        list(profile.untrapped),
    )
    for seq in (blocks, schedule, untrapped):
        rng.shuffle(seq)
    ext = dict(reversed(list(profile.extensions.items())))
    ext["x-notes"] = dict(reversed(list(ext["x-notes"].items())))
    return dataclasses.replace(
        profile, traps=tuple(traps), blocks=tuple(blocks), schedule=tuple(schedule),
        untrapped=tuple(untrapped), extensions=ext,
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(5))
def test_bytes_do_not_depend_on_the_order_parts_were_given_in(seed: int) -> None:
    assert dumps(_shuffled(format_golden(), seed)) == dumps(format_golden())


def test_ints_and_lists_normalise_to_floats_and_tuples() -> None:
    golden = format_golden()
    trap = dataclasses.replace(golden.traps[0], compute_ms=1, tensors=list(golden.traps[0].tensors))
    a = dataclasses.replace(golden, traps=(trap, *golden.traps[1:]))
    b = dataclasses.replace(
        golden, traps=(dataclasses.replace(trap, compute_ms=1.0), *golden.traps[1:])
    )
    assert a == b and dumps(a) == dumps(b)


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "p.msgpack"
    save(format_golden(), target)
    before = target.read_bytes()
    broken = dataclasses.replace(format_golden(), blocks=())  # transfers name missing blocks
    with pytest.raises(ProfileFormatError):
        save(broken, target)
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.msgpack"]


def test_saved_files_get_the_mode_a_plain_open_gives(tmp_path: Path) -> None:
    mask = os.umask(0o027)  # a umask that differs from both 0o022 and mkstemp's 0o077
    try:
        save(format_golden(), tmp_path / "p.msgpack")
        (tmp_path / "plain").write_bytes(b"")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "p.msgpack").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o640


def test_a_failed_write_keeps_the_old_file_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "p.msgpack"
    save(format_golden(), target)
    before = target.read_bytes()

    def interrupted(*_args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save(format_golden(), target)
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.msgpack"]


def test_save_through_a_symlink_keeps_the_link(tmp_path: Path) -> None:
    (tmp_path / "real.msgpack").write_bytes(b"old")
    link = tmp_path / "link.msgpack"
    link.symlink_to("real.msgpack")
    save(format_golden(), link)
    assert link.is_symlink() and load(tmp_path / "real.msgpack") == format_golden()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.msgpack", "real.msgpack"]


def test_save_to_a_pipe_nobody_reads_is_an_error_not_a_hang(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(ConfigError, match="no process is reading"):
        save(format_golden(), pipe)
    assert stat.S_ISFIFO(pipe.lstat().st_mode)


def test_a_full_device_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match=r"p\.msgpack"):
        save(format_golden(), tmp_path / "p.msgpack")
    assert list(tmp_path.iterdir()) == []


def test_a_profile_the_reader_would_refuse_is_never_written(tmp_path: Path) -> None:
    """Each measurement may be in range while their sum is not: the write is refused, whole."""
    golden = format_golden()
    huge = dataclasses.replace(golden.predicted, makespan_ms=1e19)
    with pytest.raises(ProfileFormatError, match=r"cannot write this profile, .*makespan_ms"):
        save(dataclasses.replace(golden, predicted=huge), tmp_path / "p.msgpack")
    assert list(tmp_path.iterdir()) == []


def test_replacing_a_file_keeps_its_mode(tmp_path: Path) -> None:
    """A private profile stays private when it is saved again (the umask applies to new files)."""
    target = tmp_path / "p.msgpack"
    save(format_golden(), target)
    target.chmod(0o600)
    save(format_golden(), target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_read_only_file_is_not_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As `>` would refuse it (as root every file is writable: `os.access` says so here)."""
    import flextensor_runtime.atomic_file as atomic_file

    target = tmp_path / "p.msgpack"
    target.write_bytes(b"old")
    real = atomic_file.os.access
    monkeypatch.setattr(atomic_file.os, "access",
                        lambda p, mode: False if Path(p) == target else real(p, mode))  # fmt: skip
    with pytest.raises(ConfigError, match="the file is read-only; make it writable"):
        save(format_golden(), target)
    assert target.read_bytes() == b"old"
