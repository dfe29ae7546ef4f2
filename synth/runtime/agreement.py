"""Agreement across ranks on how an API object is built, so that a refusal on
one rank is a refusal on every rank, never a rank that raises while the others
wait in their first collective.

:func:`call_digest` digests what a rank was given (a plan's programs, the
call's arguments); :func:`agree_on_digest` compares it across the world in one
collective and raises the same SynthError on every rank when ranks differ.
:func:`refuse_together` is for a refusal that comes before any process group
exists (a DDP hook built before ``init_process_group``): under torchrun each
rank counts itself in torchrun's own store and waits, a bounded time, for the
others before raising, so torchrun does not kill ranks that have not yet said
why (it ends every worker as soon as one exits).
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from ..errors import SynthError
from .executor import World, ranks_text

# how long a rank refused before any process group waits for the others to reach the same refusal
REFUSAL_WAIT_S = 30.0


def call_digest(*parts: Any) -> str:
    """A short digest of ``parts`` (their ``repr``): equal exactly when every
    rank was given the same plan and arguments."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def agree_on_digest(world: World, what: str, digest: str) -> None:
    """Collective: every rank's ``digest`` of ``what`` (e.g. "the DDP hook's
    arguments") is rank 0's, else the same SynthError on every rank naming the
    ranks that differ."""
    digests = world.allgather(("agreement: " + what, digest))
    if any(not isinstance(d, tuple) or d[0] != digests[0][0] for d in digests):
        from .executor import steps_problem

        raise SynthError(steps_problem(digests) or "the ranks reached different collectives")
    differ = [rank for rank, (_, d) in enumerate(digests) if d != digests[0][1]]
    if differ:
        verb = "differs" if len(differ) == 1 else "differ"
        raise SynthError(f"the {what} differ across ranks ({ranks_text(differ)} {verb} from rank 0); give every "
                         "rank the same")


def refuse_together(message: str, wait_s: float = REFUSAL_WAIT_S) -> SynthError:
    """The SynthError of ``message`` to raise on this rank, once every rank
    of the torchrun job has reached a refusal too (or ``wait_s`` has passed):
    each rank adds itself to a counter in torchrun's agent store, so no rank
    exits (and makes torchrun end the others) before all have said why.
    Outside torchrun (no agent store) it returns at once."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return SynthError(message)
    try:
        from datetime import timedelta

        import torch.distributed as dist

        size = int(os.environ["WORLD_SIZE"])
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, False,
                              timedelta(seconds=wait_s))
        key = f"synth-reduce/refused/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        deadline = time.monotonic() + wait_s
        count = store.add(key, 1)
        while count < size and time.monotonic() < deadline:
            time.sleep(0.05)
            count = store.add(key, 0)
    except (KeyError, ValueError, RuntimeError, OSError):  # no usable store: refuse alone
        pass
    return SynthError(message)
