"""Parsing and printing of the quantities the planner talks in: sizes, rates, durations, counts.

Owns the one grammar every planning command accepts (``2TB/s``, ``300MiB/s``, ``90``, ``5m``, ``24h``,
``405.9B`` parameters) and the short human forms it prints. It must never guess: an unparsable or negative
value raises :class:`~ckptio.errors.ConfigError` naming what was given.

Sizes and rates take SI (``k``, ``M``, ``G``, ``T``, ``P``: powers of 1000) and IEC (``Ki``, ``Mi``, ``Gi``,
``Ti``, ``Pi``: powers of 1024) prefixes, case-insensitively, with an optional ``B``; a trailing ``/s`` (or
``ps``) marks a rate. Bits are not accepted: storage is sized in bytes and ``Gb`` is too easily a typo.
"""

from __future__ import annotations

import math
import re
from typing import TypeGuard

from ckptio.errors import ConfigError

_SI = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15, "e": 10**18}
_IEC = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50, "ei": 2**60}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgtpe]i?)?\s*b?\s*$", re.IGNORECASE)
_RATE_SUFFIX_RE = re.compile(r"\s*(/\s*s(ec)?|ps)\s*$", re.IGNORECASE)
_DURATION_UNITS = {
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}
_DURATION_PART_RE = re.compile(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)", re.IGNORECASE)
# Counts of parameters: B is a billion here (as in "8B model"), not a byte.
_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_COUNT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)
_STEPS_RE = re.compile(r"^\s*([0-9]+)\s*(steps?)?\s*$", re.IGNORECASE)


def parse_size(text: str | float | int, *, what: str = "size") -> float:
    """Bytes in ``text``: ``104.7GiB``, ``2TB``, ``300MiB``, ``1e9`` (plain numbers are bytes)."""
    if _is_number(text):
        return _non_negative(_float(text, what), what, text)
    match = _SIZE_RE.match(_text(text, what))
    if not match:
        raise ConfigError(f"cannot read {what} {quoted(text)}{_hint(text)}: use e.g. 300MiB, 1.5GB, 2TiB or a number "
                          "of bytes")
    number, prefix = float(match.group(1)), (match.group(2) or "").lower()
    scale = _IEC[prefix] if prefix.endswith("i") else _SI[prefix]
    return _non_negative(number * scale, what, text)


def parse_rate(text: str | float | int, *, what: str = "rate") -> float:
    """Bytes per second in ``text``: ``2TB/s``, ``300MiB/s``, ``1.2GBps``, or a plain number of bytes/s."""
    if _is_number(text):
        return _positive(_float(text, what), what, text)
    stripped = _RATE_SUFFIX_RE.sub("", _text(text, what))
    if not _SIZE_RE.match(stripped):
        raise ConfigError(f"cannot read {what} {quoted(text)}{_hint(text)}: use e.g. 2TB/s, 300MiB/s, 1.2GBps or a "
                          "number of bytes per second")
    return _positive(parse_size(stripped, what=what), what, text)


def parse_duration(text: str | float | int, *, what: str = "duration") -> float:
    """Seconds in ``text``: ``90`` (plain numbers: seconds), ``90s``, ``5m``, ``24h``, ``2d``, ``1h30m``."""
    if _is_number(text):
        return _non_negative(_float(text, what), what, text)
    compact = _text(text, what).strip().replace(" ", "")
    if not compact:
        raise ConfigError(f"empty {what}")
    total, pos = 0.0, 0
    for match in _DURATION_PART_RE.finditer(compact):
        if match.start() != pos:
            break
        unit = match.group(2).lower()
        if unit not in _DURATION_UNITS and unit != "":
            raise ConfigError(f"cannot read {what} {quoted(text)}: unknown unit {quoted(unit)} (use ms, s, m, h, d)")
        total += float(match.group(1)) * _DURATION_UNITS.get(unit, 1.0)
        pos = match.end()
    if pos != len(compact):
        raise ConfigError(f"cannot read {what} {quoted(text)}{_hint(text)}: use e.g. 90, 90s, 5m, 24h or 1h30m")
    return _non_negative(total, what, text)


def parse_count(text: str | float | int, *, what: str = "count") -> float:
    """A count such as a number of parameters: ``8030261248``, ``8e9``, ``8B``, ``405.9B``, ``1.2T``."""
    if _is_number(text):
        return _positive(_float(text, what), what, text)
    match = _COUNT_RE.match(_text(text, what))
    if not match:
        raise ConfigError(f"cannot read {what} {quoted(text)}{_hint(text)}: use e.g. 8e9, 8B, 405.9B or 1.2T")
    return _positive(float(match.group(1)) * _COUNT_UNITS[match.group(2).lower()], what, text)


def parse_interval(text: str, *, step_time_s: float | None, what: str = "interval") -> tuple[float, int | None]:
    """An interval given in steps (``500``, ``500steps``) or as a duration (``30m``).

    Returns ``(seconds, steps)``; ``steps`` is None for a duration. Steps need ``step_time_s``.
    """
    steps_match = _STEPS_RE.match(text)
    if steps_match:
        steps = int(steps_match.group(1))
        if steps < 1:
            raise ConfigError(f"{what} must be at least one step, got {quoted(text)}")
        if step_time_s is None:
            raise ConfigError(
                f"{what} {quoted(text)} is in steps: give --step-time too, or the interval as a duration (30m)"
            )
        return _non_negative(_float(steps, what) * step_time_s, what, text), steps
    seconds = parse_duration(text, what=what)
    if seconds <= 0:
        raise ConfigError(f"{what} must be positive, got {quoted(text)}")
    return seconds, None


def parse_int(text: str | int, *, what: str, minimum: int, maximum: int) -> int:
    """A whole number within ``[minimum, maximum]``: ``12``, ``-1``. Anything else — a fraction, a unit, ``1e3``, a
    number beyond the bounds (hundreds of digits included) — is a ConfigError naming ``what``, never an overflow
    further on."""
    try:
        value = int(text) if isinstance(text, int) and not isinstance(text, bool) else int(str(text).strip())
    except ValueError:
        raise ConfigError(f"{what} takes a whole number, got {quoted(text)}") from None
    if value < minimum:
        raise ConfigError(f"{what} must be >= {minimum:,}, got {quoted(text)}")
    if value > maximum:
        raise ConfigError(f"{what} must be <= {maximum:,}, got {quoted(text)}")
    return value


def check_range(value: float, *, what: str, low: float, high: float, unit: str = "", zero: bool = False,
                given: object = None) -> float:
    """``value`` when ``low <= value <= high`` (or exactly 0 when ``zero``), else a ConfigError naming ``what``.

    The parsers above only promise a finite number; the bounds say what a real job can mean. A value outside them
    is a typo (an extra zero, ``1e308``, a denormal ``1e-320``), and the models' arithmetic is not made to survive
    it: a rate of 1e-320 B/s makes every time infinite and every share NaN.
    """
    if (zero and value == 0) or low <= value <= high:
        return value
    shown = quoted(value if given is None else given)
    side = f"below {low:g}{unit}" if value < low else f"above {high:g}{unit}"
    zero_too = " (or 0)" if zero else ""
    raise ConfigError(f"{what} {shown} is {side}: give {low:g}{unit}{zero_too} to {high:g}{unit}, as a real job has")


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _float(value: float, what: str) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond any float
        raise ConfigError(f"{what} must be a finite number, got an integer of {len(str(value))} digits") from None


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a number or a string such as '300MiB', got {type(value).__name__}")
    return value


def _hint(text: object) -> str:
    """Why a value that looks numeric was still refused (the grammar has no sign and no inf/nan)."""
    word = str(text).strip().lower()
    if word.startswith("-"):
        return " (it must not be negative)"
    if any(w in word for w in ("nan", "inf")):
        return " (it must be a finite number)"
    return ""


def _non_negative(value: float, what: str, given: object) -> float:
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{what} must be a finite number >= 0, got {quoted(given)}")
    return value


def _positive(value: float, what: str, given: object) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{what} must be a finite number > 0, got {quoted(given)}")
    return value


def quoted(given: object) -> str:
    """``given`` as a message shows it: its repr, cut to 40 characters (a number of 400 digits is not a message)."""
    text = repr(given)
    return text if len(text) <= 40 else f"{text[:37]}..."


# ---- printing ----------------------------------------------------------------------------------------------
def format_bytes(n: float) -> str:
    """``112423657472`` → ``104.7 GiB`` (IEC, one decimal)."""
    for unit, scale in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def format_rate(bytes_per_s: float) -> str:
    """Bytes per second in SI units, as storage vendors quote them: ``2.0 TB/s``, ``314.6 MB/s``."""
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(bytes_per_s) >= scale:
            return f"{bytes_per_s / scale:,.1f} {unit}"
    return f"{bytes_per_s:,.0f} B/s"


def format_duration(seconds: float) -> str:
    """``7002`` → ``116.7 min``; ``0.25`` → ``250 ms``; ``inf`` → ``never``."""
    if math.isinf(seconds):
        return "never"
    if seconds < 1:
        return f"{seconds * 1000:,.0f} ms"
    if seconds < 120:
        return f"{seconds:,.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:,.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds / 86400:,.1f} d"
