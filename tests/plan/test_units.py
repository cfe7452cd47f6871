"""Units: every quantity the planning commands accept, and the errors for what they do not."""

from __future__ import annotations

import math

import pytest

from ckptio.errors import ConfigError
from ckptio.plan.units import (
    check_range,
    format_bytes,
    format_duration,
    format_rate,
    parse_count,
    parse_duration,
    parse_int,
    parse_interval,
    parse_rate,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1024", 1024),
        ("300MiB", 300 * 2**20),
        ("300 mib", 300 * 2**20),
        ("2TB", 2e12),
        ("1.5GiB", 1.5 * 2**30),
        ("1e9", 1e9),
        ("4k", 4000),
        ("4KiB", 4096),
        ("7PB", 7e15),
    ],
)
def test_sizes_take_si_and_iec_units(text: str, expected: float) -> None:
    assert parse_size(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2TB/s", 2e12), ("300MiB/s", 300 * 2**20), ("1.2GBps", 1.2e9), ("10 GB / s", 1e10), ("5e8", 5e8)],
)
def test_rates_take_an_optional_per_second(text: str, expected: float) -> None:
    assert parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90", 90),
        ("90s", 90),
        ("5m", 300),
        ("24h", 86400),
        ("2d", 172800),
        ("250ms", 0.25),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("5 min", 300),
    ],
)
def test_durations(text: str, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8e9", 8e9),
        ("8B", 8e9),
        ("405.9B", 405.9e9),
        ("1.2T", 1.2e12),
        ("350M", 350e6),
        ("8030261248", 8030261248),
    ],
)
def test_parameter_counts_read_b_as_billion(text: str, expected: float) -> None:
    assert parse_count(text) == pytest.approx(expected)


def test_interval_in_steps_needs_a_step_time_and_a_duration_does_not() -> None:
    assert parse_interval("500", step_time_s=2.0) == (1000.0, 500)
    assert parse_interval("500steps", step_time_s=0.5) == (250.0, 500)
    assert parse_interval("30m", step_time_s=None) == (1800.0, None)
    with pytest.raises(ConfigError, match="step-time"):
        parse_interval("500", step_time_s=None)
    with pytest.raises(ConfigError):
        parse_interval("0s", step_time_s=None)


@pytest.mark.parametrize("bad", ["", "fast", "10Gb/s/s", "-5GB", "1x", "GB", "nan"])
def test_bad_sizes_and_rates_raise_config_error_naming_the_value(bad: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_rate(bad, what="--write-bandwidth")
    assert "--write-bandwidth" in str(info.value)


@pytest.mark.parametrize("bad", ["5 parsecs", "h", "-3s", "1h-", "abc"])
def test_bad_durations_raise(bad: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(bad)


def test_zero_rate_is_refused_but_zero_size_is_fine() -> None:
    assert parse_size("0") == 0
    with pytest.raises(ConfigError):
        parse_rate("0MB/s")
    with pytest.raises(ConfigError):
        parse_count("0")


def test_printing() -> None:
    assert format_bytes(112423657472) == "104.7 GiB"
    assert format_bytes(12) == "12 B"
    assert format_rate(314572800) == "314.6 MB/s"
    assert format_duration(7001.4) == "116.7 min"
    assert format_duration(0.25) == "250 ms"
    assert format_duration(30) == "30.0 s"
    assert format_duration(5 * 3600) == "5.0 h"
    assert format_duration(math.inf) == "never"


def test_whole_numbers_are_read_within_their_bounds_and_huge_ones_never_overflow() -> None:
    assert parse_int("12", what="--replicas", minimum=0, maximum=100) == 12
    assert parse_int(0, what="--replicas", minimum=0, maximum=100) == 0
    for bad, message in (("1.5", "whole number"), ("1e3", "whole number"), ("-1", ">= 0"), ("9" * 400, "<= 100")):
        with pytest.raises(ConfigError, match=message) as info:
            parse_int(bad, what="--replicas", minimum=0, maximum=100)
        assert "--replicas" in str(info.value) and len(str(info.value)) < 120  # 400 digits are not echoed


def test_a_value_outside_its_bounds_is_named_and_zero_can_be_allowed() -> None:
    assert check_range(5.0, what="--mtbf", low=1.0, high=10.0) == 5.0
    assert check_range(0.0, what="--save-cost", low=1e-6, high=10.0, zero=True) == 0.0
    for value in (1e-320, 1e308, 0.0):
        with pytest.raises(ConfigError, match="--mtbf"):
            check_range(value, what="--mtbf", low=1.0, high=10.0)


def test_an_interval_of_more_steps_than_a_float_holds_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--local-every"):
        parse_interval("9" * 400, step_time_s=1.0, what="--local-every")
