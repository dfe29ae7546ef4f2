"""The BLAS library behind numpy, held to one thread while a search runs.

The search multiplies many small matrices, one per state: how many devices of
each of a few hundred sets hold each distinct id, times the ids' quantities (at
six levels of 4, a 191 x 4,096 by 4,096 x 6 product for a state of 4,096
distinct ids). OpenBLAS splits such a product over every core, and its threads
then spin, waiting for the next one, while the search runs Python between the
products. Measured on a 2-core machine (``docs/performance.md``): the search of
six levels of 4 took 41.9 s of CPU time in 34 s of wall time with two BLAS
threads, and 31.9 s in 33 s with one; one such product took 0.58 ms of wall
time on two threads against 0.22 ms on one.

The limit is set through threadpoolctl (a small, pure-Python library that
finds the loaded BLAS and calls its own thread-count setter; numpy has no
setting for it), only inside :func:`one_blas_thread`, and restored on every
exit, so a caller's own numpy work keeps its threads.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from threadpoolctl import ThreadpoolController

_controller: ThreadpoolController | None = None


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS runs on one thread inside the block; its thread counts are restored
    as they were on every exit. The loaded libraries are found once per
    process (a BLAS loaded later, by another library, is not limited)."""
    global _controller
    if _controller is None:
        _controller = ThreadpoolController()
    with _controller.limit(limits=1, user_api="blas"):
        yield
