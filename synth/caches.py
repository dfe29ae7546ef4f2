"""One registry of the package's memo tables, so that they can all be forgotten.

Every memo that outlives a call (a ``functools.lru_cache``, or a module-level
dict used as one) is registered here when its module is imported:
:func:`memoised` wraps a function in an LRU cache and registers it,
:func:`register_table` registers a dict. :func:`clear_caches` walks the
registry: every memo, or those of the given packages (``clear_caches
("synth.cost")`` forgets the cost stage's memos, for timing cold
predictions). Nothing else keeps a list of memos by hand.

Invariant: a memo registered in module ``m`` is cleared by
``clear_caches(p)`` for every prefix package ``p`` of ``m`` (and by
``clear_caches()``). Example::

    @memoised(maxsize=64)
    def graph_scale(topology): ...          # registered as "synth.cost.links.graph_scale"

    clear_caches("synth.cost")              # graph_scale.cache_info().currsize == 0 afterwards
    clear_caches("synth.synthesis")         # leaves it alone

Instances' own memos (a state space's tables, ``cached_property``) live and die
with their instance and are not registered.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import TypeVar

__all__ = ["clear_caches", "memoised", "register_table", "registered"]

F = TypeVar("F", bound=Callable)

#: (module, name, clear) of every registered memo, in registration order
_REGISTRY: list[tuple[str, str, Callable[[], None]]] = []


def memoised(maxsize: int | None = 128, typed: bool = False) -> Callable[[F], F]:
    """``functools.lru_cache(maxsize, typed)``, registered under the
    function's module and qualified name (the wrapper keeps ``cache_clear``
    and ``cache_info``)."""

    def wrap(function: F) -> F:
        cached = lru_cache(maxsize=maxsize, typed=typed)(function)
        _REGISTRY.append((function.__module__, function.__qualname__, cached.cache_clear))
        return cached  # type: ignore[return-value]

    return wrap


def register_table(table: dict, module: str, name: str) -> dict:
    """Register a module-level dict used as a memo (cleared by emptying it);
    returns it, so a definition reads ``_T = register_table({}, __name__, "_T")``."""
    _REGISTRY.append((module, name, table.clear))
    return table


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return not packages or any(module == p or module.startswith(p + ".") for p in packages)


def registered(*packages: str) -> list[str]:
    """The registered memos (``module.name``), of ``packages`` only when given."""
    return [f"{module}.{name}" for module, name, _ in _REGISTRY if _within(module, packages)]


def clear_caches(*packages: str) -> None:
    """Forget every registered memo, or those of the modules in ``packages``
    (a package name covers its submodules). Only memos of modules imported
    so far are registered; the others are empty anyway."""
    for module, _, clear in _REGISTRY:
        if _within(module, packages):
            clear()
