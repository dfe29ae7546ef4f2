"""Watching a job's ranks (pure: fed snapshots of the node namespaces' processes).

Every rank runs under its guard shell (``commands.RANK_GUARD``), a child of its
node's daemon (``prted``). When a guard dies before its command, the command
lives on outside MPI's control, still holding the rank's output pipes: PRRTE
stops the other ranks but waits for those pipes to close before it ends the
job, so ``mpiexec`` waits as long as the orphan runs (a ``sleep 300``: 300 s).
``JobWatch.observe`` notices the state that such a stall leaves, and that a
finishing job passes through in well under a second: every node's ranks have
started and none is running any more, yet ``mpiexec`` has not ended. After
``STALL_GRACE_S`` in that state it says which node's rank lost its guard and
what is left running. Ranks that end at different times are no stall: the job
waits while any node's ranks run.

When a node's daemon dies, PRRTE ends the job at once, with exit code 0, and
leaves that node's ranks (and others) running: ``JobWatch.left_running``, asked
after ``mpiexec`` ended, says whose ranks still run and which node's daemon is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from .commands import RANK_GUARD
from .description import Node

STALL_GRACE_S = 10.0  # a finished job's mpiexec exits well within this after its last rank


@dataclass(frozen=True)
class Process:
    """A process in a node's namespace."""

    pid: int
    argv: tuple[str, ...]
    rank: int | None = None  # OMPI_COMM_WORLD_RANK in its environment: a rank's guard or command

    @property
    def is_guard(self) -> bool:
        return self.argv[1:3] == ("-c", RANK_GUARD)


class JobWatch:
    """Decides from successive snapshots (node namespace -> its processes) when
    the job has stalled; ``observe`` returns the one-line reason then, else None."""

    def __init__(self, nodes: Sequence[Node], grace_s: float = STALL_GRACE_S):
        self.nodes = tuple(nodes)
        self.grace_s = grace_s
        self.started: set[str] = set()  # nodes whose ranks were seen running
        self.ended_at: dict[str, float] = {}  # when each node was first seen with no rank running

    def observe(self, now: float, snapshot: Mapping[str, Sequence[Process]]) -> str | None:
        for n in self.nodes:
            if any(p.is_guard for p in snapshot.get(n.namespace, ())):
                self.started.add(n.namespace)
                self.ended_at.pop(n.namespace, None)
            elif n.namespace in self.started:
                self.ended_at.setdefault(n.namespace, now)
        if len(self.ended_at) < len(self.nodes) or now - max(self.ended_at.values()) < self.grace_s:
            return None
        return self._reason(snapshot)

    def _reason(self, snapshot: Mapping[str, Sequence[Process]]) -> str:
        waited = f"mpiexec has waited {self.grace_s:g} s since the last rank's guard ended: stopping the job"
        lost = []
        for n in self.nodes:
            left: dict[int, list[Process]] = {}
            for p in snapshot.get(n.namespace, ()):
                if p.rank is not None:  # no guard runs: a rank's command that outlived its guard
                    left.setdefault(p.rank, []).append(p)
            lost += [f"node {n.namespace}: the guard shell of rank {rank} is gone but its "
                     + ", ".join(f"{_program(p)} (pid {p.pid})" for p in procs) + " still runs"
                     for rank, procs in sorted(left.items())]
        if lost:
            return "; ".join(lost) + f"; {waited}"
        first = min(self.nodes, key=lambda n: (self.ended_at[n.namespace], n.index))
        return f"every rank has ended (first those of node {first.namespace}) but {waited}"

    def left_running(self, snapshot: Mapping[str, Sequence[Process]]) -> str | None:
        """After mpiexec ended: the one-line account of the ranks still running
        (mpiexec lost them), else None."""
        lost = []
        for n in self.nodes:
            procs = snapshot.get(n.namespace, ())
            ranks = sorted(p.rank for p in procs if p.is_guard and p.rank is not None)
            if ranks:
                gone = "" if any(_program(p) == "prted" for p in procs) else ", whose daemon (prted) is gone"
                lost.append(f"{', '.join(map(str, ranks))} on node {n.namespace}{gone}")
        return f"mpiexec ended while ranks still ran: {'; '.join(lost)}" if lost else None


def _program(p: Process) -> str:
    return p.argv[0].rsplit("/", 1)[-1] if p.argv else "?"
