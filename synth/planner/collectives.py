"""What the step model (:mod:`synth.planner.stepmodel`) asks of a
placement's communication: :class:`Collectives`, the seconds of its
collectives and what it reads of the placement beside them; and
:class:`BareCollectives`, a base for collectives that model nothing of the
hardware but their prices.

:class:`~synth.planner.collectivecosts.PlacementCollectives` implements the
protocol on one placement with the project's cost model,
:class:`~synth.planner.pruning.CheapestCollectives` with the least price over
several placements.
"""

from __future__ import annotations

from typing import Protocol

from ..synthesis.semantics import Goal


class Collectives(Protocol):
    """Predicted seconds of the job's collectives on one placement (each with
    the best program for that axis, placement and size), the SMs their kernels
    hold and the groups' extent on the hierarchy. ``axis`` is a placed axis
    (``tp``, ``ep``, ...), HSDP's sub-axes of dp (``dp_shard``,
    ``dp_replicate``), or for :meth:`reduce` and :meth:`sm_share` also axes
    reduced together (``dp+ep``)."""

    def reduce(self, axis: str, goal: Goal, size_bytes: int) -> float:
        """One reduction over ``axis`` toward ``goal`` of ``size_bytes`` per device."""

    def send(self, axis: str, size_bytes: int) -> float:
        """Every device sends ``size_bytes`` to its next neighbour along ``axis`` at once."""

    def alltoall(self, axis: str, size_bytes: int) -> float:
        """An all-to-all of ``size_bytes`` per device in every group of ``axis`` at once."""

    def sm_share(self, axis: str, goal: Goal, size_bytes: int) -> float:
        """The share of each device's SMs, from 0 to 1, that :meth:`reduce`'s
        collective with the same arguments holds while it runs (NCCL: one SM
        per channel, over the device's SMs); 0 where its kernels hold none.
        The step model slows the computation a collective runs beside by it
        (:func:`~synth.planner.overlaps.sm_held_s`)."""

    def size(self, axis: str) -> int:
        """The devices in one group of ``axis``; the step model asks it of
        HSDP's sub-axes."""

    def nodes(self, axis: str) -> int:
        """The groups of the hierarchy's innermost level (nodes) one group of
        ``axis`` spans: the product of the axis's split over the levels above
        the innermost, 1 where the axis is not placed; the step model asks it
        of ``ep`` under node-limited routing."""


class BareCollectives:
    """A base for :class:`Collectives` that model nothing of the hardware but
    their prices (the free collectives of a lower bound, tests' fakes): their
    kernels hold no SMs (:meth:`sm_share` is 0) and every group lies inside
    one node (:meth:`nodes` is 1). A subclass gives ``reduce``, ``send`` and
    ``alltoall``, and :meth:`size` where it prices HSDP's sub-axes."""

    def sm_share(self, axis: str, goal: Goal, size_bytes: int) -> float:
        return 0.0

    def size(self, axis: str) -> int:
        raise NotImplementedError(f"{type(self).__name__} does not say the size of axis '{axis}'")

    def nodes(self, axis: str) -> int:
        return 1
