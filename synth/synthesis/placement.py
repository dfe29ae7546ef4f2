"""Placements of parallelism axes onto a hierarchy: parallelism matrices.

A placement is an integer matrix ``X`` (axes x levels) whose column products are
the level counts and whose row products are the axis sizes: ``X[a][l]`` is how
many ways axis ``a`` is split at level ``l``.

Digit-order convention (used by the mesh, the groups and the docs):

* a device id is the mixed-radix number of its level coordinates, the outermost
  level most significant;
* inside level ``l`` the level coordinate is the mixed-radix number of the axes'
  digits ``d[a][l] < X[a][l]`` in declared axis order, the LAST axis fastest;
* an axis rank is the mixed-radix number of that axis' digits over the levels,
  the outermost level most significant.

Equivalently: ``arange(N).reshape([X[a][l] for l in levels for a in axes])``
indexes devices by digits; transposing to axis-major order gives the mesh.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Sequence

import numpy as np

from ..caches import memoised
from ..errors import SynthError
from ..interrupts import solver_check, z3_interrupts
from .counting import matrix_count
from ..topology import Topology
from ..units import MAX_COUNT, bounded_int, shortened

Matrix = tuple[tuple[int, ...], ...]
MATRIX_ROWS = " / "  # between the rows (axes) of a matrix in the one notation: dp:4,1 / mp:1,16


@dataclass(frozen=True)
class Axis:
    name: str
    size: int


def parse_axes(spec: str) -> tuple[Axis, ...]:
    """Parse ``dp=16,mp=8`` into axes, in declared order."""
    axes: list[Axis] = []
    for item in (s.strip() for s in spec.split(",")):
        m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(-?\d+)", item)
        if not m:
            raise SynthError(f"--axes '{item}': expected NAME=SIZE, e.g. --axes dp=16,mp=8")
        name = m.group(1)
        if m.group(2).startswith("-") or not m.group(2).lstrip("0"):
            raise SynthError(f"--axes {name}={m.group(2)}: an axis size must be >= 1")
        size = bounded_int(m.group(2), f"--axes {name}=", MAX_COUNT)
        if any(a.name == name for a in axes):
            raise SynthError(f"--axes: axis '{name}' is declared twice")
        axes.append(Axis(name, size))
    return tuple(axes)


# ---------------------------------------------------------------- axes without sizes


@dataclass(frozen=True)
class AxisRange:
    """An axis whose size is fixed (``low == high``) or to be chosen within
    ``[low, high]`` (``high`` None: no upper bound)."""

    name: str
    low: int = 1
    high: int | None = None

    @property
    def fixed(self) -> int | None:
        return self.low if self.high == self.low else None

    def allows(self, size: int) -> bool:
        return self.low <= size and (self.high is None or size <= self.high)

    def __str__(self) -> str:
        if self.fixed is not None:
            return f"{self.name}={self.fixed}"
        if self.high is None:
            return f"{self.name}>={self.low}" if self.low > 1 else self.name
        return f"{self.low}<={self.name}<={self.high}" if self.low > 1 else f"{self.name}<={self.high}"


_RANGE = re.compile(r"(?:(\d+)\s*<=\s*)?([A-Za-z_][A-Za-z0-9_]*)\s*(?:(<=|>=|=)\s*(-?\d+))?")


def parse_axis_ranges(spec: str) -> tuple[AxisRange, ...]:
    """Parse ``dp,mp``, ``tp<=8,dp,pp``, ``2<=tp<=8`` or ``tp=8,dp`` (sizes given
    or to be chosen), in declared order."""
    out: list[AxisRange] = []
    for item in (s.strip() for s in spec.split(",")):
        m = _RANGE.fullmatch(item)
        if not m:
            raise SynthError(f"--axes '{item}': expected NAME, NAME=SIZE, NAME<=MAX, NAME>=MIN or MIN<=NAME<=MAX, "
                             "e.g. --axes 'tp<=8,dp,pp'")
        low_text, name, op, value_text = m.groups()
        if any(a.name == name for a in out):
            raise SynthError(f"--axes: axis '{name}' is declared twice")
        shown = shortened(item)
        low, high = bounded_int(low_text or "1", f"--axes '{shown}': the bound", MAX_COUNT, low=0), None
        if op is not None:
            if value_text.startswith("-") or not value_text.lstrip("0"):
                raise SynthError(f"--axes '{item}': an axis size must be >= 1")
            value = bounded_int(value_text, f"--axes '{shown}': the size", MAX_COUNT)
            if value < 1:
                raise SynthError(f"--axes '{item}': an axis size must be >= 1")
            if op == "=" and low_text is None:
                low = high = value
            elif op == "<=":
                high = value
            elif op == ">=" and low_text is None:
                low = value
            else:
                raise SynthError(f"--axes '{item}': give a range as MIN<=NAME<=MAX")
        if low < 1:
            raise SynthError(f"--axes '{item}': an axis size must be >= 1")
        if high is not None and high < low:
            raise SynthError(f"--axes '{item}': the lower bound {low} is above the upper bound {high}")
        out.append(AxisRange(name, low, high))
    return tuple(out)


def axes_have_sizes(spec: str) -> bool:
    """Whether ``--axes`` text gives every size (``dp=16,mp=8``), as opposed to
    naming an axis without a size (``dp,mp``) or with bounds (``tp<=8``)."""
    return not any(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", item.strip()) or "<" in item or ">" in item
                   for item in spec.split(","))


MAX_ASSIGNMENTS = 1000  # size assignments solved for axes without sizes (each is a whole placement search)


def size_assignments(ranges: Sequence[AxisRange], devices: int) -> list[tuple[Axis, ...]]:
    """Every assignment of sizes within the ranges whose product is ``devices``
    (sizes in lexicographic order); SynthError naming ``--axes`` if none, or
    if there are more than :data:`MAX_ASSIGNMENTS` (found out early: the
    enumeration stops there)."""
    out: list[tuple[int, ...]] = []

    def extend(prefix: tuple[int, ...], remaining: int) -> None:
        a = len(prefix)
        if len(out) > MAX_ASSIGNMENTS:
            return
        if a == len(ranges) - 1:
            if ranges[a].allows(remaining):
                out.append(prefix + (remaining,))
            return
        for d in _divisors(remaining):
            if ranges[a].allows(d):
                extend(prefix + (d,), remaining // d)

    if ranges:
        extend((), devices)
    if len(out) > MAX_ASSIGNMENTS:
        given = ",".join(str(r) for r in ranges)
        raise SynthError(f"--axes '{given[:80]}{'...' if len(given) > 80 else ''}': more than "
                         f"{MAX_ASSIGNMENTS:,} assignments of sizes to {len(ranges)} axes over {devices} devices; "
                         "give sizes or bounds (e.g. tp<=8) to fewer axes")
    if not out:
        given = ",".join(str(r) for r in ranges)
        raise SynthError(f"--axes '{given}': no sizes within the bounds multiply to the {devices} devices; "
                         "relax a bound (or use --scale)")
    return [tuple(Axis(r.name, s) for r, s in zip(ranges, sizes)) for sizes in out]


def check_axes_fit(axes: Sequence[Axis], topology: Topology) -> None:
    product = math.prod(a.size for a in axes)
    if product != topology.num_devices:
        sizes = " x ".join(str(a.size) for a in axes)
        raise SynthError(
            f"--axes: the axis sizes multiply to {product} ({sizes}) but topology "
            f"'{topology.name}' has {topology.num_devices} devices "
            f"({' x '.join(map(str, topology.counts))}); make them equal (or use --scale)"
        )


def parse_reduce(spec: str | None, axes: Sequence[Axis]) -> tuple[str, ...]:
    """Reduction axes, in declared axis order; default: the first axis."""
    if spec is None:
        return (axes[0].name,)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise SynthError(f"--reduce '{spec}': name at least one axis, e.g. --reduce {axes[0].name}")
    declared = [a.name for a in axes]
    for name in names:
        if name not in declared:
            raise SynthError(
                f"--reduce: unknown axis '{name}'; declared axes are {', '.join(declared)}"
            )
    if len(set(names)) != len(names):
        raise SynthError(f"--reduce: an axis is named twice in '{spec}'")
    return tuple(a for a in declared if a in names)


# ---------------------------------------------------------------- constraints


@dataclass(frozen=True)
class Constraint:
    """``X[axis][level] op value``, e.g. ``mp@node=1`` (mp stays inside a node)."""

    axis: str
    level: str
    op: str
    value: int

    def holds(self, value: int) -> bool:
        return {"=": value == self.value, "<=": value <= self.value, ">=": value >= self.value}[self.op]

    def __str__(self) -> str:
        return f"{self.axis}@{self.level}{self.op}{self.value}"


def parse_constraint(spec: str, axes: Sequence[Axis], topology: Topology) -> Constraint:
    m = re.fullmatch(r"\s*(\w+)\s*@\s*(\w+)\s*(<=|>=|==|=)\s*(\d+)\s*", spec)
    if not m:
        raise SynthError(
            f"--constrain '{spec}': expected AXIS@LEVEL=N, AXIS@LEVEL>=N or AXIS@LEVEL<=N, "
            "e.g. --constrain mp@node=1"
        )
    axis, level, op = m.group(1), m.group(2), m.group(3)
    value = bounded_int(m.group(4), f"--constrain {axis}@{level}{op}", MAX_COUNT, low=0)
    if axis not in [a.name for a in axes]:
        raise SynthError(
            f"--constrain '{spec}': unknown axis '{axis}'; declared axes are "
            f"{', '.join(a.name for a in axes)}"
        )
    if level not in topology.level_names:
        raise SynthError(
            f"--constrain '{spec}': unknown level '{level}'; topology '{topology.name}' has "
            f"levels {', '.join(topology.level_names)}"
        )
    return Constraint(axis, level, "=" if op == "==" else op, value)


# ---------------------------------------------------------------- enumeration


def _prime_exponents(n: int) -> dict[int, int]:
    out: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
        p += 1
    if n > 1:
        out[n] = out.get(n, 0) + 1
    return out


@memoised(maxsize=4096)  # the enumeration asks for the same few numbers at every node of its recursion
def _divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


def _index_constraints(
    constraints: Iterable[Constraint], axis_names: Sequence[str], level_names: Sequence[str]
) -> list[tuple[int, int, Constraint]]:
    return [(list(axis_names).index(c.axis), list(level_names).index(c.level), c) for c in constraints]


# the most placements enumerated: z3 finds them one check at a time and slows as the blocking clauses grow
# (7 axes of size 2 on 7 levels, 5,040 placements, take minutes on one core); a larger space is searched by
# pinning axes to levels (--constrain), not by waiting for it
MAX_PLACEMENTS = 20_000


def _too_many_placements(counts: Sequence[int], sizes: Sequence[int]) -> str:
    return (f"--axes: more than {MAX_PLACEMENTS:,} placements of {len(sizes)} axes on {len(counts)} levels; "
            "pin axes to levels with --constrain (e.g. dp@node=2) or use fewer axes")


def enumerate_matrices_z3(
    counts: Sequence[int],
    sizes: Sequence[int],
    constraints: Iterable[Constraint] = (),
    axis_names: Sequence[str] = (),
    level_names: Sequence[str] = (),
) -> list[Matrix]:
    """The test reference of :func:`enumerate_matrices` (the package does not
    call it): the same set, enumerated independently with z3.

    Each entry is encoded by its prime exponents, which turns the column and row
    product equations into linear sums; models are enumerated with blocking
    clauses. The result is sorted (lexicographically by rows), so it does not
    depend on the solver's order.
    """
    import z3

    if math.prod(counts) != math.prod(sizes):
        return []
    too_many = _too_many_placements(counts, sizes)
    constraints = tuple(constraints)
    if not constraints and matrix_count(counts, sizes, MAX_PLACEMENTS) > MAX_PLACEMENTS:
        raise SynthError(too_many)  # counted without enumerating: at once, however large
    primes = sorted(set().union(*(_prime_exponents(n).keys() for n in [*counts, *sizes])))
    solver = z3.Solver()
    x = [[z3.Int(f"x_{a}_{l}") for l in range(len(counts))] for a in range(len(sizes))]
    exp = {
        (a, l, p): z3.Int(f"e_{a}_{l}_{p}")
        for a in range(len(sizes))
        for l in range(len(counts))
        for p in primes
    }
    for l, h in enumerate(counts):
        vh = _prime_exponents(h)
        for p in primes:
            solver.add(z3.Sum([exp[a, l, p] for a in range(len(sizes))]) == vh.get(p, 0))
        for a in range(len(sizes)):
            for p in primes:
                solver.add(exp[a, l, p] >= 0, exp[a, l, p] <= vh.get(p, 0))
            choices = []
            for d in _divisors(h):
                vd = _prime_exponents(d)
                choices.append(z3.And(x[a][l] == d, *[exp[a, l, p] == vd.get(p, 0) for p in primes]))
            solver.add(z3.Or(choices))
    for a, size in enumerate(sizes):
        vs = _prime_exponents(size)
        for p in primes:
            solver.add(z3.Sum([exp[a, l, p] for l in range(len(counts))]) == vs.get(p, 0))
    for a, l, c in _index_constraints(constraints, axis_names, level_names):
        solver.add({"=": x[a][l] == c.value, "<=": x[a][l] <= c.value, ">=": x[a][l] >= c.value}[c.op])
    found: list[Matrix] = []
    flat = [v for row in x for v in row]
    with z3_interrupts():  # unknown (an interrupt) is not the end: solver_check raises
        while solver_check(solver) == z3.sat:
            if len(found) == MAX_PLACEMENTS:  # constrained, yet still more than the cap
                raise SynthError(too_many)
            model = solver.model()
            values = [model.eval(v).as_long() for v in flat]
            found.append(tuple(tuple(values[a * len(counts) : (a + 1) * len(counts)]) for a in range(len(sizes))))
            solver.add(z3.Or([v != val for v, val in zip(flat, values)]))
    return sorted(found)


def enumerate_matrices(
    counts: Sequence[int],
    sizes: Sequence[int],
    constraints: Iterable[Constraint] = (),
    axis_names: Sequence[str] = (),
    level_names: Sequence[str] = (),
) -> list[Matrix]:
    """Every parallelism matrix satisfying the constraints: each level's count
    split over the axes (a column whose entries multiply to the count), level
    by level, each axis's entries multiplying to its size. For counts ``(2, 4)``
    and sizes ``(4, 2)``: ``[((1, 4), (2, 1)), ((2, 2), (1, 2))]``. By plain
    recursive factorisation (hundreds of times faster than the z3 reference,
    :func:`enumerate_matrices_z3`, which the tests show gives the same set);
    sorted lexicographically by rows. More than :data:`MAX_PLACEMENTS` is a
    SynthError: counted first without enumerating when unconstrained, else
    found while enumerating."""
    constraints = tuple(constraints)
    if not constraints and matrix_count(counts, sizes, MAX_PLACEMENTS) > MAX_PLACEMENTS:
        raise SynthError(_too_many_placements(counts, sizes))  # at once, however large the space
    indexed = _index_constraints(constraints, axis_names, level_names)
    out: list[Matrix] = []

    def splits(n: int, remaining: list[int], a: int):
        # ordered factorisations of n over axes a.., factor of axis a dividing remaining[a]
        if a == len(remaining):
            if n == 1:
                yield ()
            return
        for d in _divisors(n):
            if remaining[a] % d == 0:
                for rest in splits(n // d, remaining, a + 1):
                    yield (d, *rest)

    def levels(l: int, remaining: list[int], columns: list[tuple[int, ...]]):
        if l == len(counts):
            if all(r == 1 for r in remaining):
                matrix = tuple(tuple(col[a] for col in columns) for a in range(len(sizes)))
                if all(c.holds(matrix[a][lv]) for a, lv, c in indexed):
                    if len(out) == MAX_PLACEMENTS:  # constrained, yet still more than the cap
                        raise SynthError(_too_many_placements(counts, sizes))
                    out.append(matrix)
            return
        for col in splits(counts[l], remaining, 0):
            levels(l + 1, [r // c for r, c in zip(remaining, col)], columns + [col])

    if math.prod(counts) == math.prod(sizes):
        levels(0, list(sizes), [])
    return sorted(out)


# ---------------------------------------------------------------- placement


# axes x levels of a placement: each is one dimension of its digit array, and numpy arrays have at most 64
MAX_DIGIT_DIMS = 64


@dataclass(frozen=True)
class Placement:
    """A parallelism matrix on a topology, with the mesh and groups it implies."""

    topology: Topology
    axes: tuple[Axis, ...]
    matrix: Matrix

    def __post_init__(self) -> None:
        levels = len(self.topology.levels)
        if len(self.matrix) != len(self.axes) or any(len(row) != levels for row in self.matrix):
            raise SynthError(f"the matrix must have one row per axis ({len(self.axes)}) of one entry per level "
                             f"({levels})")
        if len(self.axes) * levels > MAX_DIGIT_DIMS:
            raise SynthError(f"{len(self.axes)} axes on {levels} levels: at most {MAX_DIGIT_DIMS} axes x levels "
                             "(one array dimension each); drop axes of size 1")
        for l, h in enumerate(self.topology.counts):
            if math.prod(row[l] for row in self.matrix) != h:
                raise SynthError(
                    f"matrix column '{self.topology.levels[l].name}' multiplies to "
                    f"{math.prod(row[l] for row in self.matrix)}, expected the level count {h}"
                )
        for a, axis in enumerate(self.axes):
            if math.prod(self.matrix[a]) != axis.size:
                raise SynthError(
                    f"matrix row '{axis.name}' multiplies to {math.prod(self.matrix[a])}, "
                    f"expected the axis size {axis.size}"
                )

    @cached_property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.axes)

    @cached_property
    def digits(self) -> np.ndarray:
        """Device ids indexed by digits: dims ordered (level, axis), level-major,
        dim ``l * len(axes) + a`` of size ``X[a][l]`` (see the module docstring)."""
        dims = [self.matrix[a][l] for l in range(len(self.topology.levels)) for a in range(len(self.axes))]
        return np.arange(self.topology.num_devices).reshape(dims)

    def digit_dim(self, axis: int, level: int) -> int:
        """The dimension of :attr:`digits` that holds axis ``axis``'s digit at ``level``."""
        return level * len(self.axes) + axis

    @cached_property
    def mesh(self) -> np.ndarray:
        """Array of shape (axis sizes) holding device ids (JAX Mesh / DeviceMesh order)."""
        order = [self.digit_dim(a, l) for a in range(len(self.axes)) for l in range(len(self.topology.levels))]
        return self.digits.transpose(order).reshape([a.size for a in self.axes])

    def matrix_text(self) -> str:
        """The matrix in the project's one notation (output of every command and
        ``--matrix`` input): one row per axis, ``AXIS:`` and its split at each
        level, outermost first, rows separated by `` / ``: ``dp:4,1 / mp:1,16``."""
        return MATRIX_ROWS.join(f"{a.name}:" + ",".join(str(v) for v in row) for a, row in zip(self.axes, self.matrix))

    def describe(self) -> str:
        """The same as :meth:`matrix_text`."""
        return self.matrix_text()


def split_at_innermost_level(placement: Placement, axis: str, outer: str, inner: str) -> Placement:
    """``placement`` with ``axis`` split in two axes in its place: ``inner``
    its split at the innermost hierarchy level it spans (size > 1 there),
    ``outer`` the rest (1 where ``axis`` has size 1). The devices keep their
    positions: ``axis``'s coordinate is ``outer x |inner| + inner`` (each
    level's digit of ``axis`` now belongs to one of the two, the other having
    size 1 there), so the two axes' groups are the sub-groups of ``axis``'s:
    HSDP's replicate and shard groups."""
    a = placement.axis_names.index(axis)
    row = placement.matrix[a]
    spanned = [level for level, split in enumerate(row) if split > 1]
    innermost = spanned[-1] if spanned else len(row) - 1
    inner_row = tuple(split if level == innermost else 1 for level, split in enumerate(row))
    outer_row = tuple(1 if level == innermost else split for level, split in enumerate(row))
    axes = (*placement.axes[:a], Axis(outer, math.prod(outer_row)), Axis(inner, math.prod(inner_row)),
            *placement.axes[a + 1:])
    matrix = (*placement.matrix[:a], outer_row, inner_row, *placement.matrix[a + 1:])
    return Placement(placement.topology, axes, matrix)


def enumerate_placements(
    topology: Topology, axes: Sequence[Axis], constraints: Sequence[Constraint] = ()
) -> list[Placement]:
    """All placements of ``axes`` on ``topology`` satisfying ``constraints``
    (:func:`enumerate_matrices`)."""
    check_axes_fit(axes, topology)
    matrices = enumerate_matrices(
        topology.counts,
        [a.size for a in axes],
        constraints,
        [a.name for a in axes],
        topology.level_names,
    )
    return [Placement(topology, tuple(axes), m) for m in matrices]


def parse_matrix(spec: str, axes: Sequence[Axis], topology: Topology) -> Matrix:
    """Parse a matrix in the notation of :meth:`Placement.matrix_text`
    (``dp:4,1 / mp:1,16``; rows in any order, each axis once), or rows without
    names in axis order, separated by ``/`` or ``;`` (``4,1;1,16``)."""
    names = [a.name for a in axes]
    example = MATRIX_ROWS.join(f"{a}:" + ",".join("N" * len(topology.levels)) for a in names)
    expected = (f"--matrix '{spec}': expected one row per axis like '{example}' (the axis's split at each level "
                f"{', '.join(topology.level_names)}, outermost first)")
    rows: dict[str, tuple[int, ...]] = {}
    texts = [row.strip() for row in re.split(r"[/;]", spec)]
    named = [":" in row for row in texts]
    if any(named) and not all(named):
        raise SynthError(f"{expected}; name every row's axis or none")
    for i, row in enumerate(texts):
        name, _, values = row.rpartition(":") if named[i] else (names[i] if i < len(names) else "", "", row)
        name = name.strip()
        if name not in names:
            raise SynthError(f"{expected}; '{name}' is not an axis" if named[i] else expected)
        if name in rows:
            raise SynthError(f"{expected}; axis {name} has two rows")
        try:
            rows[name] = tuple(int(v) for v in values.split(","))
        except ValueError:
            raise SynthError(f"{expected}; row '{row}' is not integers separated by ','") from None
        if len(rows[name]) != len(topology.levels):
            raise SynthError(f"{expected}; row '{row}' has {len(rows[name])} entries for "
                             f"{len(topology.levels)} levels")
    missing = [n for n in names if n not in rows]
    if missing:
        raise SynthError(f"{expected}; no row for {', '.join(missing)}")
    return tuple(rows[n] for n in names)
