"""`ftc` against a demanding user: an output that would overwrite an input, an image format
matplotlib cannot write, usage mistakes, Ctrl-C, absurd numbers, damaged stats and profiles.
Each is one stderr line naming the value and the fix, with no file written or changed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from flextensor_compile.cli.app import app
from flextensor_compile.cli.errors import EXIT_INTERRUPTED, run_guarded
from flextensor_compile.cli.paths import atomic_output
from flextensor_runtime.profile import load, save

ROOT = Path(__file__).parents[2]
STATS = ROOT / "profiles" / "tiny_transformer.stats.json"
PROFILE = ROOT / "profiles" / "tiny_transformer.f60.msgpack"
NEVER_BUILT = "def build_model():\n    raise RuntimeError('built before the option check')\n"


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = run_guarded(lambda: app(argv, prog_name="ftc"), False)
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def _one_line(code: int, err: str, kind: str, *needles: str) -> None:
    assert code == 1, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"ftc: {kind}: "), err
    for needle in needles:
        assert needle in err, err


def _copy(src: Path, dst: Path) -> Path:
    dst.write_bytes(src.read_bytes())
    return dst


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# --- an output path that names an input (or another output) -----------------------------------


def test_plan_refuses_to_overwrite_its_stats_file(tmp_path, capsys) -> None:
    stats = _copy(STATS, tmp_path / "stats.json")
    before = _files(tmp_path)
    code, _, err = _run(capsys, ["plan", str(stats), "-o", str(stats)])
    _one_line(code, err, "invalid option", f"-o {stats}", "is the input", "write somewhere else")
    assert _files(tmp_path) == before


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["-o", "{model}"], "-o {model}: is the model file"),
        (["--save-stats", "{model}"], "--save-stats {model}: is the model file"),
        (["-o", "{tmp}/x.bin", "--save-stats", "{tmp}/x.bin"], "--save-stats {tmp}/x.bin: is also"),
        (["-o", "{model}/p.msgpack"], "-o {model}/p.msgpack: '{model}' is a file, not a folder"),
        (["-o", "{tmp}/a.msgpack", "--instrument", "{tmp}/a.msgpack"], "-o {tmp}/a.msgpack: is also"),
    ],
)
def test_profile_refuses_outputs_that_clash(tmp_path, capsys, args, needle) -> None:
    model = tmp_path / "model.py"
    model.write_text(NEVER_BUILT)
    fmt = {"model": model, "tmp": tmp_path}
    argv = ["profile", str(model), *(a.format(**fmt) for a in args)]
    code, _, err = _run(capsys, argv)
    _one_line(code, err, "invalid option", needle.format(**fmt))
    assert _files(tmp_path) == {"model.py": NEVER_BUILT.encode()}


@pytest.mark.parametrize("option", ["-o", "--save-stats"])
def test_profile_refuses_an_output_an_instrument_file_would_overwrite(
    tmp_path, capsys, option
) -> None:
    """--instrument DIR writes DIR/config.json, discovery.json, measurement.json, plan.json."""
    model = tmp_path / "model.py"
    model.write_text(NEVER_BUILT)
    (tmp_path / "d").mkdir()
    clash = tmp_path / "d" / "plan.json"
    code, _, err = _run(capsys, ["profile", str(model), option, str(clash), "--instrument",
                                 str(tmp_path / "d")])  # fmt: skip
    _one_line(code, err, "invalid option", f"{option} {clash}: is also the --instrument output")
    assert list((tmp_path / "d").iterdir()) == []


def test_inspect_and_sweep_refuse_to_draw_over_their_input(tmp_path, capsys) -> None:
    profile = _copy(PROFILE, tmp_path / "p.png")
    stats = _copy(STATS, tmp_path / "s.png")
    before = _files(tmp_path)
    code, _, err = _run(capsys, ["inspect", str(profile), "--timeline", str(profile)])
    _one_line(code, err, "invalid option", f"--timeline {profile}: is the input")
    code, _, err = _run(capsys, ["sweep", str(stats), "--plot", str(stats)])
    _one_line(code, err, "invalid option", f"--plot {stats}: is the input")
    assert _files(tmp_path) == before


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["inspect", str(PROFILE), "--timeline", "{tmp}/t.msgpack"], "--timeline"),
        (["sweep", str(STATS), "--fractions", "0.5", "--plot", "{tmp}/s.txt"], "--plot"),
    ],
)
def test_an_image_format_matplotlib_cannot_write_is_refused_first(tmp_path, capsys, argv, option):
    code, _, err = _run(capsys, [a.format(tmp=tmp_path) for a in argv])
    _one_line(code, err, "invalid option", option, "cannot be drawn", ".png")
    assert list(tmp_path.iterdir()) == []


# --- files are written whole or not at all -----------------------------------------------------


def test_an_interrupted_write_leaves_the_old_file_and_no_temp(tmp_path) -> None:
    target = tmp_path / "timeline.png"
    target.write_bytes(b"old picture")

    def draw(path: Path) -> None:
        path.write_bytes(b"half a pict")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), atomic_output(target) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".png" and tmp != target
        draw(tmp)
    assert _files(tmp_path) == {"timeline.png": b"old picture"}
    with atomic_output(target) as tmp:
        tmp.write_bytes(b"new picture")
    assert _files(tmp_path) == {"timeline.png": b"new picture"}
    assert target.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


TALKATIVE_MODEL = (
    "import torch\nprint('loading the model file')\n"
    "def build_model():\n    print('building')\n"
    "    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))\n"
    "def example_inputs():\n    return (torch.randn(2, 8),)\n"
)


def test_instrument_files_are_written_whole_and_model_prints_leave_json_alone(
    tmp_path, capsys
) -> None:
    model = tmp_path / "model.py"
    model.write_text(TALKATIVE_MODEL)
    out = tmp_path / "inst"
    code, stdout, err = _run(
        capsys,
        ["profile", str(model), "-o", str(tmp_path / "p.msgpack"), "--instrument", str(out),
         "--json", "--profiling-iters", "1", "--warmup-iters", "0"],
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(stdout)["output"] == str(tmp_path / "p.msgpack")  # one JSON document
    assert "loading the model file" in err and "building" in err
    names = sorted(p.name for p in out.iterdir())
    assert names and all(n.endswith(".json") and not n.startswith(".") for n in names)
    for name in names:
        json.loads((out / name).read_text())


# --- usage mistakes and Ctrl-C -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle", "help_for"),
    [
        (["plan", str(STATS)], "Missing option '-o' / '--output'", "ftc plan --help"),
        (
            ["plan", str(STATS), "-o", "p.msgpack", "--mem-fraction", "abc"],
            "'--mem-fraction'",
            "ftc plan --help",
        ),
        (["sweep", str(STATS), "--bogus"], "No such option: --bogus", "ftc sweep --help"),
        # another command's option names that command; click offered --help for any name
        (["plan", str(STATS), "-o", "a", "--cache", "x"],
         "No such option: --cache; --cache is an option of `ftc profile`;", "ftc plan --help"),
        (["sweep", str(STATS), "--explain"],
         "No such option: --explain; --explain is an option of `ftc inspect`;", "ftc sweep --help"),
        (["plan", str(STATS), "-o", "a", "--budgte", "1"],
         "No such option: --budgte (did you mean --budget?);", "ftc plan --help"),
        (["bogus"], "No such command 'bogus'", "ftc --help"),
        (["inspect"], "Missing argument 'profile'", "ftc inspect --help"),
        # an option that takes one value, given twice: click would silently keep the last
        (["plan", str(STATS), "-o", "a", "--budget", "1", "--budget=2"],
         "--budget was given twice; pass it once", "ftc plan --help"),
        (["plan", str(STATS), "-o", "a", "--output", "b"], "--output (and -o) was given twice",
         "ftc plan --help"),
        (["plan", str(STATS), "-oa", "-ob"], "-o was given twice", "ftc plan --help"),
        # an option's value that is another option's name: click took it as the value
        (["plan", str(STATS), "--budget", "--strategy", "greedy", "-o", "a"],
         "--budget needs a value, got the option --strategy", "ftc plan --help"),
        (["plan", str(STATS), "--budget", "1", "-o", "--json"],
         "-o needs a value, got the option --json", "ftc plan --help"),
        (["profile", "m.py", "--cache", "a", "--cache", "b"], "--cache was given twice",
         "ftc profile --help"),
    ],
)
def test_usage_errors_are_one_line_exit_2(capsys, argv, needle, help_for) -> None:
    code, out, err = _run(capsys, argv)
    assert code == 2 and out == "", err
    assert len(err.splitlines()) == 1 and err.startswith("ftc: usage: "), err
    assert needle in err and f"`{help_for}`" in err


def test_help_and_version_still_exit_0(capsys) -> None:
    code, out, err = _run(capsys, ["plan", "--help"])
    assert code == 0 and "--mem-fraction" in out and err == ""
    code, out, _ = _run(capsys, ["--version"])
    assert code == 0 and out.startswith("ftc ")


def test_keyboard_interrupt_in_the_model_file_names_where(tmp_path, capsys) -> None:
    model = tmp_path / "model.py"
    model.write_text("import torch\n\n\ndef build_model():\n    raise KeyboardInterrupt\n")
    code, _, err = _run(capsys, ["profile", str(model), "-o", str(tmp_path / "p.msgpack")])
    assert code == EXIT_INTERRUPTED and len(err.splitlines()) == 1, err
    assert err.startswith("ftc: interrupted") and f"{model} line 5" in err, err
    assert "no partial file was left" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.py"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_on_a_model_file_that_loops(tmp_path, signum) -> None:
    """A real SIGINT (or SIGTERM, as `timeout` sends) to `ftc profile` stuck in an endless
    build_model(): one line naming the line it stopped at, exit 130, nothing written."""
    started = tmp_path / "started"
    model = tmp_path / "model.py"
    model.write_text(
        "from pathlib import Path\n\n\ndef build_model():\n"
        f"    Path({str(started)!r}).touch()\n    while True:\n        pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "flextensor_compile", "profile", str(model), "-o",
           str(tmp_path / "p.msgpack")]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert started.exists(), proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ftc: interrupted"), err
    # build_model's lines: the loop's, or the touch still returning when the signal came
    assert any(f"{model} line {n}" in lines[0] for n in (5, 6, 7)), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.py", "started"]


# --- absurd numbers ----------------------------------------------------------------------------

HUGE = "100000000000000000000"


@pytest.mark.parametrize(
    "option", ["--num-blocks", "--min-blocks", "--seed", "--profiling-iters", "--warmup-iters"]
)
def test_absurd_integers_are_refused_before_building(tmp_path, capsys, option) -> None:
    model = tmp_path / "model.py"
    model.write_text(NEVER_BUILT)
    argv = ["profile", str(model), "-o", str(tmp_path / "p.msgpack"), option, HUGE]
    code, _, err = _run(capsys, argv)
    _one_line(code, err, "invalid option", f"{option} {HUGE}", "at most")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.py"]


@pytest.mark.parametrize("command", ["profile", "plan"])
def test_a_negative_seed_is_refused_before_any_work(tmp_path, capsys, command) -> None:
    model = tmp_path / "model.py"
    model.write_text(NEVER_BUILT)
    source = str(model) if command == "profile" else str(STATS)
    argv = [command, source, "-o", str(tmp_path / "p.msgpack"), "--seed", "-1"]
    code, _, err = _run(capsys, argv)
    _one_line(code, err, "invalid option", "--seed -1 is out of range; give at least 0")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.py"]


@pytest.mark.parametrize("option", ["--num-blocks", "--min-blocks"])
def test_plan_refuses_absurd_block_counts(tmp_path, capsys, option) -> None:
    out = tmp_path / "p.msgpack"
    code, _, err = _run(capsys, ["plan", str(STATS), "-o", str(out), option, HUGE])
    _one_line(code, err, "invalid option", f"{option} {HUGE}", "at most")
    assert not out.exists()


@pytest.mark.parametrize("fractions", ["1e308", "0.5,1e300", "1:1e308:1e307"])
def test_sweep_refuses_absurd_fractions(capsys, fractions) -> None:
    code, out, err = _run(capsys, ["sweep", str(STATS), "--fractions", fractions, "--json"])
    _one_line(code, err, "invalid option", "--fractions", "at most")
    assert out == ""


# --- damaged inputs ----------------------------------------------------------------------------


def test_a_profile_for_a_device_without_memory_is_shown(tmp_path, capsys) -> None:
    profile = load(PROFILE)
    odd = save(replace(profile, device=replace(profile.device, memory_bytes=0)), tmp_path / "z")
    code, out, err = _run(capsys, ["inspect", str(odd)])
    assert code == 0 and err == "", err
    assert "device memory unknown" in out
    code, _, err = _run(capsys, ["inspect", str(odd), "--timeline", str(tmp_path / "t.png")])
    assert code == 0, err


@pytest.mark.parametrize(
    ("field", "value"),
    [("stride", 5), ("stride", True), ("tie", {"a": 1}), ("tie", ["x"])],
)
def test_stats_with_a_wrongly_typed_field_is_one_line(tmp_path, capsys, field, value) -> None:
    doc = json.loads(STATS.read_text())
    doc["traps"][1]["tensors"][0][field] = value
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps(doc))
    for argv in (["plan", str(stats), "-o", str(tmp_path / "p.msgpack")],
                 ["sweep", str(stats), "--fractions", "0.5"]):  # fmt: skip
        code, _, err = _run(capsys, argv)
        _one_line(code, err, "invalid stats", str(stats), "ftc profile --save-stats")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stats.json"]


def test_a_model_file_with_null_bytes_names_no_line_none(tmp_path, capsys) -> None:
    model = tmp_path / "model.py"
    model.write_bytes(b"def build_model():\x00\n")
    code, _, err = _run(capsys, ["profile", str(model), "-o", str(tmp_path / "p.msgpack")])
    _one_line(code, err, "model file", "null bytes", "fix the model file")
    assert "None" not in err


# --- inputs that are not regular files ---------------------------------------------------------

_NOT_A_FILE_CHILD = """
import os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))  # a regression fails, not swaps
import torch
from pathlib import Path
from flextensor_compile.cli.app import app
from flextensor_compile.cli.errors import run_guarded
from flextensor_runtime.backend import CpuBackend
from flextensor_runtime.deploy import offload_from_profile
from flextensor_runtime.errors import ProfileFormatError

tmp = Path(sys.argv[1])
fifo = tmp / "fifo"
os.mkfifo(fifo)
for source in ("/dev/zero", str(fifo)):
    for argv in (["inspect", source], ["plan", source, "-o", str(tmp / "p.msgpack")],
                 ["sweep", source, "--fractions", "0.5"]):
        print(run_guarded(lambda: app(argv, prog_name="ftc"), False), flush=True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    try:
        offload_from_profile(model, source, backend=CpuBackend())
    except ProfileFormatError as exc:
        print("runtime:", exc, flush=True)
"""


def test_a_device_or_pipe_given_as_input_is_refused_unread(tmp_path) -> None:
    """/dev/zero was read until memory ran out, a FIFO blocked for ever; both are one line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _NOT_A_FILE_CHILD, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    codes = done.stdout.split()
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if not line.startswith("runtime:")] == [
        "1"
    ] * 6
    assert done.stdout.count("runtime:") == 2 and "not a regular file" in done.stdout, codes
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 6 and all("is not a regular file" in e for e in errors), errors
    assert all(e.startswith(("ftc: invalid profile: ", "ftc: invalid stats: ")) for e in errors)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


def test_a_model_file_that_changes_folder_still_writes_where_asked(tmp_path, capsys, monkeypatch):
    """The output paths were taken relative to the folder the model file moved to (and moving
    broke the model loader with an internal ValueError)."""
    (tmp_path / "elsewhere").mkdir()
    model = tmp_path / "model.py"
    model.write_text(
        "import os\n"
        + TALKATIVE_MODEL.replace("print('loading the model file')", "os.chdir('elsewhere')")
    )
    monkeypatch.chdir(tmp_path)
    argv = ["profile", "model.py", "-o", "p.msgpack", "--save-stats", "s.json", "--quiet",
            "--profiling-iters", "1", "--warmup-iters", "0"]  # fmt: skip
    code, out, err = _run(capsys, argv)
    assert code == 0, err
    assert out.strip().splitlines()[-1] == "wrote p.msgpack"  # as given
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "model.py", "p.msgpack",
                                                          "s.json"]  # fmt: skip
    assert list((tmp_path / "elsewhere").iterdir()) == []
    load(tmp_path / "p.msgpack")


def test_text_from_a_profile_is_shown_literally(tmp_path, capsys) -> None:
    """Names and the recorded command were read as rich markup: '[/bold]' was an internal
    MarkupError, and control characters (a terminal escape) reached the terminal."""
    profile = load(PROFILE)
    odd = replace(
        profile,
        meta=replace(profile.meta, command="ftc [/bold] [red]x\x1b[2J"),
        device=replace(profile.device, name="[/]gpu"),
        traps=tuple(replace(t, name=f"{t.name}[/x]") if t.kind == "gap" else t
                    for t in profile.traps),
    )  # fmt: skip
    path = save(odd, tmp_path / "odd.msgpack")
    for extra in ([], ["--explain"]):
        code, out, err = _run(capsys, ["inspect", str(path), *extra])
        assert code == 0, err
        assert "ftc [/bold] [red]x" in out and "[/]gpu" in out and "[/x]" in out
        assert "\x1b" not in out
    out_png = tmp_path / "[red]t[dim].png"
    code, out, err = _run(capsys, ["inspect", str(path), "--timeline", str(out_png)])
    assert code == 0 and f"timeline written to {out_png}" in out.replace("\n", ""), err


# --- wording: each line says what was wrong and what to type instead -------------------------


@pytest.mark.parametrize(
    ("fractions", "why", "fix"),
    [
        ("1.0:0.2:0.1", "STOP is below START", "--fractions 0.2:1:0.1"),
        ("0.2:1.0:0", "STEP must be positive", "--fractions 0.2:1:0.05"),
        ("0.2:1.0:-0.1", "STEP must be positive", "--fractions 0.2:1:0.1"),
    ],
)
def test_a_backwards_fraction_range_says_which_end(capsys, fractions, why, fix) -> None:
    code, _, err = _run(capsys, ["sweep", str(STATS), "--fractions", fractions])
    _one_line(code, err, "invalid option", why, fix)


@pytest.mark.parametrize("command", ["plan", "sweep"])
def test_an_empty_or_missing_input_names_both_kinds_it_may_be(tmp_path, capsys, command) -> None:
    empty = tmp_path / "p.msgpack"
    empty.write_bytes(b"")
    for source, cause in ((empty, "the file is empty"), (tmp_path / "gone.msgpack", "no such")):
        argv = [command, str(source)] + (["-o", str(tmp_path / "o.msgpack")] if command == "plan"
                                         else [])  # fmt: skip
        code, _, err = _run(capsys, argv)
        _one_line(code, err, "invalid stats", cause, "--save-stats", "or a profile")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.msgpack"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_a_folder_that_refuses_files_is_found_before_building(tmp_path, capsys) -> None:
    """/proc passes a writability check (as root) and still refuses every new file."""
    model = tmp_path / "model.py"
    model.write_text(NEVER_BUILT)
    code, _, err = _run(capsys, ["profile", str(model), "-o", "/proc/p.msgpack"])
    _one_line(code, err, "invalid option", "-o /proc/p.msgpack: the folder '/proc' refused")


def test_control_characters_in_a_path_are_shown_as_escapes(tmp_path, capsys) -> None:
    source = tmp_path / "a\x1b[31mred\x07\tx\r.json"
    code, _, err = _run(capsys, ["plan", str(source), "-o", str(tmp_path / "o.msgpack")])
    _one_line(code, err, "invalid stats", "a\\x1b[31mred\\x07\\tx\\r.json")
    assert not any(c in err for c in "\x1b\x07\t\r")


def test_json_stays_one_document_when_the_model_writes_to_descriptor_1(tmp_path) -> None:
    """`os.write(1, ...)` and `sys.__stdout__` bypass `sys.stdout`: they go to stderr too."""
    model = tmp_path / "noisy.py"
    model.write_text(
        "import os, sys, torch\n"
        "os.write(1, b'raw write at import\\n')\n"
        "def build_model():\n"
        "    print('built', file=sys.__stdout__)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))\n"
        "def example_inputs():\n"
        "    return (torch.ones(1, 8),)\n"
    )
    argv = [sys.executable, "-m", "flextensor_compile", "profile", str(model), "--json",
            "--profiling-iters", "1", "-o", str(tmp_path / "p.msgpack")]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["traps"] == 2
    assert "raw write at import" in done.stderr and "built" in done.stderr


def test_a_thread_the_model_file_leaves_running_does_not_hold_ftc(tmp_path) -> None:
    model = tmp_path / "threaded.py"
    model.write_text(
        "import threading, time, torch\n"
        "threading.Thread(target=lambda: time.sleep(1000), name='forever').start()\n"
        "def build_model():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))\n"
        "def example_inputs():\n"
        "    return (torch.ones(1, 8),)\n"
    )
    out = tmp_path / "p.msgpack"
    argv = [sys.executable, "-m", "flextensor_compile", "profile", str(model), "--quiet",
            "--profiling-iters", "1", "-o", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert load(out).traps and "not waiting for 1 thread the model file started" in done.stderr
    assert "(forever)" in done.stderr


@pytest.mark.parametrize("exclude", ["blocks.*", "class:Block"])
def test_an_exclude_that_removes_every_trap_is_an_invalid_option(
    tmp_path, capsys, exclude: str
) -> None:
    """A class exclude covers each block's inner layers too (the default include also matches
    them), so it removes every trap as the path exclude does."""
    out = tmp_path / "p.msgpack"
    model = str(ROOT / "profiles" / "tiny_transformer.py")
    code, _, err = _run(capsys, ["profile", model, "--exclude", exclude, "-o", str(out)])
    _one_line(code, err, "invalid option", f"--exclude {exclude!r} removes every module that the "
              "default include ('blocks.?*') selects", "narrow the exclude pattern")  # fmt: skip
    assert not out.exists()
