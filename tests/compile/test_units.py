"""Sizes and rates on the command line: what parses, and one-line errors for what does not."""

from __future__ import annotations

import pytest

from flextensor_compile.units import (
    count_of,
    format_bytes,
    format_fraction,
    format_ms,
    parse_rate,
    parse_size,
)
from flextensor_runtime.errors import ConfigError


def test_sizes_and_rates_parse() -> None:
    assert parse_size("6GiB") == 6 * 2**30
    assert parse_size("6 gib") == 6 * 2**30
    assert parse_size("1.5e9") == 1_500_000_000
    assert parse_size("1.5KiB") == 1536 and parse_size("1.1KiB") == 1126  # a unit: rounded down
    assert parse_rate("24GB/s") == 24e9


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0.5", r"--budget '0\.5' is less than one byte: .*; for a fraction of device memory use "
                r"--mem-fraction"),
        ("garbage", r"--budget 'garbage' is not a size"),
        ("0", r"--budget '0' is out of range"),
        ("1e400", r"--budget '1e400' is out of range"),
        ("1.5", r"--budget '1\.5' is not a whole number of bytes; .* e\.g\. 1\.5GiB"),
    ],
)  # fmt: skip
def test_bad_budgets_say_what_to_write(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_size(text, "--budget")


def test_petabyte_units_parse_and_the_limit_is_named() -> None:
    import pytest

    from flextensor_compile.units import parse_size
    from flextensor_runtime.errors import ConfigError

    assert parse_size("1PiB") == 2**50
    assert parse_size("0.5PB") == 5 * 10**14
    with pytest.raises(ConfigError, match="out of range; give a positive size up to 1 PiB"):
        parse_size("2PiB")


def test_counts_agree_with_their_nouns() -> None:
    assert [count_of(n, "block") for n in (0, 1, 2)] == ["0 blocks", "1 block", "2 blocks"]
    assert [count_of(n, "copy") for n in (1, 65)] == ["1 copy", "65 copies"]


def test_sizes_near_a_unit_boundary_print_in_full() -> None:
    """Three significant figures of 1000-1023 would be "1.02e+03"."""
    assert format_bytes(1022 * 1024) == "1022 KiB"
    assert format_bytes(1000 * 2**20) == "1000 MiB"
    assert format_bytes(1023.9 * 2**30) == "1024 GiB"
    assert format_bytes(1536) == "1.5 KiB" and format_bytes(999) == "999 B"
    assert format_bytes(2**50) == "1 PiB" and format_bytes(1000 * 2**40) == "1000 TiB"
    assert all("e+" not in format_bytes(n) for n in range(0, 2**51, 2**51 // 9973))


def test_times_and_fractions_print_without_noise() -> None:
    assert format_ms(1.38969) == "1.390" and format_ms(6.89408e17) == "6.894e+17"
    assert [format_fraction(f) for f in (0.2, 0.125, 0.12, 1.0)] == ["0.20", "0.125", "0.12",
                                                                     "1.00"]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0GB/s", r"--bandwidth '0GB/s' is out of range; give a positive rate up to 1 PiB/s, "
                  r"e\.g\. 24GB/s"),
        ("2PB/s", r"--bandwidth '2PB/s' is out of range; give a positive rate"),
        ("fast", r"--bandwidth 'fast' is not a rate; write bytes per second or a number with a "
                 r"unit, e\.g\. 24GB/s"),
        ("0.5", r"--bandwidth '0\.5' is less than one byte per second: rates are bytes per second"),
        ("1.5", r"--bandwidth '1\.5' is not a whole number of bytes per second; .* e\.g\. 1\.5GB/s"),
    ],
)  # fmt: skip
def test_bad_rates_speak_of_rates(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as exc:
        parse_rate(text, "--bandwidth")
    assert "size" not in str(exc.value) and "GiB," not in str(exc.value)
