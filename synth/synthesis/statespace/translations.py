"""Digitwise translations of devices, and what they do to contributor masks.

A synthesis index is a mixed-radix number over the level sizes. The
translation by ``t`` (a digit tuple) maps ``d`` to ``d + t``, added digit by
digit modulo each level's size (no carries); these form an abelian group that
acts on devices and, bit by bit, on contributor masks. On a mask the
translation of one digit is a rotation inside blocks of ``size x stride``
bits, a handful of big-integer operations whatever ``k`` is.

Invariant: ``mask(mask(m, t), inverse(t)) == m``, and the bit count of a mask
is kept. Example, ``sizes = (2, 2)`` (strides ``(2, 1)``): device 3 has digits
``(1, 1)``; translating the mask ``0b0001`` (device 0) by ``(0, 1)`` gives
``0b0010`` (device 1), by ``(1, 1)`` gives ``0b1000`` (device 3), and
translating ``0b0011`` by ``(0, 1)`` gives ``0b0011`` (the pair {0, 1} is
invariant along the last level).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..semantics import DeviceState
from .tuning import DEFAULT_TUNING


def _repeat(pattern: int, width: int, times: int) -> int:
    """``pattern`` (``width`` bits) repeated ``times`` times, lowest copy first."""
    out, shift, copies, copies_width = 0, 0, pattern, width
    while times:
        if times & 1:
            out |= copies << shift
            shift += copies_width
        copies |= copies << copies_width
        copies_width *= 2
        times >>= 1
    return out


class Translations:
    """Digitwise translations of synthesis indices and the bit permutations they
    induce on contributor masks.

    A synthesis index is a mixed-radix number over the level sizes. The
    translation by ``t`` (a digit tuple) maps ``d`` to ``d + t``, added digit by
    digit modulo each level's size (no carries); these form an abelian group that
    acts on devices and, bit by bit, on contributor masks. On a mask the
    translation of one digit is a rotation inside blocks of ``size x stride``
    bits, a handful of big-integer operations whatever ``k`` is."""

    def __init__(self, sizes: Sequence[int], moved_upto: int = DEFAULT_TUNING.moved_masks_upto) -> None:
        self.sizes = tuple(sizes)
        self._moved_upto = moved_upto  # entries the memo of translated masks keeps before it starts over
        self.k = math.prod(self.sizes)
        self.full = (1 << self.k) - 1
        self.strides = tuple(math.prod(self.sizes[l + 1:]) for l in range(len(self.sizes)))
        self._patterns: dict[tuple[int, int], tuple[int, int]] = {}
        self._moved: dict[tuple[int, tuple[int, ...]], int] = {}  # (mask, t) -> translated mask, see state

    def digits(self, d: int) -> tuple[int, ...]:
        return tuple((d // w) % s for s, w in zip(self.sizes, self.strides))

    def index(self, digits: Sequence[int]) -> int:
        return sum(x * w for x, w in zip(digits, self.strides))

    def inverse(self, t: Sequence[int]) -> tuple[int, ...]:
        return tuple(-x % s for x, s in zip(t, self.sizes))

    def mask(self, mask: int, t: Sequence[int]) -> int:
        """The mask ``{e + t : e in mask}``."""
        if mask == self.full:
            return mask
        for level, x in enumerate(t):
            if x and mask:
                mask = self._rotate(mask, level, x)
        return mask

    def state(self, s: DeviceState, t: tuple[int, ...]) -> DeviceState:
        """A device state with every contributor mask translated by ``t``
        (chunks stay; the runs stay canonical since the map is injective).
        The masks' translations are memoised per (mask, ``t``): the same
        contributor sets meet the same offsets in many groups (five levels
        of 4: 12,927 distinct of 158,148), and hashing a mask is cheaper
        than rotating it level by level."""
        if not any(t):
            return s
        moved = self._moved
        if len(moved) > self._moved_upto:
            moved.clear()
        out = []
        for m in s[1]:
            key = (m, t)
            found = moved.get(key)
            if found is None:
                found = moved[key] = self.mask(m, t)
            out.append(found)
        return (s[0], tuple(out))

    def saturate(self, mask: int, levels: Sequence[int]) -> int:
        """The union of the mask's translations by every value of the digits of
        ``levels`` (``ceil(log2 size)`` rotations per level)."""
        for level in levels:
            covered = 1
            while covered < self.sizes[level] and mask:
                mask |= self._rotate(mask, level, covered)
                covered *= 2
        return mask

    def invariant(self, mask: int, levels: Sequence[int]) -> bool:
        """Whether the mask is its own translation by every value of the digits
        of ``levels`` (a shift by one generates them all)."""
        if mask == self.full:  # every device: a common mask, and no rotation needed to see it
            return True
        return all(self._rotate(mask, level, 1) == mask for level in levels if mask and self.sizes[level] > 1)

    def _rotate(self, mask: int, level: int, x: int) -> int:
        size, stride = self.sizes[level], self.strides[level]
        block, up = size * stride, x * stride
        if block == self.k:
            return ((mask << up) | (mask >> (block - up))) & self.full
        key = (level, x)
        if key not in self._patterns:
            times = self.k // block
            self._patterns[key] = (_repeat((1 << (block - up)) - 1, block, times),
                                   _repeat((1 << up) - 1, block, times))
        low, top = self._patterns[key]
        return ((mask & low) << up) | ((mask >> (block - up)) & top)
