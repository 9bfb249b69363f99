"""What `ftc` prints for a user's own text (paths given on the command line) and at the edges of
the numbers it reports: control characters shown as escapes, suggestions that hold when typed."""

from __future__ import annotations

from pathlib import Path

import pytest

from flextensor_compile.cli.app import app
from flextensor_compile.cli.errors import run_guarded
from flextensor_runtime.profile import load

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
