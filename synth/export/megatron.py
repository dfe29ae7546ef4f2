"""Megatron-LM arguments from a plan, and the renumbering that makes
Megatron's own groups the plan's.

Megatron-LM forms its groups from rank order (``parallel_state``'s
``RankGenerator``, order ``tp-cp-ep-dp-pp``, first fastest). Launched with the
rank map of :mod:`synth.export.rank_map` (rank ``r`` on device
``device_of_rank[r]``), its tensor, data and pipeline groups are the plan's,
whatever the placement. Arguments (Megatron-LM's spelling):

* parallel sizes: ``--tensor-model-parallel-size``,
  ``--pipeline-model-parallel-size``, and ``--context-parallel-size`` /
  ``--expert-model-parallel-size`` where the plan has those axes;
* from a job plan: the model's shape (``--num-layers``, ``--hidden-size``,
  ``--ffn-hidden-size``, ``--num-attention-heads``, ``--kv-channels`` (the
  head width, where it is not hidden / heads), ``--group-query-attention``
  with ``--num-query-groups``, the layer the planner counts (``--swiglu`` or
  ``--squared-relu``, ``--normalization RMSNorm``, ``--position-embedding-type
  rope``, ``--disable-bias-linear``; a ReLU MLP is refused; multi-head latent
  attention's ``--multi-latent-attention`` with its ranks, head widths and
  ``--qk-layernorm``; for a model with
  experts ``--num-experts``, ``--moe-router-topk``, ``--moe-ffn-hidden-size``,
  ``--moe-shared-expert-intermediate-size``, ``--moe-layer-freq`` for dense
  first layers, the capacity factor, and the all-to-all dispatcher),
  ``--seq-length``,
  ``--max-position-embeddings``, ``--untie-embeddings-and-output-weights``),
  ``--micro-batch-size``, ``--global-batch-size``, the loss and the dropout
  the plan priced (``--cross-entropy-loss-fusion`` for the fused loss,
  ``--hidden-dropout`` and ``--attention-dropout`` at the model's ``dropout``
  and ``attention_dropout``:
  :func:`_loss_and_dropout`), ``--bf16``/``--fp16``, the
  recomputation (``--recompute-granularity selective``, or ``full`` with
  ``--recompute-method uniform --recompute-num-layers 1``), interleaving
  (``--num-layers-per-virtual-pipeline-stage``), the optimizer sharding
  (``--use-distributed-optimizer`` for ZeRO-1, ``--use-torch-fsdp2`` with
  ``--no-gradient-accumulation-fusion`` for ZeRO-3 of an untied model without pp or ep), ``--overlap-grad-reduce``,
  ``--overlap-param-gather`` when planned with it (with the distributed
  optimizer and ``--overlap-grad-reduce``, which Megatron-LM asks beside it,
  arguments.py:1024-1029), and the DP bucket (``--ddp-bucket-size``, in
  gradient elements: the planner's bucket bytes over the bytes it reduced each
  gradient in, 4 for Megatron-LM's fp32 main gradients under bf16).

``--sequence-parallel`` when the planned configuration runs it (the
planner's default where tp > 1), with ``--tp-comm-overlap`` when planned
with ``--tp-overlap``, and uneven pipeline stages
(``plan --stages uneven``) as ``--decoder-first-pipeline-num-layers`` and
``--decoder-last-pipeline-num-layers``, and ``--cp-comm-type all_gather``
for a plan made with ``--cp-comm allgather`` (:data:`_ALL_GATHER_CP`). Refused with the reason: a
zero-bubble schedule (not in Megatron-LM's main line), DualPipe (not in
Megatron-LM) and ZeRO-2 (Megatron-LM shards gradients only with FSDP).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from ..errors import SynthError
from ..plan import Plan
from ..planner.frameworks import FRAMEWORK_CHOICES
from ..planner.stepmodel import DTYPE_BYTES
from ..planner.training import gradient_reduce_bytes
from ..planner.transformer import family_defaults
from .rank_map import MEGATRON_ORDER, RankMap, rank_map
from .trainer import TrainerJob, renamed, trainer_job


@dataclass(frozen=True)
class MegatronExport:
    """Megatron-LM's arguments and the rank map to launch them with."""

    arguments: tuple[str, ...]
    ranks: RankMap

    def to_dict(self) -> dict[str, Any]:
        return {"format": "megatron", "arguments": list(self.arguments), "order": self.ranks.order_text,
                "renumbering_needed": not self.ranks.is_identity, "rank_map": self.ranks.to_dict()}


def _sizes(ranks: RankMap) -> list[str]:
    args = ["--tensor-model-parallel-size", str(ranks.size("tp")),
            "--pipeline-model-parallel-size", str(ranks.size("pp"))]
    if "cp" in ranks.order:
        args += ["--context-parallel-size", str(ranks.size("cp"))]
    if "ep" in ranks.order:
        args += ["--expert-model-parallel-size", str(ranks.size("ep"))]
    return args


def _architecture(model: dict[str, Any]) -> list[str]:
    """The layer the planner counted (``Transformer``'s defaults for fields a
    plan written before them lacks: a gated MLP is Llama's RMSNorm, rotary
    positions and no biases): MLP, norm, positions and biases."""
    mlp = model.get("mlp", "swiglu" if model.get("gated_mlp") is True else "gelu")
    defaults = family_defaults(mlp)
    if mlp == "relu":
        raise SynthError("plan: Megatron-LM's arguments have no plain ReLU MLP (--swiglu, --squared-relu or its "
                         "default GeLU); plan the model with mlp: gelu or squared_relu")
    args = {"swiglu": ["--swiglu"], "squared_relu": ["--squared-relu"]}.get(mlp, [])
    if model.get("norm", defaults["norm"]) == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if model.get("positions", defaults["positions"]) == "rotary":
        args += ["--position-embedding-type", "rope"]
    if not model.get("biases", defaults["biases"]):
        args += ["--disable-bias-linear"]
    return args + _experts(model)


def _latent_attention(model: dict[str, Any]) -> list[str]:
    """Megatron-LM's multi-head latent attention for a model with an ``mla``
    block: ``--multi-latent-attention`` with its ranks and head widths
    (``_add_mla_args``, megatron/training/arguments.py:3546-3557 at
    d98e8a64dd; ``--qk-head-dim`` is the part without positions) and
    ``--qk-layernorm``, which gives its two latents their norms (the
    layer-norm-fused up-projections of gpt_layer_specs.py:104-114), as the
    planner counts them."""
    mla = model.get("mla")
    if not isinstance(mla, dict):
        return []
    return ["--multi-latent-attention", "--q-lora-rank", str(mla["q_lora_rank"]), "--kv-lora-rank",
            str(mla["kv_lora_rank"]), "--qk-head-dim", str(mla["qk_nope_head_dim"]), "--qk-pos-emb-head-dim",
            str(mla["qk_rope_head_dim"]), "--v-head-dim", str(mla["v_head_dim"]), "--qk-layernorm"]


def _experts(model: dict[str, Any]) -> list[str]:
    """Megatron-LM's MoE arguments for a model with a ``moe`` block: experts,
    top-k, the experts' width, shared experts, which layers are MoE, the
    capacity (padded to it) or dropless, and the all-to-all token dispatcher
    the planner prices."""
    moe = model.get("moe")
    if not isinstance(moe, dict):
        return []
    args = ["--num-experts", str(moe["experts"]), "--moe-router-topk", str(moe["top_k"]),
            "--moe-ffn-hidden-size", str(moe["expert_ffn"]), "--moe-token-dispatcher-type", "alltoall"]
    if moe.get("shared_experts"):
        args += ["--moe-shared-expert-intermediate-size", str(moe["shared_experts"] * moe["expert_ffn"])]
    dense = moe.get("dense_layers", 0)
    if dense:
        args += ["--moe-layer-freq", f"([0]*{dense}+[1]*{model['layers'] - dense})"]
    if moe.get("capacity_factor") is not None:
        args += ["--moe-expert-capacity-factor", f"{moe['capacity_factor']:g}", "--moe-pad-expert-input-to-capacity"]
    return args


def _loss_and_dropout(job: TrainerJob) -> list[str]:
    """The loss and the dropout the plan priced, which Megatron-LM's defaults
    are not: its loss is the unfused one unless ``--cross-entropy-loss-fusion``
    (``cross_entropy_loss_fusion``, megatron/core/model_parallel_config.py:320,
    default off), which the planner's ``fused`` loss is; its dropouts are 0.1
    unless set (``hidden_dropout``, ``attention_dropout``,
    megatron/core/transformer/transformer_config.py:188, 191), and the plan
    priced the model's ``dropout`` (the residual branches' and the embedding's)
    and ``attention_dropout`` (the attention kernel's), each 0 unless the model
    file says, written as ``--hidden-dropout`` and ``--attention-dropout``."""
    dropout, attention = job.model.get("dropout", 0.0), job.model.get("attention_dropout", 0.0)
    args = ["--cross-entropy-loss-fusion"] if job.cross_entropy == "fused" else []
    return args + ["--hidden-dropout", f"{dropout:g}", "--attention-dropout", f"{attention:g}"]


def _job(job: TrainerJob, pp: int, ep: int = 1) -> list[str]:
    model = job.model
    layers, hidden, heads = model["layers"], model["hidden"], model["heads"]
    args = ["--num-layers", str(layers), "--hidden-size", str(hidden), "--num-attention-heads", str(heads),
            "--seq-length", str(model["seq"]), "--max-position-embeddings", str(model["seq"])]
    head_dim = model.get("head_dim") or hidden // heads
    if hidden % heads or head_dim != hidden // heads:  # Megatron-LM takes hidden / heads only when it divides
        args += ["--kv-channels", str(head_dim)]
    if isinstance(model.get("ffn"), int):
        args += ["--ffn-hidden-size", str(model["ffn"])]
    kv = model.get("kv_heads")
    if isinstance(kv, int) and kv != heads:
        args += ["--group-query-attention", "--num-query-groups", str(kv)]
    args += _latent_attention(model)
    args += _architecture(model)
    if model.get("tied_embeddings") is False:
        args += ["--untie-embeddings-and-output-weights"]
    args += ["--micro-batch-size", str(job.micro_batch), "--global-batch-size", str(job.global_batch)]
    args += _loss_and_dropout(job)
    if job.dtype in ("bf16", "fp16"):
        args += [f"--{job.dtype}"]
    elif job.dtype == "fp8":  # BF16 training with Transformer Engine's FP8 GEMMs (E4M3 forward, E5M2 backward)
        args += ["--bf16", "--fp8-format", "hybrid"]
    if job.sequence_parallel:
        args += ["--sequence-parallel"]
        if job.tp_overlap:
            args += ["--tp-comm-overlap"]
    if job.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif job.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if job.stage_layers:
        if len(job.stage_layers) != pp or len(set(job.stage_layers[1:-1])) > 1:
            raise SynthError(f"plan: Megatron-LM runs uneven stages as a first and a last stage of their own and "
                             f"equal stages between; the plan's {list(job.stage_layers)} over pp={pp} is not")
        args += ["--decoder-first-pipeline-num-layers", str(job.stage_layers[0]),
                 "--decoder-last-pipeline-num-layers", str(job.stage_layers[-1])]
    if job.virtual_stages > 1:
        if job.stage_layers:
            raise SynthError("plan: Megatron-LM takes virtual stages on uneven stages only as a "
                             "--pipeline-model-parallel-layout, which this export does not write; plan with --stages "
                             "even or another --schedule")
        if layers % (pp * job.virtual_stages):
            raise SynthError(f"plan: {layers} layers do not split into {pp} stages x {job.virtual_stages} "
                             "virtual stages")
        args += ["--num-layers-per-virtual-pipeline-stage", str(layers // (pp * job.virtual_stages))]
    if job.schedule == "zero-bubble" and pp > 1:
        raise SynthError("plan: Megatron-LM has no zero-bubble schedule (sail-sg's fork of it adds "
                         "--enable-zero-bubble); plan with --schedule 1f1b or interleaved, or export --format "
                         "torchtitan")
    if job.schedule == "dualpipe" and pp > 1:
        raise SynthError("plan: Megatron-LM (core 0.16) has no DualPipe schedule (DeepSeek's, two stages per rank); "
                         "plan with --schedule 1f1b or interleaved")
    if job.sharding == "zero2":
        raise SynthError("plan: Megatron-LM has no ZeRO-2 (its distributed optimizer shards the optimizer states: "
                         "plan with --sharding zero1; or export --format torchtitan, whose FSDP never resharding "
                         "after the forward is ZeRO-2's memory)")
    if job.sharding == "hsdp":
        raise SynthError("plan: the plan shards with HSDP, which this export does not write for Megatron-LM; plan "
                         "with --sharding zero1 or zero3, or export --format torchtitan (its FSDP runs HSDP)")
    if job.sharding == "zero1":
        args += ["--use-distributed-optimizer"]
    elif job.sharding == "zero3":
        if model.get("tied_embeddings", True):
            raise SynthError("plan: Megatron-LM's --use-torch-fsdp2 (ZeRO-3) needs untied embeddings "
                             "(--untie-embeddings-and-output-weights) and this model ties them; plan with --sharding "
                             "zero1, or export --format torchtitan")
        if pp > 1 or ep > 1:
            raise SynthError("plan: Megatron-LM's --use-torch-fsdp2 (ZeRO-3) runs without pipeline and expert "
                             "parallelism; plan with --sharding zero1, or export --format torchtitan")
        args += ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion"]  # FSDP2 refuses the fusion
    if job.overlap_dp:
        args += ["--overlap-grad-reduce"]
    if job.overlap_param_gather:  # Megatron-LM asks both beside it (arguments.py:1024-1029)
        if job.sharding != "zero1" or not job.overlap_dp:
            raise SynthError("plan: --overlap-param-gather needs Megatron-LM's distributed optimizer (--sharding "
                             "zero1) and overlapped gradient reduction; plan with --sharding zero1 and the default "
                             "DP overlap")
        args += ["--overlap-param-gather"]
    if job.bucket_bytes is not None:  # in gradient elements, of the values the plan reduced them in
        args += ["--ddp-bucket-size", str(job.bucket_bytes // _reduce_bytes(job))]
    return args


def _reduce_bytes(job: TrainerJob) -> int:
    """Bytes of one gradient element in the plan's DP buckets (Megatron-LM
    under bf16: fp32 main gradients, :func:`gradient_reduce_bytes`)."""
    if job.framework in FRAMEWORK_CHOICES and job.dtype in DTYPE_BYTES:
        return gradient_reduce_bytes(job.framework, job.dtype)
    return DTYPE_BYTES.get(job.dtype, 2)


# Llama 3's context parallelism (``--cp-comm allgather``: keys and values
# all-gathered before the attention) is Transformer Engine's ``all_gather``
# (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py,
# the ``cp_comm_type == "all_gather"`` branch of ``attn_forward_func_with_cp``,
# AttnFuncWithCPAndKVAllGather). Megatron-LM passes ``--cp-comm-type`` to it as
# written (megatron/training/argument_utils.py:343-344 makes one value a string;
# megatron/core/extensions/transformer_engine.py:2153 hands it on), so the
# spelling is Transformer Engine's, not the "allgather" of the option's help
# text (arguments.py:3221-3226). Its default ``p2p`` is the ring the planner
# prices by default, and is left unwritten.
_ALL_GATHER_CP = ("--cp-comm-type", "all_gather")


def megatron_export(plan: Plan, axis_names: dict[str, str] | None = None) -> MegatronExport:
    """Megatron-LM's arguments for ``plan`` and its rank map in Megatron's
    order (``tp-cp-ep-dp-pp``)."""
    placement = renamed(plan.placement, axis_names or {})
    order = tuple(a for a in MEGATRON_ORDER if a in [x.name for x in placement.axes])
    ranks = rank_map(placement, order)
    args = _sizes(ranks)
    job = trainer_job(plan)
    if job is not None:
        args += _job(job, ranks.size("pp"), ranks.size("ep"))
        if job.cp_comm == "allgather" and "cp" in ranks.order and ranks.size("cp") > 1:
            args += _ALL_GATHER_CP
    return MegatronExport(tuple(args), ranks)


def megatron_text(export: MegatronExport, plan_path: str, launch: str) -> str:
    """The arguments as a shell line, and how to launch them on the plan's
    devices (``launch``: :func:`~synth.export.rank_map.launch_command`)."""
    ranks = export.ranks
    lines = ["# Megatron-LM arguments from " + plan_path, shlex.join(export.arguments), ""]
    if ranks.is_identity:
        lines.append(f"# rank order {ranks.order_text}: torchrun's ranks already form the plan's groups "
                     "(no renumbering)")
    else:
        lines += [f"# rank order {ranks.order_text}: Megatron's groups are the plan's when rank r runs on device "
                  "device_of_rank[r]; launch through the renumbering launcher:", f"#   {launch}",
                  f"# device_of_rank {list(ranks.device_of_rank)}"]
    return "\n".join(lines) + "\n"
