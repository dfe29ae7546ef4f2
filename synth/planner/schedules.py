"""Pipeline schedules: how long a step's pipeline bubble lasts and how many
micro-batches' activations each stage holds at its peak.

Three schedules, p pipeline stages, m micro-batches per step, a "slot" being
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

Megatron-LM's interleaved schedule asks the micro-batches of a step to be a
multiple of p (:func:`schedule_problem`). On uneven stages (``--stages``)
each device's layers are split into ``v`` virtual stages that may differ by
one layer; the in-flight count above applies to its layers as a whole.
"""

from __future__ import annotations

import enum

SCHEDULE_CHOICES = ("1f1b", "interleaved", "zero-bubble", "search")


class Schedule(enum.Enum):
    """A pipeline schedule (module docstring)."""

    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    ZERO_BUBBLE = "zero-bubble"

    def describe(self, virtual_stages: int) -> str:
        """``1F1B``, ``interleaved 1F1B, 2 stages`` or ``zero bubble (ZB-H1)``."""
        if self is Schedule.INTERLEAVED:
            return f"interleaved 1F1B, {virtual_stages} stages"
        return "zero bubble (ZB-H1)" if self is Schedule.ZERO_BUBBLE else "1F1B"


def schedule_problem(schedule: Schedule, virtual_stages: int, pp: int, micro_batches: int,
                     layout: tuple[int, ...]) -> str | None:
    """Why ``schedule`` cannot run on stages of ``layout`` layers (None if it
    can): interleaving needs at least two virtual stages, dividing each stage's
    layers when the stages are even (Megatron-LM's layers per virtual stage)
    and no more than the fewest layers of a stage when they are not (every
    virtual stage holds a layer; a stage's may differ by one), and, as
    Megatron-LM asks, micro-batches a multiple of pp; the other schedules run
    one stage per device."""
    if schedule is not Schedule.INTERLEAVED:
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


def bubble_s(schedule: Schedule, pp: int, virtual_stages: int, slot_s: float, weight_gradient_s: float) -> float:
    """Seconds of pipeline bubble per step: ``slot_s`` is one micro-batch's
    forward and backward on a stage with its communication,
    ``weight_gradient_s`` the weight-gradient part of its backward (module
    docstring)."""
    if schedule is Schedule.ZERO_BUBBLE:
        return (pp - 1) * max(0.0, slot_s - 2 * weight_gradient_s)
    return (pp - 1) / virtual_stages * slot_s


def in_flight_micro_batches(schedule: Schedule, pp: int, stage: int, micro_batches: int,
                            virtual_stages: int) -> float:
    """Micro-batches' worth of its layers' activations stage ``stage`` (0 is
    the first) holds at its peak (module docstring)."""
    if schedule is Schedule.INTERLEAVED:
        chunks = min(2 * (pp - stage - 1) + (virtual_stages - 1) * pp + 1, micro_batches * virtual_stages)
        return chunks / virtual_stages
    return min(pp - stage, micro_batches)


def virtual_stage_choices(layers_per_stage: int) -> tuple[int, ...]:
    """The virtual stages an interleaved search tries: every ``v >= 2`` that
    divides a stage's layers."""
    return tuple(v for v in range(2, layers_per_stage + 1) if layers_per_stage % v == 0)
