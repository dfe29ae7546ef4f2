"""What the job planner (:func:`~synth.planner.configurations.plan_job`)
plans: :class:`JobRequest`, checked when it is made."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..cost import Model
from ..errors import SynthError
from ..synthesis.placement import Axis, AxisRange, parse_constraint
from ..topology import Device, Topology
from .compute import ComputeModel, EfficiencyCurve, default_compute
from .schedules import SCHEDULE_CHOICES
from .scores import require_bandwidth
from .stages import STAGE_CHOICES
from .stepmodel import Training
from .transformer import Transformer

PLANNER_AXES = ("tp", "cp", "ep", "dp", "pp")
# The memory a configuration may not count on by default, as a fraction of the device's: what the model does
# not count (the CUDA context and NCCL's buffers, about a GiB or two per process; the caching allocator's
# fragmentation, a few percent of what it holds). A policy, not a fit: 4 GiB of an 80 GiB device.
DEFAULT_MARGIN_FRACTION = 0.05


@dataclass(frozen=True)
class JobRequest:
    """What to plan: a topology with its device, a model, how it trains, the
    axes (names among tp, dp, pp with sizes or bounds; an axis not named has size
    1), the micro-batches to try (None: the powers of two that divide the batch),
    placement constraints, the communication and compute models, the memory
    kept free, how the layers are split over pipeline stages, the pipeline
    schedule (``search``: each of them, interleaved with every number of
    virtual stages that divides a stage's layers unless ``virtual_stages``
    fixes it) and whether to search the recomputation (``recompute_search``:
    per configuration the least recomputation that fits in memory, which is
    also the fastest; else the training's)."""

    topology: Topology
    device: Device
    model: Transformer
    training: Training
    axes: tuple[AxisRange, ...]
    micro_batches: tuple[int, ...] | None = None
    constraints: tuple[str, ...] = ()
    max_steps: int = 5
    comm: Model = field(default_factory=Model)
    compute: ComputeModel | None = None  # None: the device's shipped per-operation profile, else the curve
    memory_margin_GiB: float | None = None  # kept free on every device; None: DEFAULT_MARGIN_FRACTION of it
    stages: str = "even"  # layers per pipeline stage: even, uneven (balanced) or search (both)
    schedule: str = "1f1b"  # a Schedule's value or "search"
    virtual_stages: int | None = None  # interleaved: the virtual stages per device (None: every divisor tried)
    recompute_search: bool = False

    def __post_init__(self) -> None:
        if self.stages not in STAGE_CHOICES:
            raise SynthError(f"--stages {self.stages}: choose one of {', '.join(STAGE_CHOICES)}")
        if self.schedule not in SCHEDULE_CHOICES:
            raise SynthError(f"--schedule {self.schedule}: choose one of {', '.join(SCHEDULE_CHOICES)}")
        v = self.virtual_stages
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 2:
                raise SynthError(f"--virtual-stages {v!r}: virtual stages per device, an integer >= 2")
            if self.schedule not in ("interleaved", "search"):
                raise SynthError(f"--virtual-stages {v}: only the interleaved schedule runs virtual stages; add "
                                 "--schedule interleaved (or search)")
        if self.memory_margin_GiB is None:
            object.__setattr__(self, "memory_margin_GiB", round(DEFAULT_MARGIN_FRACTION * self.device.memory_GiB, 3))
        margin = self.memory_margin_GiB
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < self.device.memory_GiB:
            shown = f"{margin:g}" if isinstance(margin, (int, float)) and not isinstance(margin, bool) else repr(margin)
            raise SynthError(f"--memory-margin {shown}: GiB kept free per device, >= 0 and below the device's "
                             f"{self.device.memory_GiB:g} GiB")
        if self.compute is None:
            object.__setattr__(self, "compute", default_compute(self.device.name))
        if self.training.attention == "unfused" and isinstance(self.compute, EfficiencyCurve):
            require_bandwidth(self.device)  # the curve prices the score passes at it: SynthError naming the fix
        capability = self.topology.levels[-1].compute_capability
        if self.training.fp8 and capability is not None and capability < 8.9:
            raise SynthError(f"--dtype fp8: topology '{self.topology.name}' has GPUs of compute capability "
                             f"{capability:.1f}, without FP8 tensor cores (Ada 8.9, Hopper 9.0 and newer have them); "
                             "plan with --dtype bf16")
        for a in self.axes:
            if a.name not in PLANNER_AXES:
                raise SynthError(f"--axes: unknown axis '{a.name}'; the planner's axes are tp, cp, ep, dp and pp")
        if self.micro_batches is not None:
            for b in self.micro_batches:
                if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                    raise SynthError(f"--micro-batch {b!r}: micro-batch sizes must be integers >= 1")
        # constraints name declared axes and known levels
        dummy = tuple(Axis(a.name, 1) for a in self.axes)
        for c in self.constraints:
            parse_constraint(str(c), dummy, self.topology)

    @property
    def usable_bytes(self) -> float:
        """Bytes per device a configuration may use: the device's less the margin."""
        return self.device.memory_bytes - (self.memory_margin_GiB or 0.0) * 2**30

    @property
    def recompute_text(self) -> str:
        """``--recompute`` as asked: a mode or ``search``."""
        return "search" if self.recompute_search else self.training.recompute.value

    def micro_batches_for(self, replicas: int) -> tuple[int, ...]:
        """The micro-batches to try with ``replicas`` data-parallel replicas
        (dp x ep; they divide the batch)."""
        if self.micro_batches is not None:
            return self.micro_batches
        per_replica = self.training.global_batch // replicas
        return tuple(1 << k for k in range(per_replica.bit_length()) if per_replica % (1 << k) == 0)

