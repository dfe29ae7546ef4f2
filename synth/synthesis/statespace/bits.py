"""Collectives as bits, and the lookahead's counts packed in one integer.

**Bit sets.** A set of collectives is an int, bit ``BIT[c]`` for collective
``c`` (in :class:`~synth.synthesis.language.Collective` order): the profile
checks return which collectives pass a group, and a grouping's bits are the
AND over its groups. With the order AllReduce, ReduceScatter, AllGather,
Reduce, Broadcast, ``SUMMING = 0b01011`` (the three that sum: one count check
for all of them), ``COUNT_FREE = 0b00100`` (AllGather: the shape check alone)
and ``BROADCASTING = 0b10000``.

**Packed counts.** Per profile the lookahead keeps five numbers (holds every
chunk, complete, done, final, mass) in one integer, field ``i`` at bits
``FIELD * i`` (``FIELD = 64``), so a state's counts are one sum of integers
and a step's change is another. Invariant: every field of a sum stays within
its 64 bits, since a group's change is stored plus ``OFFSETS`` (``2**32`` per
field, keeping it non-negative) and a step has fewer than ``2**18`` groups.
Example: a profile that holds every chunk of ``k = 4`` from every device
packs ``1 + (1 << 64) + (1 << 128) + (1 << 192) + (16 << 256)`` (holds all,
complete, done, final for the AllReduce goal, mass ``4 * 4``), and
``(packed >> (FIELD * 4))`` reads its mass back.
"""

from __future__ import annotations

from ..language import Collective
from ..semantics import BIT, BROADCASTING, COUNT_FREE, SUMMING

__all__ = ["ALL_BITS", "BIT", "BIT_ALLGATHER", "BIT_ALLREDUCE", "BIT_REDUCE", "BIT_REDUCESCATTER", "BROADCASTING",
           "COLLECTIVES", "COUNT_FREE", "FIELD", "MASK", "OFFSETS", "SUMMING"]

COLLECTIVES = tuple(Collective)
BIT_ALLREDUCE, BIT_REDUCESCATTER, BIT_ALLGATHER, BIT_REDUCE = (
    1 << BIT[c] for c in (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.ALLGATHER, Collective.REDUCE))
ALL_BITS = (1 << len(COLLECTIVES)) - 1
#: bits per packed count, and one field's mask
FIELD = 64
MASK = (1 << FIELD) - 1
#: added to each group's change of the packed counts: the sum over a step's
#: groups (fewer than 2**18 of them: topology.MAX_DEVICES) stays below 2**51 per field;
#: the mass (the last field, at most k**3) has no field above it
OFFSETS = sum((1 << 32) << (FIELD * i) for i in range(5))
