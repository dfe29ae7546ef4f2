"""How many parallelism matrices an enumeration would find, counted without
enumerating them, so that a search too large to finish (18 axes of size 2 on
18 levels: 18! placements) is refused at once with its size named.

A matrix assigns each axis a divisor of each level's count, rows multiplying
to the axis sizes and columns to the level counts. Per prime ``p`` the
exponents of ``p`` form a table of non-negative integers whose row sums are
the axes' exponents and whose column sums are the levels'; the primes are
independent, so the number of matrices is the product over primes of the
number of such tables. Tables are counted level by level; the rows are
interchangeable for counting, so the state is the sorted tuple of the rows'
remaining exponents, which keeps the state space small.
"""

from __future__ import annotations

from typing import Sequence


def _exponent(n: int, p: int) -> int:
    e = 0
    while n % p == 0:
        n //= p
        e += 1
    return e


def _primes(n: int) -> list[int]:
    out, d = [], 2
    while d * d <= n:
        if n % d == 0:
            out.append(d)
            while n % d == 0:
                n //= d
        d += 1
    return out + ([n] if n > 1 else [])


def _splits(total: int, caps: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every way to write ``total`` as ``x_0 + x_1 + ...`` with ``0 <= x_i <= caps[i]``."""
    out: list[tuple[int, ...]] = []
    room = [sum(caps[i:]) for i in range(len(caps) + 1)]

    def walk(i: int, left: int, taken: tuple[int, ...]) -> None:
        if i == len(caps):
            if left == 0:
                out.append(taken)
            return
        for x in range(max(0, left - room[i + 1]), min(caps[i], left) + 1):
            walk(i + 1, left - x, (*taken, x))

    walk(0, total, ())
    return out


def _tables(rows: tuple[int, ...], columns: tuple[int, ...], cap: int) -> int:
    """Tables of non-negative integers with these row and column sums (equal
    totals), saturated at ``cap + 1``."""
    seen: dict[tuple[int, tuple[int, ...]], int] = {}  # this call's memo: lives and dies with the call

    def count(level: int, remaining: tuple[int, ...]) -> int:
        key = (level, remaining)
        if key not in seen:
            seen[key] = _count(level, remaining)
        return seen[key]

    def _count(level: int, remaining: tuple[int, ...]) -> int:
        if level == len(columns):
            return 1 if not any(remaining) else 0
        total = 0
        for split in _splits(columns[level], remaining):
            total += count(level + 1, tuple(sorted(r - x for r, x in zip(remaining, split))))
            if total > cap:
                return cap + 1
        return total

    return count(0, tuple(sorted(rows)))


def matrix_count(counts: Sequence[int], sizes: Sequence[int], cap: int) -> int:
    """The number of matrices of axes ``sizes`` on levels ``counts`` (no
    constraints), or ``cap + 1`` when there are more than ``cap``; 0 when
    the sizes do not multiply to the devices."""
    devices, product = 1, 1
    for c in counts:
        devices *= c
    for s in sizes:
        product *= s
    if devices != product:
        return 0
    total = 1
    for p in _primes(devices):
        total *= _tables(tuple(_exponent(s, p) for s in sizes), tuple(_exponent(c, p) for c in counts), cap)
        if total > cap:
            return cap + 1
    return total
