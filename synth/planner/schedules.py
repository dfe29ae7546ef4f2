"""Pipeline schedules: how long a step's pipeline bubble lasts and how many
micro-batches' activations each stage holds at its peak.

Four schedules, p pipeline stages, m micro-batches per step, a "slot" being
one micro-batch's forward and backward on a stage with its tensor- and
pipeline-parallel communication:

* ``1f1b`` (PipeDream-Flush, Narayanan et al. 2021, "Efficient Large-Scale
  Language Model Training on GPU Clusters Using Megatron-LM", SC'21): bubble
  ``(p - 1)`` slots; stage ``i`` (0 first) holds ``min(p - i, m)`` micro-batches.
* ``interleaved`` (the same paper, Section 2.2.2): each device runs ``v``
  virtual stages (model chunks) of ``L_s / v`` layers; bubble ``(p - 1) / v``
  slots; every micro-batch crosses ``v`` times more stage boundaries. In
  Megatron-LM's schedule rank ``i`` runs ``2 (p - i - 1) + (v - 1) p`` warm-up
  forwards of one chunk before its first backward, so it holds
  ``min(2 (p - i - 1) + (v - 1) p + 1, m v)`` chunks, ``/ v`` micro-batches of
  its layers: for the first stage ``p (1 + (p - 1) / (p v))``, Korthikanti et
  al. 2022 (arXiv:2205.05198) Section 4.2.3.
* ``zero-bubble`` (ZB-H1, Qi et al. 2024, "Zero Bubble Pipeline Parallelism",
  ICLR, arXiv:2401.10241): the backward is split into the input gradient (B)
  and the weight gradient (W), and the W passes fill the bubble: ``(p - 1)
  (T_F + T_B - T_W)`` instead of 1F1B's ``(p - 1) (T_F + T_B + T_W)``, at
  1F1B's peak activation memory. With ``T_W`` a micro-batch's weight-gradient
  compute, the bubble is ``(p - 1) (slot - 2 T_W)``.
* ``dualpipe`` (DeepSeek-V3 technical report, arXiv:2412.19437, Section
  3.2.1, Figure 5 and Table 2; deepseek-ai/DualPipe's README and
  ``dualpipe/dualpipe.py``): each of the p ranks runs two stages, ``i`` and
  ``p - 1 - i`` (the README's example builds each rank's modules so), and
  the micro-batches enter from both ends, half of them each way, so a rank
  runs ``m / 2`` micro-batches through each of its stages and its pace per
  micro-batch is the mean of its two stages' (:func:`rank_stage_kinds`).
  Bubble ``(p / 2 - 1) (T_F&B + T_B - 3 T_W)``, ``T_F&B`` a forward and a
  backward chunk run overlapped, ``T_B`` a full backward chunk; here
  ``T_F&B`` is one slot (a forward and a backward, with the communication
  the model leaves exposed) and ``T_B`` the backward's share of it. Each
  rank holds both stages' weights, gradients and optimizer states (Table
  2's "2x parameters"), and its activations peak at ``p + 1`` stage
  micro-batches: in ``dualpipe.py``'s main loop, after its warm-up of
  ``2 (p/2 - i - 1) + (i + 1)`` forwards of stage ``i`` and ``i + 1`` of
  stage ``p - 1 - i`` (steps 1 and 2), each overlapped forward starts before
  its paired backward frees, so stage ``i`` holds ``p - i`` micro-batches
  and stage ``p - 1 - i`` holds ``i + 1``: each stage as many as in 1F1B,
  ``p + 1`` on every rank. deepseek-ai/DualPipe ``dualpipe/dualpipe.py``
  (lines 332-333 at 3da1bbe) asserts an even p and an even number of
  micro-batches, at least ``2 p`` (:func:`schedule_problem`). The schedule does not itself overlap the
  all-to-alls: it calls the trainer's own overlapped forward-and-backward
  (the README: "you will need to implement a custom
  ``overlapped_forward_backward``"), which ``--ep-overlap`` prices, so
  ``dualpipe`` does not imply it. Of the frameworks modelled only
  DeepSeek's runs it (:data:`DUALPIPE_FRAMEWORKS`): Megatron-LM (core
  0.16.1) has no DualPipe, and torchtitan 0.3.0 runs PyTorch's
  ``ScheduleDualPipeV``, the V-shaped variant, two stages of a ``2 p``-stage
  split per rank with every micro-batch one way, not this schedule.

Megatron-LM's interleaved schedule asks the micro-batches of a step to be a
multiple of p (:func:`schedule_problem`). On uneven stages (``--stages``)
each device's layers are split into ``v`` virtual stages that may differ by
one layer; the in-flight count above applies to its layers as a whole.
"""

from __future__ import annotations

import enum

SCHEDULE_CHOICES = ("1f1b", "interleaved", "zero-bubble", "dualpipe", "search")

# The frameworks (synth.planner.frameworks names) that run DualPipe, which `--schedule search` tries only there.
DUALPIPE_FRAMEWORKS = ("deepseek",)


class Schedule(enum.Enum):
    """A pipeline schedule (module docstring)."""

    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    ZERO_BUBBLE = "zero-bubble"
    DUALPIPE = "dualpipe"

    def describe(self, virtual_stages: int) -> str:
        """``1F1B``, ``interleaved 1F1B, 2 stages``, ``zero bubble (ZB-H1)`` or ``DualPipe``."""
        if self is Schedule.INTERLEAVED:
            return f"interleaved 1F1B, {virtual_stages} stages"
        if self is Schedule.DUALPIPE:
            return "DualPipe"
        return "zero bubble (ZB-H1)" if self is Schedule.ZERO_BUBBLE else "1F1B"


def schedule_problem(schedule: Schedule, virtual_stages: int, pp: int, micro_batches: int,
                     layout: tuple[int, ...]) -> str | None:
    """Why ``schedule`` cannot run on stages of ``layout`` layers (None if it
    can): interleaving needs at least two virtual stages, dividing each stage's
    layers when the stages are even (Megatron-LM's layers per virtual stage)
    and no more than the fewest layers of a stage when they are not (every
    virtual stage holds a layer; a stage's may differ by one), and, as
    Megatron-LM asks, micro-batches a multiple of pp; DualPipe needs an even
    pp and an even number of micro-batches, at least 2 pp (``dualpipe.py``'s
    asserts, module docstring); the other schedules run one stage per device."""
    if schedule is Schedule.DUALPIPE and virtual_stages == 1:
        if pp < 2 or pp % 2:
            return f"the dualpipe schedule pairs stages i and pp-1-i on each rank: it needs an even pp >= 2, not pp={pp}"
        if micro_batches % 2 or micro_batches < 2 * pp:
            return (f"the dualpipe schedule needs an even number of micro-batches per step, at least 2 x pp = "
                    f"{2 * pp} (half enter from each end), not {micro_batches}")
        return None
    if schedule is not Schedule.INTERLEAVED:
        if schedule is Schedule.DUALPIPE:
            return f"the dualpipe schedule runs its two stages per device, no virtual stages ({virtual_stages} asked)"
        if virtual_stages != 1:
            return f"the {schedule.value} schedule runs one stage per device (virtual stages {virtual_stages})"
        return None
    if pp < 2:
        return "the interleaved schedule needs pipeline parallelism (pp > 1)"
    if virtual_stages < 2:
        return f"the interleaved schedule needs at least 2 virtual stages, not {virtual_stages}"
    if len(set(layout)) == 1 and layout[0] % virtual_stages:
        return f"{virtual_stages} virtual stages do not divide the {layout[0]} layers per stage"
    if min(layout) < virtual_stages:
        return (f"{virtual_stages} virtual stages are more than the {min(layout)} layers of the smallest stage "
                "(every virtual stage holds a layer)")
    if micro_batches % pp:
        return f"the interleaved schedule needs the micro-batches per step ({micro_batches}) to be a multiple of pp={pp}"
    return None


def bubble_s(schedule: Schedule, pp: int, virtual_stages: int, slot_s: float, weight_gradient_s: float,
             backward_s: float = 0.0) -> float:
    """Seconds of pipeline bubble per step: ``slot_s`` is one micro-batch's
    forward and backward on a stage with its communication (DualPipe: the
    mean of a rank's two stages'), ``weight_gradient_s`` the weight-gradient
    part of its backward, ``backward_s`` its whole backward (DualPipe's
    ``T_B``; module docstring)."""
    if schedule is Schedule.DUALPIPE:
        return (pp // 2 - 1) * max(0.0, slot_s + backward_s - 3 * weight_gradient_s)
    if schedule is Schedule.ZERO_BUBBLE:
        return (pp - 1) * max(0.0, slot_s - 2 * weight_gradient_s)
    return (pp - 1) / virtual_stages * slot_s


def in_flight_micro_batches(schedule: Schedule, pp: int, stage: int, micro_batches: int,
                            virtual_stages: int) -> float:
    """Micro-batches' worth of its layers' activations stage ``stage`` (0 is
    the first) holds at its peak (module docstring; DualPipe: ``pp - stage``,
    its micro-batches being at least 2 pp, :func:`schedule_problem`)."""
    if schedule is Schedule.DUALPIPE:
        return pp - stage
    if schedule is Schedule.INTERLEAVED:
        chunks = min(2 * (pp - stage - 1) + (virtual_stages - 1) * pp + 1, micro_batches * virtual_stages)
        return chunks / virtual_stages
    return min(pp - stage, micro_batches)


def virtual_stage_choices(layers_per_stage: int) -> tuple[int, ...]:
    """The virtual stages an interleaved search tries: every ``v >= 2`` that
    divides a stage's layers."""
    return tuple(v for v in range(2, layers_per_stage + 1) if layers_per_stage % v == 0)


def rank_stage_kinds(schedule: Schedule, pp: int) -> dict[str, tuple[tuple[str, int], ...]]:
    """The kinds of rank whose loads differ, each with the (stage kind, stage
    index) pairs it runs (stage kinds as
    :func:`~synth.planner.training.stage_kinds` names them, the second stage
    standing for the middle ones): one stage per rank, or under DualPipe
    stages ``i`` and ``pp - 1 - i`` (module docstring): ``first+last`` on
    ranks 0 and pp - 1, ``middle`` (stages 1 and pp - 2) on the others."""
    if pp == 1:
        return {"only": (("only", 0),)}
    if schedule is Schedule.DUALPIPE:
        ranks = {"first+last": (("first", 0), ("last", pp - 1))}
        if pp > 2:
            ranks["middle"] = (("middle", 1), ("middle", pp - 2))
        return ranks
    ranks = {"first": (("first", 0),), "last": (("last", pp - 1),)}
    if pp > 2:
        ranks["middle"] = (("middle", 1),)
    return ranks


def rank_mean(schedule: Schedule, pp: int, per_kind: dict[str, float]) -> float:
    """The slowest kind of rank's mean over its stages of ``per_kind`` (a
    micro-batch's cost on each kind of stage): the pipeline's pace per
    micro-batch, the slowest stage's when each rank runs one."""
    return max(sum(per_kind[kind] for kind, _ in stages) / len(stages)
               for stages in rank_stage_kinds(schedule, pp).values())


def wanted_schedules(asked: str, framework: str, pp: int, micro_batches: int) -> list[Schedule]:
    """The schedules ``--schedule asked`` tries: the one named, or for
    ``search`` every one, DualPipe only under a framework that runs it
    (:data:`DUALPIPE_FRAMEWORKS`) and where it can run
    (:func:`schedule_problem`)."""
    if asked != "search":
        return [Schedule(asked)]
    dualpipe = framework in DUALPIPE_FRAMEWORKS and schedule_problem(Schedule.DUALPIPE, 1, pp, micro_batches, ()) is None
    return [s for s in Schedule if s is not Schedule.DUALPIPE or dualpipe]


def schedule_layouts(schedule: Schedule, stage_layers: tuple[int, ...], dense_layers: int = 0) -> list[tuple[int, ...]]:
    """The stage layouts a schedule is tried on, from one balanced layout
    (:mod:`synth.planner.stages`; empty: even stages, kept so): that one, and
    under DualPipe, whose first and last stages share a rank (only their sum
    sets its pace, but the first holds ``pp`` micro-batches' activations and
    the last one), every other split of their layers with at least one each,
    the middle stages as they are. A split keeps on the first stage the
    model's ``dense_layers`` leading dense layers that the layout's first stage
    holds (the second stage stands for every middle one,
    :func:`~synth.planner.training.stage_kinds`, so the middle stages must stay
    alike); a split into even stages is left to ``--stages even``."""
    if schedule is not Schedule.DUALPIPE or len(stage_layers) < 2:
        return [stage_layers]
    both, middle = stage_layers[0] + stage_layers[-1], stage_layers[1:-1]
    least = max(1, min(stage_layers[0], dense_layers))
    splits = [(first,) + middle + (both - first,) for first in range(least, both) if first != stage_layers[0]]
    return [stage_layers] + [layout for layout in splits if len(set(layout)) > 1]
