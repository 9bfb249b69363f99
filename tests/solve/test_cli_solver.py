"""`ftc plan`, `ftc sweep` and `ftc inspect --explain/--timeline` end to end (typer runner)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flextensor_compile.cli.app import app
from flextensor_compile.stats import Stats, TrapStat, save_stats
from flextensor_compile.sweep import OVER_MEMORY
from flextensor_runtime.errors import BudgetError
from flextensor_runtime.profile import check_profile, load
from tests.solve.instances import tensor, total_bytes, uniform_stats

runner = CliRunner()


@pytest.fixture
def stats_file(tmp_path: Path) -> Path:
    return save_stats(uniform_stats(10), tmp_path / "stats.json")


def test_plan_writes_a_valid_profile_within_the_budget(stats_file: Path, tmp_path: Path) -> None:
    budget = total_bytes(uniform_stats(10)) // 2
    out = tmp_path / "p.msgpack"
    result = runner.invoke(app, ["plan", str(stats_file), "--budget", str(budget), "-o", str(out),
                                 "--num-blocks", "2", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    profile = load(out)
    check_profile(profile)
    assert profile.predicted.peak_bytes <= budget and len(profile.blocks) <= 2
    doc = json.loads(result.output)
    assert doc["predicted"]["peak_bytes"] == profile.predicted.peak_bytes


def test_plan_from_a_profile_equals_plan_from_its_stats(stats_file: Path, tmp_path: Path) -> None:
    first, again, direct = (tmp_path / f"{n}.msgpack" for n in ("first", "again", "direct"))
    assert runner.invoke(app, ["plan", str(stats_file), "-o", str(first)]).exit_code == 0
    budget = str(total_bytes(uniform_stats(10)) // 2)
    replanned = runner.invoke(app, ["plan", str(first), "--budget", budget, "-o", str(again)])
    assert replanned.exit_code == 0, replanned.output
    assert runner.invoke(app, ["plan", str(stats_file), "--budget", budget, "-o",
                               str(direct)]).exit_code == 0  # fmt: skip
    assert again.read_bytes() == direct.read_bytes()
    clash = runner.invoke(app, ["plan", str(first), "-o", str(first)])
    assert clash.exit_code != 0 and "the input" in str(clash.exception)


def test_activation_reserve_is_kept_inside_the_budget(stats_file: Path, tmp_path: Path) -> None:
    budget = total_bytes(uniform_stats(10)) // 2
    reserve = budget // 5
    plain, kept = tmp_path / "plain.msgpack", tmp_path / "kept.msgpack"
    args = ["plan", str(stats_file), "--budget", str(budget)]
    assert runner.invoke(app, [*args, "-o", str(plain)]).exit_code == 0
    result = runner.invoke(app, [*args, "--activation-reserve", str(reserve), "-o", str(kept)])
    assert result.exit_code == 0, result.output
    profile = load(kept)
    assert profile.config.activation_reserve_bytes == reserve
    pred, blocks = profile.predicted, sum(b.bytes for b in profile.blocks)
    assert pred.peak_bytes == pred.resident_bytes + blocks + reserve <= budget
    base = load(plain)  # without the option: no reserve in the peak
    assert base.config.activation_reserve_bytes == 0
    assert base.predicted.peak_bytes == base.predicted.resident_bytes + sum(
        b.bytes for b in base.blocks
    )
    assert f"--activation-reserve {reserve}" in profile.meta.command
    shown = runner.invoke(app, ["inspect", str(kept)])
    assert "kept for activations" in shown.output
    too_big = runner.invoke(app, [*args, "--activation-reserve", str(budget), "-o",
                                  str(tmp_path / "no.msgpack")])  # fmt: skip
    assert isinstance(too_big.exception, BudgetError)
    assert "lower --activation-reserve" in str(too_big.exception)


def test_plan_reports_the_smallest_budget(stats_file: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", str(stats_file), "--budget", "100", "-o",
                                 str(tmp_path / "p.msgpack")])  # fmt: skip
    assert isinstance(result.exception, BudgetError)
    assert "at least" in str(result.exception)


def test_sweep_from_stats_and_from_a_profile(stats_file: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["sweep", str(stats_file), "--fractions", "0.4:1.0:0.2",
                                 "--json", "--plot", str(tmp_path / "s.png")])  # fmt: skip
    assert result.exit_code == 0, result.output
    points = json.loads(result.output)
    assert [p["fraction"] for p in points] == [0.4, 0.6, 0.8, 1.0]
    assert points[-1]["stall_ms"] == 0 and points[-1]["peak_bytes"] <= points[-2]["peak_bytes"]
    assert all(0 < p["bound_ms"] <= p["makespan_ms"] * (1 + 1e-9) for p in points)
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    out = tmp_path / "p.msgpack"
    assert runner.invoke(app, ["plan", str(stats_file), "-o", str(out)]).exit_code == 0
    table = runner.invoke(app, ["sweep", str(out), "--fractions", "0.5,1.0"])
    assert table.exit_code == 0 and "1.00" in table.output and "x bound" in table.output
    assert "fastest: " in table.output  # where to look when picking a budget


def test_sweep_marks_budgets_over_device_memory(tmp_path: Path) -> None:
    stats = uniform_stats(10)
    weights = total_bytes(stats)
    small = replace(stats, device=replace(stats.device, memory_bytes=int(weights * 0.7)))
    path = save_stats(small, tmp_path / "small.json")
    result = runner.invoke(app, ["sweep", str(path), "--fractions", "0.4:1.0:0.2", "--json"])
    assert result.exit_code == 0, result.output
    points = json.loads(result.output)
    assert [p["status"] for p in points] == ["planned", "planned", OVER_MEMORY, OVER_MEMORY]
    assert all(p["makespan_ms"] is None and p["bound_ms"] is None for p in points[2:])
    assert "sweep fractions up to 0.700" in points[-1]["error"]
    for columns, shown in (("120", "over device memory"), ("80", "over device")):
        # an 80-column terminal folds the last column (it never drops it)
        table = runner.invoke(app, ["sweep", str(path), "--fractions", "0.05,0.5,1.0"],
                              env={"COLUMNS": columns})  # fmt: skip
        assert table.exit_code == 0 and shown in table.output and "does not fit" in table.output
    # an emulated device has the memory the plan is for: every budget is solved
    emulated = replace(small, device=replace(small.device, kind="emulated"))
    swept = runner.invoke(app, ["sweep", str(save_stats(emulated, tmp_path / "e.json")),
                                "--fractions", "1.0", "--json"])  # fmt: skip
    assert swept.exit_code == 0 and json.loads(swept.output)[0]["status"] == "planned"


def test_a_sweep_where_nothing_fits_says_where_to_sweep(stats_file: Path, tmp_path: Path) -> None:
    """No plan at any budget: no empty chart, and a line naming the smallest feasible budget
    with fractions that start there; sweeping those finds a plan at the first one."""
    plot = tmp_path / "s.png"
    result = runner.invoke(app, ["sweep", str(stats_file), "--fractions", "0.01,0.02",
                                 "--plot", str(plot)], env={"COLUMNS": "400"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert not plot.exists() and f"no plot drawn to {plot}" in result.output
    line = next(x for x in result.output.splitlines() if x.startswith("no budget swept"))
    assert "the smallest feasible budget is " in line
    suggested = line.split("--fractions ")[1].strip()
    again = runner.invoke(app, ["sweep", str(stats_file), "--fractions", suggested, "--json"])
    assert again.exit_code == 0 and json.loads(again.output)[0]["status"] == "planned"
    points = json.loads(runner.invoke(app, ["sweep", str(stats_file), "--fractions", "0.01",
                                            "--json"]).output)  # fmt: skip
    assert points[0]["least_bytes"] > points[0]["budget_bytes"]


def test_sweep_names_each_budget_once_and_the_kept_reserve(
    stats_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "p.msgpack"
    made = runner.invoke(app, ["plan", str(stats_file), "--mem-fraction", "1.0",
                               "--activation-reserve", "4KiB", "-o", str(out)])  # fmt: skip
    assert made.exit_code == 0, made.output
    result = runner.invoke(app, ["sweep", str(out), "--fractions", "0.6,1.0"],
                           env={"COLUMNS": "400"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "each budget keeps 4 KiB for activations" in result.output
    from flextensor_compile.cli.sweep_cmd import _pick_lines
    from flextensor_compile.sweep import SweepPoint

    def point(fraction: float, ms: float) -> SweepPoint:
        return SweepPoint(fraction, int(fraction * 1000), fraction, ms, 0.0, 0, 0, "knapsack")

    # 0.9 is within 5% of the fastest, and so within 20% too: it is named once
    picks = _pick_lines((point(0.5, 2.0), point(0.9, 1.04), point(1.0, 1.0)), 1000)
    assert [x.split("frac ")[1].split()[0] for x in picks] == ["1.00", "0.90"], picks


def test_inspect_explain_and_timeline(stats_file: Path, tmp_path: Path) -> None:
    budget = total_bytes(uniform_stats(10)) // 2
    out = tmp_path / "p.msgpack"
    # greedy streams the least that fits, so both placements show (adaptive may stream all)
    runner.invoke(app, ["plan", str(stats_file), "--budget", str(budget), "--strategy", "greedy",
                        "-o", str(out)])  # fmt: skip
    png = tmp_path / "t.png"
    result = runner.invoke(app, ["inspect", str(out), "--explain", "--json", "--timeline",
                                 str(png)])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert {t["placement"] for t in doc["explain"]["tensors"]} == {"resident", "streamed"}
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert 0 < doc["explain"]["bound_ms"] <= doc["explain"]["makespan_ms"] * (1 + 1e-9)
    human = runner.invoke(app, ["inspect", str(out), "--explain"])
    assert human.exit_code == 0 and "block assignment" in human.output
    assert "x the staging bound" in human.output


def test_explain_on_a_hand_edited_profile_says_its_predictions_do_not_match(
    tmp_path: Path,
) -> None:
    """A trap's compute edited up after planning: no plan could predict the recorded makespan,
    and the explanation says so instead of a ratio of 0.000."""
    src = Path(__file__).parents[2] / "profiles" / "tiny_transformer.f60.msgpack"
    profile = load(src)
    traps = list(profile.traps)
    traps[1] = replace(traps[1], compute_ms=1e6)
    edited = tmp_path / "edited.msgpack"
    from flextensor_runtime.profile import save

    save(replace(profile, traps=tuple(traps)), edited)
    result = runner.invoke(app, ["inspect", str(edited), "--explain"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "its predictions do not match its traps" in result.output
    assert "x the staging bound" not in result.output
    plain = runner.invoke(app, ["inspect", str(src), "--explain"], env={"COLUMNS": "400"})
    assert "x the staging bound" in plain.output and "do not match" not in plain.output


def test_explain_on_an_80_column_terminal_folds_names(tmp_path: Path) -> None:
    long = "model.layers.{}.self_attention.query_key_value_projection.weight"
    traps = tuple(TrapStat(f"model.layers.{i}.self_attention", 1.0,
                           (tensor(long.format(i), 4000), tensor(f"model.layers.{i}.norm", 100)))
                  for i in range(6))  # fmt: skip
    stats = Stats("long names", uniform_stats(1).device, traps)
    out = tmp_path / "p.msgpack"
    planned = runner.invoke(app, ["plan", str(save_stats(stats, tmp_path / "s.json")),
                                  "--budget", str(total_bytes(stats) // 2), "-o", str(out)])  # fmt: skip
    assert planned.exit_code == 0, planned.output
    human = runner.invoke(app, ["inspect", str(out), "--explain"], env={"COLUMNS": "80"})
    assert human.exit_code == 0 and "why each tensor" in human.output
    assert "…" not in human.output  # long names fold: none is cut to an ellipsis


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        (["--mem-fraction", "0"], "e.g. --mem-fraction 0.6"),
        (["--num-blocks", "0"], "pass --num-blocks 1 or more"),
        (["--min-blocks", "3", "--num-blocks", "2"], "lower --min-blocks or raise --num-blocks"),
    ],
)
def test_plan_option_errors_name_the_fix(
    stats_file: Path, tmp_path: Path, args: list[str], fix: str
) -> None:
    out = tmp_path / "p.msgpack"
    result = runner.invoke(app, ["plan", str(stats_file), "-o", str(out), *args])
    assert result.exit_code != 0 and not out.exists()
    assert fix in str(result.exception)


def test_budget_error_names_the_mem_fraction_that_fits(tmp_path: Path) -> None:
    stats_file = Path(__file__).parents[2] / "profiles" / "tiny_transformer.stats.json"
    out = tmp_path / "p.msgpack"
    result = runner.invoke(app, ["plan", str(stats_file), "--mem-fraction", "0.2", "-o", str(out)])
    assert isinstance(result.exception, BudgetError) and not out.exists()
    msg = str(result.exception)
    fraction = msg.split("raise --mem-fraction to at least ")[1].split()[0]
    ok = runner.invoke(app, ["plan", str(stats_file), "--mem-fraction", fraction, "-o", str(out)])
    assert ok.exit_code == 0, ok.output  # the fraction named is enough
    below = f"{float(fraction) - 0.01:.2f}"
    low = runner.invoke(app, ["plan", str(stats_file), "--mem-fraction", below, "-o", str(out)])
    assert isinstance(low.exception, BudgetError)  # and it is the smallest at 0.01 steps


def test_mem_fraction_of_a_profile_without_device_memory_asks_for_a_budget(
    tmp_path: Path,
) -> None:
    """A profile may record no device memory (0 bytes): a fraction of it is no budget."""
    src = Path(__file__).parents[2] / "profiles" / "tiny_transformer.f60.msgpack"
    profile = load(src)
    zero = tmp_path / "zero.msgpack"
    from flextensor_runtime.profile import save

    save(replace(profile, device=replace(profile.device, memory_bytes=0, kind="target")), zero)
    out = tmp_path / "p.msgpack"
    result = runner.invoke(app, ["plan", str(zero), "--mem-fraction", "0.5", "-o", str(out)])
    assert result.exit_code != 0 and not out.exists()
    assert "pass --budget instead" in str(result.exception), result.exception
    # and a budget is then taken as given (it was refused as over the device's 0 bytes)
    given = runner.invoke(app, ["plan", str(zero), "--budget", "8GiB", "-o", str(out)])
    assert given.exit_code == 0, given.output
    assert load(out).config.budget_bytes == 8 << 30
    sweep = runner.invoke(app, ["sweep", str(zero), "--fractions", "0.5,1.0", "--json"])
    assert sweep.exit_code == 0 and "over device memory" not in sweep.output, sweep.output


def test_strategy_help_lists_every_strategy() -> None:
    from flextensor_compile.cli.profile_cmd import STRATEGY_HELP
    from flextensor_compile.config import STRATEGIES as CONFIG_STRATEGIES
    from flextensor_compile.solve.strategies import STRATEGIES

    assert set(CONFIG_STRATEGIES) == set(STRATEGIES)
    listed = STRATEGY_HELP.split(": ", 1)[1].rstrip(".").replace(" or ", ", ").split(", ")
    assert listed == list(STRATEGIES)
    for command in ("profile", "plan", "sweep"):
        result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "400"})
        assert "global-tensor-selection" in result.output, command


def test_latency_plan_larger_than_the_device_is_refused(tmp_path: Path) -> None:
    from dataclasses import replace

    stats = uniform_stats(4, compute_ms=0.001)  # copies cannot hide: latency keeps all resident
    small = replace(stats, device=replace(stats.device, memory_bytes=total_bytes(stats) * 9 // 10))
    path = save_stats(small, tmp_path / "small.json")
    out = tmp_path / "p.msgpack"
    result = runner.invoke(app, ["plan", str(path), "-o", str(out)])
    assert isinstance(result.exception, BudgetError) and not out.exists()
    assert "the latency-mode plan keeps" in str(result.exception)
    assert "pass --mem-fraction" in str(result.exception)
    fits = runner.invoke(app, ["plan", str(path), "--mem-fraction", "1.0", "-o", str(out)])
    assert fits.exit_code == 0, fits.output


def test_latency_plan_over_the_device_names_the_reserve(tmp_path: Path) -> None:
    stats = uniform_stats(4)
    real = replace(stats, device=replace(stats.device, memory_bytes=total_bytes(stats) * 2))
    path = save_stats(real, tmp_path / "real.json")
    result = runner.invoke(app, ["plan", str(path), "--activation-reserve",
                                 str(total_bytes(stats) * 2), "-o", str(tmp_path / "p.msgpack")])  # fmt: skip
    assert isinstance(result.exception, BudgetError)
    assert "(with the --activation-reserve of" in str(result.exception)
    assert "or lower --activation-reserve" in str(result.exception)


def test_latency_plan_on_the_emulated_device_is_not_refused(tmp_path: Path) -> None:
    # the emulated device is sized to the weight bytes; block alignment may exceed it
    from dataclasses import replace

    stats = uniform_stats(4, compute_ms=0.001)
    device = replace(stats.device, kind="emulated", memory_bytes=total_bytes(stats) - 1)
    path = save_stats(replace(stats, device=device), tmp_path / "emulated.json")
    result = runner.invoke(app, ["plan", str(path), "-o", str(tmp_path / "p.msgpack")])
    assert result.exit_code == 0, result.output


def test_ring_assignment_through_plan_sweep_and_explain(tmp_path: Path) -> None:
    from tests.solve.test_ring import pairs_stats, tight_budget

    stats = pairs_stats()
    source = save_stats(stats, tmp_path / "pairs.json")
    out = tmp_path / "ring.msgpack"
    budget = str(tight_budget(stats))
    result = runner.invoke(app, ["plan", str(source), "--budget", budget, "--assignment", "ring",
                                 "--strategy", "greedy", "-o", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    profile = load(out)
    assert len(profile.blocks) == 1 and "--assignment ring" in profile.meta.command
    explained = runner.invoke(app, ["inspect", str(out), "--explain", "--json"])
    assert explained.exit_code == 0, explained.output
    doc = json.loads(explained.output)
    copies = doc["explain"]["blocks"][0]["transfers"]
    assert len(copies) == len(profile.schedule) and any(c["offset"] for c in copies)
    reasons = [t["reason"] for t in doc["explain"]["tensors"] if t["placement"] == "streamed"]
    assert any("as its trap is entered" in r for r in reasons)  # an on-entry copy, explained
    swept = runner.invoke(app, ["sweep", str(out), "--fractions", "0.3,0.6", "--json"])
    assert swept.exit_code == 0, swept.output
    bad = runner.invoke(app, ["sweep", str(out), "--fractions", "0.3", "--assignment", "rng"])
    assert bad.exit_code != 0 and "unknown assignment 'rng'" in str(bad.exception or bad.output)


def test_json_output_is_strict_json(capsys) -> None:
    from flextensor_compile.cli.render import print_json

    print_json({"a": float("nan"), "b": [1.5, float("inf")], "c": (2, "x")})
    assert json.loads(capsys.readouterr().out) == {"a": None, "b": [1.5, None], "c": [2, "x"]}
