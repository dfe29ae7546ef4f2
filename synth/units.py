"""Sizes, counts and durations as users write and read them.

``parse_size``: a byte count with an optional suffix. ``K``/``M``/``G`` (and
``KiB``/``MiB``/``GiB``) are powers of 2, as in nccl-tests' ``-b 1M``;
``KB``/``MB``/``GB`` are powers of 10. A bare number is bytes.

Every number a user gives is bounded (:func:`bounded_int`, the ``MAX_*``
values): far above any real job, so that a typo of hundreds of digits is one
error line naming the limit, never a traceback or hours of work.
"""

from __future__ import annotations

import re
from fractions import Fraction

from .errors import SynthError

MAX_COUNT = 2**24  # an axis size, a level count, a constraint value: 16,777,216
MAX_SIZE_BYTES = 2**50  # bytes per device of one reduction: 1 PiB
MAX_REPEATS = 10**6  # repetitions of one workload item per step
_MAX_DIGITS = 16  # more digits than any bound above: refused before converting


def shown_number(digits: str) -> str:
    """A number as an error message shows it: whole, or its length when long."""
    return digits if len(digits) <= 20 else f"{digits[:8]}... ({len(digits)} digits)"


def shortened(text: str, width: int = 40) -> str:
    """``text`` as an error message quotes it: whole, or its first characters
    and ``...`` when longer than ``width``."""
    return text if len(text) <= width else f"{text[:width - 10]}..."


def bounded_int(text: str, option: str, high: int, low: int = 1) -> int:
    """The whole number ``text`` (decimal digits), ``low <= n <= high``;
    SynthError naming ``option`` and the bound otherwise."""
    digits = str(text).strip()
    at = "" if option.endswith("=") else " "  # "--scale node=5" but "--global-batch 5"
    if not (digits.isascii() and digits.isdigit()):  # str.isdigit is true of superscripts, which int() refuses
        raise SynthError(f"{option}{at}{text!r}: expected a whole number >= {low}")
    if len(digits.lstrip("0")) > _MAX_DIGITS or int(digits) > high:
        raise SynthError(f"{option}{at}{shown_number(digits)}: at most {high:,}")
    value = int(digits)
    if value < low:
        raise SynthError(f"{option}{at}{value}: must be >= {low}")
    return value

_FACTORS = {
    "": 1, "B": 1,
    "K": 2**10, "KIB": 2**10, "M": 2**20, "MIB": 2**20, "G": 2**30, "GIB": 2**30,
    "KB": 10**3, "MB": 10**6, "GB": 10**9,
}


_POWERS = {"K": 3, "M": 6, "G": 9}  # the decimal prefixes, for the bits error
_POWERS2 = {"K": 10, "M": 20, "G": 30}


def parse_size(text: str, option: str = "--size") -> int:
    """Bytes from ``256MiB``, ``1M``, ``64KB``, ``4096``; SynthError otherwise
    (also for ``64Mb``: a ``b`` after K, M or G is bits)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if m and re.fullmatch(r"[KkMmGg]b", m.group(2)):  # Kb, Mb, Gb: bits, not bytes
        raise SynthError(f"{option} '{text.strip()}': {m.group(2)} is bits; give bytes, e.g. {m.group(1)}"
                         f"{m.group(2)[0].upper()}B (10^{_POWERS[m.group(2)[0].upper()]}) or "
                         f"{m.group(1)}{m.group(2)[0].upper()}iB (2^{_POWERS2[m.group(2)[0].upper()]})")
    if not m or m.group(2).upper() not in _FACTORS:
        raise SynthError(
            f"{option} '{text}': expected a positive size like 256MiB, 1M (2^20), 64KB (10^3) or 4096"
        )
    number = m.group(1)
    if len(number.partition(".")[2]) > _MAX_DIGITS:
        raise SynthError(f"{option} {shown_number(number)}: at most {_MAX_DIGITS} digits after the point")
    if len(number.split(".")[0].lstrip("0")) > _MAX_DIGITS:
        raise SynthError(f"{option} {shown_number(number)}: at most {MAX_SIZE_BYTES:,} bytes (1 PiB)")
    value = Fraction(number) * _FACTORS[m.group(2).upper()]
    if value > MAX_SIZE_BYTES:
        raise SynthError(f"{option} '{text.strip()}': at most {MAX_SIZE_BYTES:,} bytes (1 PiB)")
    if value < 1 or value.denominator != 1:
        raise SynthError(f"{option} '{text}': the size must be a whole number of bytes >= 1")
    return int(value)


_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))


def format_size(nbytes: float, unit: str | None = None, places: int | None = None, short: bool = False) -> str:
    """A byte count as people read it, the one formatter of sizes and memory
    amounts: in the largest binary unit it reaches (``64 KiB``, ``1.5 GiB``,
    ``12 B``), or in ``unit`` (``"GiB"``) when given; with ``places`` digits
    after the point (default: as few as show it, ``:g``); ``short`` writes the
    unit's first letter without a space, for narrow columns (``62.0G``).
    ``format_size(3 * 2**29) == "1.5 GiB"``,
    ``format_size(2**29, "GiB", 1) == "0.5 GiB"``,
    ``format_size(2**29, places=1, short=True) == "512.0M"``."""
    factors = dict(_UNITS)
    if unit is not None and unit not in factors:
        raise ValueError(f"unit {unit!r}: one of {', '.join(factors)}")
    name = unit or next(u for u, factor in _UNITS if nbytes >= factor or factor == 1)
    value = nbytes / factors[name]
    number = f"{value:g}" if places is None else f"{value:.{places}f}"
    return f"{number}{name[0]}" if short else f"{number} {name}"


def format_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"
