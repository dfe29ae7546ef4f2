"""How a model's layers are split over pipeline stages.

Even (``--stages even``): ``L / pp`` layers on every stage; pp must divide L.
Uneven (``--stages uneven``): the first and the last stage may hold fewer (or
more) layers than the ones between, which all hold the same number (the form
Megatron-LM runs with ``--decoder-first-pipeline-num-layers`` and
``--decoder-last-pipeline-num-layers``; Llama 3 405B trained with one layer
fewer on its first and last stages, Llama Team 2024, arXiv:2407.21783,
Section 3.3.2). The counts are chosen so that the slowest stage, counting the
embedding on the first and the output layer and loss on the last, is as fast
as it can be; pp need not divide L.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from ..errors import SynthError

STAGE_CHOICES = ("even", "uneven", "search")


@dataclass(frozen=True)
class StageCosts:
    """One micro-batch's cost on a stage: ``layer`` per layer, plus
    ``first_extra`` on the first stage (the embedding) and ``last_extra`` on
    the last (final norm, output layer, loss), in any one unit (seconds or
    FLOPs)."""

    layer: float
    first_extra: float
    last_extra: float

    def stage(self, layers: int, first: bool, last: bool) -> float:
        return layers * self.layer + (self.first_extra if first else 0.0) + (self.last_extra if last else 0.0)


def describe_layers(layout: tuple[int, ...]) -> str:
    """``7,8x14,7``: the layers of the first stage, of the middle ones
    (layers x stages) and of the last."""
    if len(layout) <= 2:
        return ",".join(map(str, layout))
    middle = layout[1:-1]
    inner = f"{middle[0]}x{len(middle)}" if len(set(middle)) == 1 else ",".join(map(str, middle))
    return f"{layout[0]},{inner},{layout[-1]}"


def even_layers(layers: int, pp: int) -> tuple[int, ...]:
    """``pp`` stages of ``layers / pp`` layers; SynthError when pp does not
    divide the layers."""
    if layers % pp:
        raise SynthError(f"pp={pp} does not divide the model's layers ({layers}); --stages uneven lets the first "
                         "and last stages hold other counts")
    return (layers // pp,) * pp


def slowest_stage(layout: tuple[int, ...], costs: StageCosts) -> float:
    """The cost of the slowest stage of ``layout``."""
    last = len(layout) - 1
    return max(costs.stage(n, i == 0, i == last) for i, n in enumerate(layout))


def kind_costs(layout: tuple[int, ...], costs: StageCosts) -> dict[str, float]:
    """The cost of each kind of stage of ``layout`` (``only``; or ``first``,
    ``last`` and, when there are more than two stages, ``middle``, the second
    standing for them all: the middle stages hold the same layers)."""
    if len(layout) == 1:
        return {"only": costs.stage(layout[0], True, True)}
    kinds = {"first": costs.stage(layout[0], True, False), "last": costs.stage(layout[-1], False, True)}
    if len(layout) > 2:
        kinds["middle"] = costs.stage(layout[1], False, False)
    return kinds


def balanced_layers(layers: int, pp: int, costs: StageCosts) -> tuple[int, ...]:
    """Layers per stage, first and last free and the middle ones equal, every
    stage at least one layer, minimising the slowest stage; ties go to the
    layout whose layer counts differ least, then to the one with fewer layers
    on the first stage (its activations are held longest). SynthError when
    there are fewer layers than stages.

    Per middle count the first stage's cost rises with its layers and the
    last stage's falls, so the first counts at which the slowest stage is
    least form one interval, found by bisection; inside it the counts differ
    least at the point nearest an even split of the rest (the spread falls
    strictly up to it), so each middle count looks at a few layouts, not at
    every split."""
    if pp < 1 or layers < pp:
        raise SynthError(f"pp={pp}: {layers} layers cannot give every pipeline stage at least one layer")
    if pp == 1:
        return (layers,)
    best: tuple[tuple[float, int, int], tuple[int, ...]] | None = None
    middle_counts = [0] if pp == 2 else range(1, (layers - 2) // (pp - 2) + 1)
    for middle in middle_counts:
        rest = layers - (pp - 2) * middle  # for the first and the last stage together
        middle_cost = costs.stage(middle, False, False) if pp > 2 else 0.0
        if best is not None and middle_cost > best[0][0]:
            break  # the middle stages alone are slower than the best layout, and more layers only slower
        for first in _least_slowest_candidates(rest, middle_cost, costs):
            last = rest - first
            # slowest_stage of the layout, from its three kinds of stage
            slowest = max(costs.stage(first, True, False), middle_cost, costs.stage(last, False, True))
            counts = (first, last, middle) if pp > 2 else (first, last)
            key = (slowest, max(counts) - min(counts), first)
            if best is None or key < best[0]:
                best = (key, (first, middle, last))
    assert best is not None
    first, middle, last = best[1]
    return (first,) + (middle,) * (pp - 2) + (last,)


def _least_slowest_candidates(rest: int, middle_cost: float, costs: StageCosts) -> set[int]:
    """First-stage counts in ``1..rest-1`` among which :func:`balanced_layers`'
    best split of ``rest`` layers between the first and the last stage lies:
    the ends of the interval where the slowest of the three stages is least,
    and its points nearest ``rest / 2``."""

    def first_cost(first: int) -> float:
        return costs.stage(first, True, False)

    def last_cost(first: int) -> float:
        return costs.stage(rest - first, False, True)

    counts = range(1, rest)

    def first_where(holds) -> int:
        """The least count where ``holds`` (false, then true) holds; ``rest`` if none."""
        return counts[0] + bisect_left(counts, True, key=holds)

    cross = first_where(lambda f: first_cost(f) >= last_cost(f))  # where the first stage becomes the slower
    least = min(max(first_cost(f), last_cost(f)) for f in (cross - 1, cross) if f in counts)
    target = max(middle_cost, least)
    # first counts whose first and last stage are both within the target: an interval
    low = first_where(lambda f: last_cost(f) <= target)
    high = first_where(lambda f: first_cost(f) > target) - 1
    nearest = {min(max(f, low), high) for f in (rest // 2, (rest + 1) // 2)}
    return nearest | {low, high}
