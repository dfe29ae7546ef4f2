"""One shape for every collective's results, and what they share.

Every collective's answer (:class:`~synth.api.reduction.Solution` for
all-reduce, reduce-scatter and all-gather, :class:`~synth.api.sparse.SparseSolution`,
:class:`~synth.api.alltoall.AllToAllSolution`, ...) is a :class:`RankedSolution`
of :class:`RankedPlacement` results: ``placements`` in enumeration order,
``by_speed`` (fastest predicted first, ties by enumeration order), ``best``,
each placement's ``index``, ``matrix`` and ``best_s``, and the rows of the
table the command line prints (:meth:`RankedSolution.table`: :class:`Column`
heads and rows of cell texts, printed by one printer,
:func:`synth.cli.solve.print_ranked`).

For example, a solution with placements of best times ``(3 ms, 1 ms)`` has
``by_speed`` ``(placements[1], placements[0])`` and table rows starting
``("1", "1", ...)`` then ``("2", "0", ...)`` (rank, then ``#``, the index).
Adding a collective is one module here that defines its results on these
bases and its ``solve_*`` function, and its name in the package's
``COLLECTIVE_MODULES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable, ClassVar, Sequence

from ..cost import Model
from ..errors import SynthError
from ..units import parse_size

DEFAULT_SIZE_BYTES = 256 * 2**20
Progress = Callable[[str], None]


def as_model(model: Model | str | None) -> Model:
    """A :class:`~synth.cost.Model`: the default (``None``), the one given, or
    one loaded by algorithm name or profile path."""
    if model is None:
        return Model()
    return model if isinstance(model, Model) else Model.load(model)


def as_size_bytes(size: int | str) -> int:
    """Bytes per device from an integer >= 1 or text like ``'256MiB'``."""
    if isinstance(size, str):
        return parse_size(size)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise SynthError(f"size {size!r}: give bytes per device as an integer >= 1 or text like '256MiB'")
    return size


def check_top(top: int | None) -> None:
    if top is not None and top < 0:
        raise SynthError(f"--top {top}: must be >= 0")


@dataclass(frozen=True)
class Column:
    """One column of a ranking table: its ``header``, alignment (``<`` left,
    ``>`` right), ``width`` (each cell at least that wide; with ``fit`` the
    whole column as wide as its widest cell or header) and the ``gap`` of
    spaces before it. The last column of a table is free text."""

    header: str
    align: str = ">"
    width: int = 0
    fit: bool = False
    gap: str = " "


RANK = Column("rank", width=4, gap="")
INDEX = Column("#", width=3)
MATRIX = Column("matrix", "<", 22, fit=True, gap="  ")


def speedup_text(speedup: float) -> str:
    return f"{speedup:.2f}x"


class RankedPlacement:
    """Base of one placement's result, whatever the collective. Subclasses
    (frozen dataclasses) give ``index`` (enumeration order: the table's ``#``),
    :attr:`matrix`, :attr:`best_s` and :meth:`table_rows`."""

    index: int

    @property
    def matrix(self) -> tuple[tuple[int, ...], ...]:
        """The placement's parallelism matrix (rows: axes; columns: levels)."""
        raise NotImplementedError

    @property
    def best_s(self) -> float:
        """Predicted seconds of the placement's fastest program."""
        raise NotImplementedError

    def table_rows(self) -> list[tuple[str, ...]]:
        """The cells of the solution's ``COLUMNS`` (after rank and ``#``): the
        placement's row, then one row per further listed program."""
        raise NotImplementedError


class RankedSolution:
    """Base of a collective's answer. Subclasses (frozen dataclasses) hold
    ``placements`` (:class:`RankedPlacement`, enumeration order) and name the
    table's ``COLUMNS`` after rank and ``#``."""

    placements: Sequence[RankedPlacement]
    COLUMNS: ClassVar[tuple[Column, ...]] = ()

    @cached_property
    def by_speed(self) -> tuple:
        """Placements fastest predicted first (ties: enumeration order)."""
        return tuple(sorted(self.placements, key=lambda p: (p.best_s, p.index)))

    @property
    def best(self):
        """The placement predicted fastest."""
        return self.by_speed[0]

    def table(self) -> tuple[tuple[Column, ...], list[tuple[str, ...]]]:
        """The ranking table: its columns and rows, placements fastest first,
        each numbered by its rank and ``#`` (index) on its first row."""
        rows = []
        for n, p in enumerate(self.by_speed):
            for i, cells in enumerate(p.table_rows()):
                rows.append(((str(n + 1), str(p.index)) if i == 0 else ("", "")) + tuple(cells))
        return (RANK, INDEX, *self.COLUMNS), rows
