"""What `ftc` prints for a user's own text (paths given on the command line) and at the edges of
the numbers it reports: control characters shown as escapes, suggestions that hold when typed."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest

from flextensor_compile.cli.app import app
from flextensor_compile.cli.errors import run_guarded
from flextensor_compile.sweep import OVER_MEMORY
from flextensor_runtime.profile import load

STATS = Path(__file__).parents[2] / "profiles" / "tiny_transformer.stats.json"
TWO_LINEARS = (
    "import torch\n"
    "def build_model():\n"
    "    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))\n"
    "def example_inputs():\n"
    "    return (torch.ones(1, 8),)\n"
)


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = run_guarded(lambda: app(argv, prog_name="ftc"), False)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("extra", [[], ["--quiet"]])
def test_profile_shows_control_characters_in_its_output_path_as_escapes(
    tmp_path, capsys, extra: list[str]
) -> None:
    """`ftc profile` printed the `-o` path raw: a terminal escape in it recoloured the terminal
    and a newline split the summary line (the other commands show such paths as escapes)."""
    model = tmp_path / "model.py"
    model.write_text(TWO_LINEARS)
    out = tmp_path / "a\x1b[31mred\nx.msgpack"
    argv = ["profile", str(model), "--profiling-iters", "1", "-o", str(out), *extra]
    code, stdout, err = _run(capsys, argv)
    assert code == 0, err
    assert not any(c in stdout for c in "\x1b\r"), stdout
    wrote = [line for line in stdout.splitlines() if line.startswith("wrote ")]
    assert len(wrote) == 1 and "a\\x1b[31mred\\nx.msgpack" in wrote[0], stdout
    load(out)


def _small_device_stats(tmp_path: Path, memory_bytes: int) -> Path:
    """The bundled stats on a real (not emulated) device with less memory than the weights."""
    doc = json.loads(STATS.read_text())
    doc["device"].update(kind="cuda", name="small-gpu", memory_bytes=memory_bytes)
    path = tmp_path / "small.json"
    path.write_text(json.dumps(doc))
    return path


def _sweep_json(capsys, source: Path, fractions: str) -> list[dict]:
    code, out, err = _run(capsys, ["sweep", str(source), "--fractions", fractions, "--json"])
    assert code == 0, err
    return json.loads(out)


def test_sweep_over_device_memory_names_a_fraction_the_device_holds(tmp_path, capsys) -> None:
    """3 MiB of 4.84 MiB of weights is frac 0.6199: the error said 'up to 0.620', and a sweep
    at 0.620 was over device memory again."""
    stats = _small_device_stats(tmp_path, 3 * 2**20)
    (point,) = _sweep_json(capsys, stats, "1.0")
    assert point["status"] == OVER_MEMORY
    most = point["error"].split("sweep fractions up to ")[1]
    assert most == "0.619", point["error"]
    (again,) = _sweep_json(capsys, stats, most)
    assert again["status"] == "planned", again


def test_sweep_with_no_plan_suggests_fractions_the_device_holds(
    tmp_path, capsys, monkeypatch
) -> None:
    """The suggested range ran to 1.0 on a device holding less than every weight."""
    monkeypatch.setenv("COLUMNS", "400")  # the line unwrapped
    stats = _small_device_stats(tmp_path, 3 * 2**20)
    code, out, err = _run(capsys, ["sweep", str(stats), "--fractions", "0.1,0.2"])
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("no budget swept"))
    suggested = line.split("--fractions ")[1].strip()
    assert suggested.endswith(":0.619:0.05"), line
    points = _sweep_json(capsys, stats, suggested)
    assert all(p["status"] == "planned" for p in points), points
    tiny = _small_device_stats(tmp_path, 1_000_000)  # less than the smallest feasible budget
    code, out, err = _run(capsys, ["sweep", str(tiny), "--fractions", "0.1"])
    assert code == 0, err
    assert "more than the device holds (frac 0.197); plan for a larger device" in out, out
    # an emulated device holds any budget: past the weights (a large reserve), sweep there
    reserved = tmp_path / "reserved.msgpack"
    code, _, err = _run(capsys, ["plan", str(STATS), "--budget", "8MiB", "--activation-reserve",
                                 "5MiB", "-o", str(reserved)])  # fmt: skip
    assert code == 0, err
    code, out, err = _run(capsys, ["sweep", str(reserved), "--fractions", "0.5"])
    assert code == 0 and "more than the device holds" not in out, out
    assert "(frac 1.259 of the weights); sweep from there, e.g. --fractions 1.259" in out, out


def test_a_timeline_of_an_iteration_that_takes_no_time_draws_without_a_warning(
    tmp_path, capsys
) -> None:
    """Traps timed at 0 ms and nothing streamed: the plot's range 0..0 made matplotlib print a
    UserWarning ('Attempting to set identical low and high xlims') among ftc's own lines."""
    doc = json.loads(STATS.read_text())
    doc["traps"] = [dict(t, compute_ms=0.0) for t in doc["traps"] if t["kind"] == "gap"]
    stats = tmp_path / "gaps.json"
    stats.write_text(json.dumps(doc))
    profile = tmp_path / "p.msgpack"
    code, _, err = _run(capsys, ["plan", str(stats), "-o", str(profile)])
    assert code == 0, err
    png = tmp_path / "t.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning is an internal error: exit code 1
        code, _, err = _run(capsys, ["inspect", str(profile), "--timeline", str(png)])
    assert code == 0, err
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_inspect_shows_a_latency_mode_activation_reserve(tmp_path, capsys) -> None:
    """The reserve counts in a latency-mode plan's peak, but `ftc inspect` named it only with a
    budget, so the peak was 1 MiB more than resident + blocks with nothing saying why."""
    profile = tmp_path / "p.msgpack"
    argv = ["plan", str(STATS), "--activation-reserve", "1MiB", "-o", str(profile)]
    code, _, err = _run(capsys, argv)
    assert code == 0, err
    code, out, err = _run(capsys, ["inspect", str(profile)])
    assert code == 0, err
    budget = next(line for line in out.splitlines() if line.startswith("budget"))
    assert "none (latency mode), 1 MiB kept for activations" in budget, out


def test_each_commands_summary_in_ftc_help_is_one_line(capsys) -> None:
    """`ftc --help` lists each command by its docstring's first paragraph, line breaks kept:
    `plan`'s ran over two source lines and showed a hard break mid-sentence."""
    import typer.main

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    assert set(commands) == {"inspect", "plan", "profile", "sweep"}
    for name, command in commands.items():
        summary = (command.help or "").strip().split("\n\n")[0]
        assert "\n" not in summary, (name, summary)


def test_a_slower_budget_line_names_the_options_the_sweep_solved_with() -> None:
    """`ftc sweep --strategy nth-layer` said '--budget N gets that plan', but `ftc plan --budget
    N` solves with adaptive and gets another plan (on the 8B leaf stats: 263.669 ms, not the
    281.487 ms named); the line now carries the sweep's strategy, blocks, assignment and
    (from a profile) activation reserve."""
    from dataclasses import replace

    from flextensor_compile.cli.sweep_cmd import _pick_lines, _plan_options
    from flextensor_compile.sweep import SweepPoint
    from flextensor_runtime.profile import PlanConfig

    def point(frac: float, ms: float) -> SweepPoint:
        return SweepPoint(frac, int(frac * 1000), frac, ms, 0.0, 0, 0, "x")

    assert _plan_options(PlanConfig()) == ""
    assert _plan_options(replace(PlanConfig(), strategy="adaptive-knapsack", seed=3)) == (
        " --strategy adaptive-knapsack"
    )
    config = replace(PlanConfig(), strategy="nth-layer", min_blocks=2,
                     activation_reserve_bytes=4096, budget_bytes=10, mem_fraction=0.5)  # fmt: skip
    options = _plan_options(config)
    assert options == " --strategy nth-layer --min-blocks 2 --activation-reserve 4096"
    lines = _pick_lines((point(0.6, 100.0), point(0.8, 103.0)), 1000, None, options)
    assert ("frac 0.80 plans 103.000 ms, slower than frac 0.60's 100.000 ms, whose plan fits it "
            f"too: --budget 600{options} gets that plan") in lines  # fmt: skip


def test_absurd_predictions_print_in_four_figures_in_every_summary(tmp_path, capsys) -> None:
    """A link of 1e-8 bytes/s predicts 2.5e17 ms: `ftc sweep` showed 2.49e+17, but the `ftc plan`
    line and `ftc inspect`'s summary printed 249036800000000000.000 (and an 18-digit overhead)."""
    doc = json.loads(STATS.read_text())
    doc["device"].update(h2d_bytes_per_s=1e-8, bandwidth_curve=[])
    stats = tmp_path / "slow.json"
    stats.write_text(json.dumps(doc))
    profile = tmp_path / "p.msgpack"
    code, planned, err = _run(capsys, ["plan", str(stats), "--mem-fraction", "0.6", "-o", str(profile)])
    assert code == 0, err
    code, shown, err = _run(capsys, ["inspect", str(profile)])
    assert code == 0, err
    predicted = next(line for line in shown.splitlines() if line.startswith("predicted"))
    for text in (planned, predicted):
        assert "e+17 ms" in text and not re.search(r"\d{10}", text), text


def test_a_budget_error_after_saving_stats_says_how_to_replan_them(tmp_path, capsys) -> None:
    """The stats were written before solving, but the budget error did not say so: a user
    profiled again (minutes for a large model) instead of re-planning the saved file."""
    model = tmp_path / "model.py"
    model.write_text(TWO_LINEARS)
    stats, out = tmp_path / "s.json", tmp_path / "p.msgpack"
    argv = ["profile", str(model), "--budget", "100", "--strategy", "greedy",
            "--profiling-iters", "1", "--save-stats", str(stats), "-o", str(out)]  # fmt: skip
    code, _, err = _run(capsys, argv)
    assert code == 1 and len(err.strip().splitlines()) == 1 and not out.exists(), err
    hint = re.search(r"the measurements are saved: `ftc plan (.*) -o OUT` re-plans", err)
    assert hint is not None, err
    replan = hint.group(1).split()
    assert replan[0] == str(stats) and "--strategy" in replan and "greedy" in replan, err
    code, _, err = _run(capsys, ["plan", *replan, "-o", str(out)])
    assert code == 0 and load(out).config.strategy == "greedy", err


def test_plan_from_a_profile_says_which_sections_it_does_not_carry(tmp_path, capsys) -> None:
    """`ftc plan PROFILE` writes the plan only: a caches section the input had was dropped
    without a word, so a deployment of the new profile ran without its cache."""
    from dataclasses import replace

    from flextensor_runtime.cache_section import (
        cache_section_to_data,
        parse_cache_section,
        parse_cache_spec,
    )
    from flextensor_runtime.profile import save

    golden = load(STATS.parent / "tiny_transformer.f60.msgpack")
    spec = parse_cache_spec("fixed-step:module=blocks.0;skip=2-18/2")
    cache = cache_section_to_data(parse_cache_section(spec))
    source = save(replace(golden, extensions={**golden.extensions, "caches": cache}),
                  tmp_path / "with_cache.msgpack")  # fmt: skip
    out = tmp_path / "p.msgpack"
    code, stdout, err = _run(capsys, ["plan", str(source), "--json", "-o", str(out)])
    assert code == 0 and "caches" not in load(out).extensions, err
    json.loads(stdout)  # the note is not in the document
    assert "note: the input's caches section is not in the new profile (ftc plan writes the " \
           "plan only); `ftc profile --cache`/`--vram` writes those" in " ".join(err.split())
    code, _, err = _run(capsys, ["plan", str(STATS), "-o", str(out)])
    assert code == 0 and "note:" not in err, err


def test_explain_on_an_edited_profile_suggests_a_replan_with_its_budget(
    tmp_path, capsys, monkeypatch
) -> None:
    """Predictions below the staging bound said 're-plan it with `ftc plan PROFILE -o OUT`':
    typed as shown, that plans in latency mode, not at the profile's budget."""
    from dataclasses import replace

    from flextensor_runtime.profile import save

    monkeypatch.setenv("COLUMNS", "400")
    golden = load(STATS.parent / "tiny_transformer.f40.msgpack")
    edited = save(replace(golden, predicted=replace(golden.predicted, makespan_ms=1.0)),
                  tmp_path / "edited.msgpack")  # fmt: skip
    code, out, err = _run(capsys, ["inspect", str(edited), "--explain"])
    assert code == 0, err
    hint = re.search(r"re-plan it with `ftc plan (.*) -o OUT`", out)
    assert hint is not None, out
    assert hint.group(1) == f"{edited} --mem-fraction 0.4 --strategy adaptive", hint.group(1)
    replanned = tmp_path / "p.msgpack"
    code, _, err = _run(capsys, ["plan", *hint.group(1).split(), "-o", str(replanned)])
    assert code == 0 and load(replanned).config.budget_bytes == golden.config.budget_bytes, err


def test_a_budget_far_over_an_emulated_device_reads_as_a_multiple(tmp_path, capsys) -> None:
    """`--budget 1PiB` on the emulated device (its memory is the model's weights) printed
    '22186792960% of device'; past 10 x a budget reads as a multiple."""
    out = tmp_path / "p.msgpack"
    code, _, err = _run(capsys, ["plan", str(STATS), "--budget", "1PiB", "-o", str(out)])
    assert code == 0, err
    code, text, err = _run(capsys, ["inspect", str(out)])
    assert code == 0, err
    assert re.search(r"\d(\.\d+)?e\+\d+ x device memory", text) and "% of device" not in text
    code, _, err = _run(capsys, ["plan", str(STATS), "--mem-fraction", "0.5", "-o", str(out)])
    code, text, err = _run(capsys, ["inspect", str(out)])
    assert "(50% of device)" in text
