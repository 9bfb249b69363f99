"""`ftc inspect`: the stable --json document and the human view of a profile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from profiles.golden import format_golden

GOLDEN = Path(__file__).parents[2] / "profiles" / "format_golden.msgpack"
REQUIRED = {
    "format": str, "version": int, "device": dict, "blocks": list, "traps": list, "predicted": dict,
}  # fmt: skip


def _ftc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flextensor_compile", *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_json_document_has_the_stable_fields() -> None:
    r = _ftc("inspect", "--json", str(GOLDEN))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    for key, kind in REQUIRED.items():
        assert isinstance(doc[key], kind), key
    assert doc["format"] == "flextensor-profile" and doc["version"] == 2
    assert set(doc["device"]) >= {"name", "memory_bytes", "h2d_bytes_per_s"}
    assert doc["budget_bytes"] == 4 << 20
    assert doc["blocks"] == [{"id": b.id, "bytes": b.bytes} for b in format_golden().blocks]
    assert set(doc["predicted"]) >= {"compute_ms", "makespan_ms", "stall_ms", "peak_bytes"}
    trap_keys = {"name", "order", "kind", "compute_ms", "resident_bytes", "streamed_bytes",
                 "block", "prefetch_at"}  # fmt: skip
    assert all(set(t) >= trap_keys for t in doc["traps"])


def test_trap_rows_follow_the_schedule() -> None:
    doc = json.loads(_ftc("inspect", "--json", str(GOLDEN)).stdout)
    rows = {t["name"]: t for t in doc["traps"]}
    # layers.0 (order 1) is prefetched cyclically during the gap trap (order 5) of the previous
    # iteration; layers.1 (order 2) during embed (order 0) of the same iteration
    assert (rows["layers.0"]["order"], rows["layers.0"]["prefetch_at"]) == (1, 5)
    assert rows["layers.0"]["prefetch_at"] >= rows["layers.0"]["order"]
    assert (rows["layers.1"]["block"], rows["layers.1"]["prefetch_at"]) == (1, 0)
    assert rows["embed"]["block"] is None and rows["embed"]["prefetch_at"] is None
    assert rows["embed"]["resident_bytes"] == 1000 * 64 * 4
    assert rows["lm_head"]["resident_bytes"] == 0  # tied to embed: counted once, there
    assert rows["layers.3"]["streamed_bytes"] == (3 + 4) * 64 * 64 * 4  # disk bytes included
    assert rows["layers.3"]["disk_bytes"] == 4 * 64 * 64 * 4


def test_human_view_shows_summary_and_traps() -> None:
    r = _ftc("inspect", str(GOLDEN))
    assert r.returncode == 0, r.stderr
    for text in ("example-gpu", "budget", "layers.3", "gap:5", "predicted"):
        assert text in r.stdout


def test_piped_human_view_keeps_every_column_and_name() -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    profile = Path(__file__).parents[2] / "profiles" / "tiny_transformer.f60.msgpack"
    r = subprocess.run([sys.executable, "-m", "flextensor_compile", "inspect", str(profile)],
                       capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("#"))
    assert header.split()[-1] == "stall"  # was cropped to "sta" at 80 columns
    last = next(line for line in lines if "gap:after:blocks.5" in line)
    assert last.split()[1] == "gap:after:blocks.5" and len(last.split()) == 9
    assert "-0.0%" not in r.stdout


def test_stats_file_given_to_inspect_is_named_as_json() -> None:
    stats = Path(__file__).parents[2] / "profiles" / "tiny_transformer.stats.json"
    r = _ftc("inspect", str(stats))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "is a JSON text file (a stats file?), not a profile" in r.stderr
    assert "ftc plan STATS" in r.stderr and r.stdout == ""


def test_debug_flag_after_the_command_shows_the_traceback(tmp_path: Path) -> None:
    r = _ftc("inspect", str(tmp_path / "missing.msgpack"), "--debug")
    assert r.returncode == 1, r.stderr
    assert "Traceback" in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("ftc: invalid profile: ")


def test_json_lists_every_transfer_of_a_trap(tmp_path: Path) -> None:
    from flextensor_runtime.profile import save
    from tests.runtime.models import block_names, tiny_lm
    from tests.runtime.split_plans import on_entry, split_profile

    model = tiny_lm()
    order = block_names(model)
    profile = split_profile(model, order, on_entry(model, (1, 2, 3, 4), order),
                            "allocation_block_transfer")  # fmt: skip
    path = save(profile, tmp_path / "split.msgpack")
    doc = json.loads(_ftc("inspect", "--json", str(path)).stdout)
    for row in doc["traps"]:
        own = profile.transfers_for(row["order"])
        assert row["transfers"] == [
            {"block": t.block, "offset": t.offset, "bytes": t.bytes, "issue_at": t.issue_at,
             "release_after": t.release_after} for t in own
        ]  # fmt: skip
        if own:  # the summary fields come from the first copy issued
            assert (row["block"], row["prefetch_at"]) == (own[0].block, own[0].issue_at)
    blocks_2 = doc["traps"][2]
    assert [t["issue_at"] for t in blocks_2["transfers"]] == [1, 2]  # prefetch, then on entry
    human = _ftc("inspect", str(path)).stdout
    row = next(line for line in human.splitlines() if "blocks.1" in line)
    assert f"{blocks_2['block']}×2" in row.split()


def test_golden_trap_transfers_match_the_schedule() -> None:
    doc = json.loads(_ftc("inspect", "--json", str(GOLDEN)).stdout)
    golden = format_golden()
    listed = sorted((t["order"], u["block"], u["offset"], u["bytes"], u["issue_at"],
                     u["release_after"]) for t in doc["traps"] for u in t["transfers"])  # fmt: skip
    assert listed == sorted(
        (t.trap, t.block, t.offset, t.bytes, t.issue_at, t.release_after) for t in golden.schedule
    )
