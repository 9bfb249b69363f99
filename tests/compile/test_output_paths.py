"""Output paths are checked before any work: a missing folder, a folder given as a file, a file
given as a folder are one `invalid option` line, exit code 1, and nothing is written."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
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
    argv = ["profile", str(model)] + ([] if "-o" in args else ["-o", str(tmp_path / "p.msgpack")])
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


STATS = ROOT / "profiles" / "tiny_transformer.stats.json"
PROFILE = ROOT / "profiles" / "tiny_transformer.f60.msgpack"


def test_a_symlinked_output_is_written_through(tmp_path, capsys) -> None:
    """The link's file gets the profile; the link stays a link (not replaced by a file)."""
    real, link = tmp_path / "real.msgpack", tmp_path / "link.msgpack"
    real.write_bytes(b"old")
    link.symlink_to(real.name)
    code, err = _run(capsys, ["plan", str(STATS), "-o", str(link)])
    assert code == 0, err
    assert link.is_symlink() and real.read_bytes()[:1] != b"o"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.msgpack", "real.msgpack"]


def test_a_named_pipe_output_is_written_in_place(tmp_path, capsys) -> None:
    """A pipe (like `/dev/null` or `/dev/stdout`) is written to, not replaced by a file; with
    nobody reading it the command stops at once with one line, it does not hang."""
    import threading

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    code, err = _run(capsys, ["plan", str(STATS), "-o", str(pipe)])
    assert code == 1 and err.startswith("ftc: invalid option: ") and "no process is reading" in err
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_bytes()), daemon=True)
    reader.start()
    try:
        code, err = _run(capsys, ["inspect", str(PROFILE), "--timeline", str(pipe)])
    finally:
        if reader.is_alive() and code != 0:
            os.close(os.open(pipe, os.O_WRONLY))  # release the reader
        reader.join(timeout=30)
    assert code == 0, err
    assert got and got[0].startswith(b"\x89PNG") and stat.S_ISFIFO(pipe.lstat().st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_socket_output_is_refused_before_any_work(tmp_path, capsys) -> None:
    import socket

    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        code, err = _run(capsys, ["plan", str(STATS), "-o", str(path)])
    assert code == 1 and err == (
        f"ftc: invalid option: -o {path}: '{path}' is a socket, not a file; give a file path"
    )


def test_an_image_without_a_suffix_is_a_png(tmp_path, capsys) -> None:
    """The format comes from the path the user gave, not from the temp file drawn first."""
    out = tmp_path / "timeline"
    code, err = _run(capsys, ["inspect", str(PROFILE), "--timeline", str(out)])
    assert code == 0, err
    assert out.read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["timeline"]


def test_an_image_format_that_needs_latex_is_refused_up_front(tmp_path, capsys) -> None:
    code, err = _run(capsys, ["sweep", str(STATS), "--plot", str(tmp_path / "s.pgf")])
    assert code == 1 and err.startswith("ftc: invalid option: --plot ") and ".pgf" in err
    assert list(tmp_path.iterdir()) == []


def test_a_redrawn_image_keeps_its_mode(tmp_path, capsys) -> None:
    out = tmp_path / "t.png"
    out.write_bytes(b"old")
    out.chmod(0o600)
    code, err = _run(capsys, ["inspect", str(PROFILE), "--timeline", str(out)])
    assert code == 0, err
    assert out.read_bytes().startswith(b"\x89PNG") and stat.S_IMODE(out.stat().st_mode) == 0o600


def _ftc_piped(*args: str) -> subprocess.CompletedProcess[bytes]:
    """`ftc ARGS` with stdout a pipe, so /dev/stdout names the pipe as a user's `| cat` would."""
    argv = [sys.executable, "-m", "flextensor_compile", *args]
    return subprocess.run(argv, capture_output=True, timeout=300, cwd=ROOT)


def test_an_output_on_stdout_gets_the_file_alone(tmp_path) -> None:
    """`-o /dev/stdout` and `--timeline /dev/stdout`: the bytes on stdout are the file's; the
    command's own lines go to stderr; with --json the clash is refused before any work."""
    from flextensor_runtime.profile import loads

    plan = _ftc_piped("plan", str(STATS), "-o", "/dev/stdout")
    assert plan.returncode == 0, plan.stderr
    assert loads(plan.stdout).traps and b"wrote /dev/stdout" in plan.stderr
    image = _ftc_piped("inspect", str(PROFILE), "--timeline", "/dev/stdout")
    assert image.returncode == 0, image.stderr
    assert image.stdout.startswith(b"\x89PNG") and b"timeline written" in image.stderr
    clash = _ftc_piped("plan", str(STATS), "-o", "/dev/stdout", "--json")
    assert clash.returncode == 1 and clash.stdout == b""
    assert b"is stdout, which --json writes its document to" in clash.stderr


def test_a_dash_output_is_stdout_not_a_file_named_dash(tmp_path) -> None:
    """`-o -` (and `--timeline -`, `--plot -`) wrote a file named '-' in the working folder;
    like `-o /dev/stdout`, it now puts the file alone on stdout."""
    from flextensor_runtime.profile import loads

    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def piped(*args: str) -> subprocess.CompletedProcess[bytes]:
        argv = [sys.executable, "-m", "flextensor_compile", *args]
        return subprocess.run(argv, capture_output=True, timeout=300, cwd=tmp_path, env=env)

    plan = piped("plan", str(STATS), "-o", "-")
    assert plan.returncode == 0, plan.stderr
    assert loads(plan.stdout).traps and b"wrote /dev/stdout" in plan.stderr
    image = piped("inspect", str(PROFILE), "--timeline", "-")
    assert image.returncode == 0 and image.stdout.startswith(b"\x89PNG"), image.stderr
    curve = piped("sweep", str(STATS), "--fractions", "0.5", "--plot", "-")
    assert curve.returncode == 0 and curve.stdout.startswith(b"\x89PNG"), curve.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_a_binary_output_on_a_terminal_is_refused_before_any_work(tmp_path) -> None:
    """`ftc plan s.json -o -` typed at a terminal wrote the msgpack bytes to the screen; a
    profile or image for a stdout that is a terminal is now one line, and nothing is written."""
    import pty

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args in (["plan", str(STATS), "-o", "-"],
                 ["inspect", str(PROFILE), "--timeline", "/dev/stdout"]):  # fmt: skip
        terminal, screen = pty.openpty()
        try:
            argv = [sys.executable, "-m", "flextensor_compile", *args]
            # (before, the profile filled the unread terminal and blocked: the timeout ends it)
            done = subprocess.run(argv, stdout=screen, stderr=subprocess.PIPE, timeout=120,
                                  cwd=tmp_path, env=env)  # fmt: skip
        finally:
            os.close(screen)
            os.close(terminal)
        err = done.stderr.decode()
        assert done.returncode == 1 and len(err.strip().splitlines()) == 1, err
        assert "stdout is a terminal, and the file is binary" in err, err
    assert list(tmp_path.iterdir()) == []
