"""Output paths are checked before any work: a missing folder, a folder given as a file, a file
given as a folder are one `invalid option` line, exit code 1, and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from flextensor_compile.cli.app import app
from flextensor_compile.cli.errors import run_guarded

ROOT = Path(__file__).parents[2]
NEVER_BUILT = "def build_model():\n    raise RuntimeError('built before the path check')\n"


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    code = run_guarded(lambda: app(argv, prog_name="ftc"), False)
    return code, capsys.readouterr().err.strip()


def _profile_refuses(tmp_path: Path, capsys, args: list[str], cause: str) -> None:
    """`ftc profile` of a model that must never be built, with `args` ({tmp} = tmp_path), is
    one `invalid option` line naming `cause`."""
    model = tmp_path / "model.py"
    model.write_text(NEVER_BUILT)
    argv = ["profile", str(model), "-o", str(tmp_path / "p.msgpack")]
    argv += [a.format(tmp=tmp_path) for a in args]
    code, err = _run(capsys, argv)
    assert code == 1 and len(err.splitlines()) == 1
    assert err.startswith("ftc: invalid option: ") and cause.format(tmp=tmp_path) in err


@pytest.mark.parametrize(
    ("args", "cause"),
    [
        (["-o", "{tmp}/nodir/p.msgpack"], "the folder '{tmp}/nodir' does not exist"),
        (["-o", "{tmp}"], "-o {tmp} is a folder; give a file path, e.g. {tmp}/profile.msgpack"),
        (["--save-stats", "{tmp}/nodir/s.json"], "--save-stats {tmp}/nodir/s.json: the folder"),
        (["--instrument", "{tmp}/model.py"], "--instrument {tmp}/model.py is a file, not a folder"),
    ],
)
def test_profile_checks_output_paths_before_building(tmp_path, capsys, args, cause) -> None:
    _profile_refuses(tmp_path, capsys, args, cause)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.py"]


def test_plan_inspect_sweep_check_output_paths(tmp_path, capsys) -> None:
    stats = str(ROOT / "profiles" / "tiny_transformer.stats.json")
    profile = str(ROOT / "profiles" / "tiny_transformer.f60.msgpack")
    missing = tmp_path / "nodir"
    for argv, option in (
        (["plan", stats, "-o", str(missing / "p.msgpack")], "-o"),
        (["inspect", profile, "--timeline", str(missing / "t.png")], "--timeline"),
        (["sweep", stats, "--plot", str(missing / "s.png")], "--plot"),
    ):
        code, err = _run(capsys, argv)
        assert code == 1 and err.startswith(f"ftc: invalid option: {option} {missing}/"), err
        assert "does not exist; create it" in err
    assert not missing.exists()


def test_piped_profile_output_has_no_progress_residue(tmp_path, capsys) -> None:
    model = tmp_path / "model.py"
    model.write_text(
        "import torch\n"
        "def build_model():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))\n"
        "def example_inputs():\n"
        "    return (torch.ones(1, 8),)\n"
    )
    out = tmp_path / "p.msgpack"
    argv = ["profile", str(model), "--profiling-iters", "1", "-o", str(out)]
    code = run_guarded(lambda: app(argv, prog_name="ftc"), False)
    err = capsys.readouterr().err
    assert code == 0 and out.exists(), err
    lines = err.splitlines()
    assert lines and all(line.strip() for line in lines), err  # no blank progress-bar lines
    assert lines[-1].startswith("profiling cost: ")


@pytest.mark.parametrize(
    ("args", "cause"),
    [
        (["-o", "{tmp}/locked/p.msgpack"], "the folder '{tmp}/locked' is not writable"),
        (["--instrument", "{tmp}/locked/dump"], "'{tmp}/locked' is not a writable folder"),
    ],
)
def test_an_unwritable_folder_is_one_line_before_building(
    tmp_path, capsys, monkeypatch, args, cause
) -> None:
    """The folder's permission bits say no (as root every folder is writable, so the check
    reads what `os.access` reports, here made to refuse writes under `locked`)."""
    import flextensor_compile.cli.paths as paths

    locked = tmp_path / "locked"
    locked.mkdir()
    real = paths.os.access
    monkeypatch.setattr(
        paths.os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode)
    )
    _profile_refuses(tmp_path, capsys, args, cause)
    assert list(locked.iterdir()) == []
