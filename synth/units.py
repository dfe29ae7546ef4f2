"""Sizes and durations as users write and read them.

``parse_size``: a byte count with an optional suffix. ``K``/``M``/``G`` (and
``KiB``/``MiB``/``GiB``) are powers of 2, as in nccl-tests' ``-b 1M``;
``KB``/``MB``/``GB`` are powers of 10. A bare number is bytes.
"""

from __future__ import annotations

import re

from .errors import SynthError

_FACTORS = {
    "": 1, "B": 1,
    "K": 2**10, "KIB": 2**10, "M": 2**20, "MIB": 2**20, "G": 2**30, "GIB": 2**30,
    "KB": 10**3, "MB": 10**6, "GB": 10**9,
}


def parse_size(text: str, option: str = "--size") -> int:
    """Bytes from ``256MiB``, ``1M``, ``64KB``, ``4096``; SynthError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _FACTORS:
        raise SynthError(
            f"{option} '{text}': expected a positive size like 256MiB, 1M (2^20), 64KB (10^3) or 4096"
        )
    value = float(m.group(1)) * _FACTORS[m.group(2).upper()]
    if value < 1 or value != int(value):
        raise SynthError(f"{option} '{text}': the size must be a whole number of bytes >= 1")
    return int(value)


def format_size(nbytes: float) -> str:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= factor:
            return f"{nbytes / factor:g} {unit}"
    return f"{nbytes:g} B"


def format_seconds(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds * 1e6:.1f} us"
