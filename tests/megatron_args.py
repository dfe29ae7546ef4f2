"""Megatron-LM's argument parser and ``validate_args``, as far as they concern
the arguments ``synth-reduce export --format megatron`` writes.

Megatron-LM's training arguments (``megatron/training/arguments.py``) are not
in the megatron-core wheel the test extra installs, and no installable package
provides them; this module states, in this project's words, the options and the
rules of NVIDIA/Megatron-LM at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553,
each with the file and line it comes from. Where a rule lives in megatron-core
(the model's own checks in ``TransformerConfig.__post_init__``, the
micro-batch arithmetic of ``num_microbatches_calculator``), the tests call the
installed megatron-core itself (:func:`core_checks`).
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

ARGS = "megatron/training/arguments.py"
TC = "megatron/core/transformer/transformer_config.py"
MPC = "megatron/core/model_parallel_config.py"
TRAIN = "megatron/training/config/training_config.py"
COMMON = "megatron/training/config/common_config.py"

# option -> (type or "switch", where Megatron-LM defines it). Options built from
# a config dataclass's field (ArgumentGroupFactory, arguments.py:2373 for
# TransformerConfig) cite the field; their spelling is the field's name with
# '-' for '_' unless the field's metadata names it.
OPTIONS: dict[str, tuple[Any, str]] = {
    "--tensor-model-parallel-size": (int, f"{MPC}:55"),
    "--pipeline-model-parallel-size": (int, f"{MPC}:83"),
    "--context-parallel-size": (int, f"{MPC}:100"),
    "--expert-model-parallel-size": (int, f"{MPC}:127"),
    "--num-layers": (int, f"{TC}:65"),
    "--hidden-size": (int, f"{TC}:145"),
    "--num-attention-heads": (int, f"{TC}:148"),
    "--num-query-groups": (int, f"{TC}:175"),
    "--ffn-hidden-size": (int, f"{TC}:180"),
    "--kv-channels": (int, f"{TC}:184"),
    "--normalization": (("LayerNorm", "RMSNorm"), f"{TC}:256"),
    "--disable-bias-linear": ("switch-off", f"{TC}:213 (add_bias_linear, named --disable-bias-linear)"),
    "--recompute-granularity": (("full", "selective"), f"{TC}:532"),
    "--recompute-method": (("uniform", "block"), f"{TC}:543"),
    "--recompute-num-layers": (int, f"{TC}:551"),
    "--fp8-format": (("e4m3", "hybrid"), f"{TC}:588 (fp8, named --fp8-format)"),
    "--moe-shared-expert-intermediate-size": (int, f"{TC}:701"),
    "--moe-ffn-hidden-size": (int, f"{TC}:740"),
    "--moe-router-topk": (int, f"{TC}:760"),
    "--moe-token-dispatcher-type": (("allgather", "alltoall", "flex"), f"{TC}:891"),
    "--moe-expert-capacity-factor": (float, f"{TC}:917"),
    "--moe-pad-expert-input-to-capacity": ("switch", f"{TC}:921"),
    "--sequence-parallel": ("switch", f"{MPC}:94"),
    "--fp16": ("switch", f"{MPC}:177"),
    "--bf16": ("switch", f"{MPC}:180"),
    "--tp-comm-overlap": ("switch", f"{MPC}:265"),
    "--group-query-attention": ("switch", f"{ARGS}:2382"),
    "--multi-latent-attention": ("switch", f"{TC}:288"),
    "--qk-layernorm": ("switch", f"{TC}:259"),
    "--q-lora-rank": (int, f"{ARGS}:3548"),
    "--kv-lora-rank": (int, f"{ARGS}:3550"),
    "--qk-head-dim": (int, f"{ARGS}:3552"),
    "--qk-pos-emb-head-dim": (int, f"{ARGS}:3554"),
    "--v-head-dim": (int, f"{ARGS}:3556"),
    "--max-position-embeddings": (int, f"{ARGS}:2394"),
    "--position-embedding-type": (("learned_absolute", "rope", "yarn", "mrope", "relative", "none"), f"{ARGS}:2397"),
    "--squared-relu": ("switch", f"{ARGS}:2448"),
    "--swiglu": ("switch", f"{ARGS}:2450"),
    "--untie-embeddings-and-output-weights": ("switch", f"{ARGS}:2460"),
    "--no-gradient-accumulation-fusion": ("switch-off", f"{ARGS}:2944"),
    "--decoder-first-pipeline-num-layers": (int, f"{ARGS}:3095"),
    "--decoder-last-pipeline-num-layers": (int, f"{ARGS}:3099"),
    "--num-layers-per-virtual-pipeline-stage": (int, f"{ARGS}:3114"),
    "--overlap-grad-reduce": ("switch", f"{ARGS}:3121"),
    "--ddp-bucket-size": (int, f"{ARGS}:3125"),
    "--overlap-param-gather": ("switch", f"{ARGS}:3148"),
    "--use-distributed-optimizer": ("switch", f"{ARGS}:3156"),
    "--seq-length": (int, f"{ARGS}:3305"),
    "--num-experts": (int, f"{ARGS}:3518"),
    "--moe-layer-freq": ("freq", f"{ARGS}:3520 (moe_freq_type, {ARGS}:327: an int or a Python list expression)"),
    "--micro-batch-size": (int, f"{TRAIN}:11"),
    "--global-batch-size": (int, f"{TRAIN}:15"),
    "--use-torch-fsdp2": ("switch", f"{COMMON}:95"),
    "--cross-entropy-loss-fusion": ("switch", f"{MPC}:320"),
    "--hidden-dropout": (float, f"{TC}:188"),
    "--attention-dropout": (float, f"{TC}:191"),
    "--cp-comm-type": ("list", f"{ARGS}:3221 (nargs '+', default ['p2p']; one value becomes a string, "
                               "megatron/training/argument_utils.py:343-344)"),
}

# the values Transformer Engine's attention takes as ``cp_comm_type`` (Megatron-LM
# hands the option on as written: megatron/core/extensions/transformer_engine.py:2153):
# the branches of ``attn_forward_func_with_cp`` in this file of Transformer Engine
TE_CP = "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py"
TE_CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")

# the dataclass field each option of megatron-core's configs sets (what the test
# checks against the installed megatron-core: the option exists there too)
CORE_FIELDS = {"--tensor-model-parallel-size": "tensor_model_parallel_size",
               "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
               "--context-parallel-size": "context_parallel_size",
               "--expert-model-parallel-size": "expert_model_parallel_size", "--num-layers": "num_layers",
               "--hidden-size": "hidden_size", "--num-attention-heads": "num_attention_heads",
               "--num-query-groups": "num_query_groups", "--ffn-hidden-size": "ffn_hidden_size",
               "--kv-channels": "kv_channels", "--normalization": "normalization",
               "--disable-bias-linear": "add_bias_linear", "--recompute-granularity": "recompute_granularity",
               "--recompute-method": "recompute_method", "--recompute-num-layers": "recompute_num_layers",
               "--fp8-format": "fp8", "--moe-shared-expert-intermediate-size": "moe_shared_expert_intermediate_size",
               "--moe-ffn-hidden-size": "moe_ffn_hidden_size", "--moe-router-topk": "moe_router_topk",
               "--moe-token-dispatcher-type": "moe_token_dispatcher_type",
               "--moe-expert-capacity-factor": "moe_expert_capacity_factor",
               "--moe-pad-expert-input-to-capacity": "moe_pad_expert_input_to_capacity",
               "--sequence-parallel": "sequence_parallel", "--fp16": "fp16", "--bf16": "bf16",
               "--tp-comm-overlap": "tp_comm_overlap", "--cp-comm-type": "cp_comm_type",
               "--cross-entropy-loss-fusion": "cross_entropy_loss_fusion", "--hidden-dropout": "hidden_dropout",
               "--attention-dropout": "attention_dropout", "--multi-latent-attention": "multi_latent_attention",
               "--qk-layernorm": "qk_layernorm"}


def _freq(text: str) -> int | list[int]:
    """``moe_freq_type`` (arguments.py:327): an int, or a list expression evaluated."""
    if "[" not in text:
        return int(text)
    value = eval(text, {"__builtins__": {}})  # noqa: S307 (Megatron-LM evaluates the pattern the same way)
    if not isinstance(value, list) or any(v not in (0, 1) for v in value):
        raise argparse.ArgumentTypeError(f"--moe-layer-freq {text}: not a list of 0 and 1")
    return value


def parser() -> argparse.ArgumentParser:
    """An argparse parser of :data:`OPTIONS` with Megatron-LM's dests
    (``exit_on_error`` off: an unknown option or a bad value raises)."""
    p = argparse.ArgumentParser(prog="pretrain_gpt.py", exit_on_error=False, allow_abbrev=False)
    for option, (kind, _) in OPTIONS.items():
        if option == "--disable-bias-linear":
            p.add_argument(option, dest="add_bias_linear", action="store_false")
        elif option == "--fp8-format":
            p.add_argument(option, dest="fp8", choices=kind)
        elif kind == "switch":
            p.add_argument(option, action="store_true")
        elif kind == "switch-off":
            p.add_argument(option, dest="gradient_accumulation_fusion", action="store_false")
        elif kind == "freq":
            p.add_argument(option, type=_freq, default=1)
        elif kind == "list":
            p.add_argument(option, nargs="+", type=str, default=["p2p"])
        elif isinstance(kind, tuple):
            p.add_argument(option, choices=kind)
        else:
            p.add_argument(option, type=kind)
    p.set_defaults(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
                   expert_model_parallel_size=1, ckpt_format="torch_dist")  # TRAIN:486 (ckpt_format)
    return p


def parse(arguments: list[str]) -> argparse.Namespace:
    """Megatron-LM's parse: SystemExit/ArgumentError on an unknown option or bad value."""
    args, unknown = parser().parse_known_args(arguments)
    if unknown:
        raise AssertionError(f"Megatron-LM has no option {unknown[0]}")
    return args


def validate(args: argparse.Namespace, world_size: int) -> None:
    """The rules of ``validate_args`` (arguments.py:389) that the exported
    options reach, in its order; AssertionError with the rule's line."""
    def rule(ok: bool, line: int, what: str) -> None:
        if not ok:
            raise AssertionError(f"{ARGS}:{line}: {what}")

    a = args
    model = a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size
    rule(world_size % model == 0, 432, f"world size {world_size} % (tp x pp x cp = {model})")
    rule("a2a+p2p" not in a.cp_comm_type, 583, "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes")
    rule(a.micro_batch_size is not None and a.micro_batch_size > 0, 693, "micro batch size > 0")
    rule(a.global_batch_size is None or a.global_batch_size > 0, 705, "global batch size > 0")
    pp = a.pipeline_model_parallel_size
    uneven = a.decoder_first_pipeline_num_layers is not None or a.decoder_last_pipeline_num_layers is not None
    if a.num_layers_per_virtual_pipeline_stage is not None:
        rule(not uneven, 955, "virtual stages with uneven first/last stages need --num-virtual-stages-per-pipeline-rank")
        rule(a.num_layers % pp == 0, 968, f"layers {a.num_layers} % pp {pp}")
        rule((a.num_layers // pp) % a.num_layers_per_virtual_pipeline_stage == 0, 972,
             "layers per stage % layers per virtual stage")
        vpp = (a.num_layers // pp) // a.num_layers_per_virtual_pipeline_stage
        if vpp > 1:  # arguments.py:1000-1006 (overlap_p2p_comm defaults on: pp > 2 for vpp)
            rule(pp > 1, 1002, "virtual stages need pp > 1")
    elif not uneven:
        rule(a.num_layers % pp == 0, 997, f"layers {a.num_layers} % pp {pp}")
    if a.overlap_param_gather:
        rule(a.use_distributed_optimizer, 1025, "--overlap-param-gather only with the distributed optimizer")
        rule(a.overlap_grad_reduce, 1028, "--overlap-param-gather needs --overlap-grad-reduce")
    if a.use_torch_fsdp2:
        rule(pp == 1, 1034, "--use-torch-fsdp2 with pipeline parallelism")
        rule(a.expert_model_parallel_size == 1, 1036, "--use-torch-fsdp2 with expert parallelism")
        rule(not a.use_distributed_optimizer, 1038, "--use-torch-fsdp2 with the distributed optimizer")
        rule(not a.gradient_accumulation_fusion, 1040, "--use-torch-fsdp2 with gradient accumulation fusion "
             "(on unless --no-gradient-accumulation-fusion)")
        rule(a.ckpt_format in ("torch_dist", "torch_dcp"), 1042, "--use-torch-fsdp2 checkpoint format")
        rule(a.untie_embeddings_and_output_weights, 1044, "--use-torch-fsdp2 needs --untie-embeddings-and-output-weights")
        rule(not a.fp16, 1046, "--use-torch-fsdp2 with fp16")
    rule(not (a.fp16 and a.bf16), 1196, "--fp16 with --bf16")
    for required in ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings"):
        rule(getattr(a, required) is not None, 1314, f"--{required.replace('_', '-')} is required")
    if a.kv_channels is None:
        rule(a.hidden_size % a.num_attention_heads == 0, 1332,
             f"hidden {a.hidden_size} % heads {a.num_attention_heads} without --kv-channels")
    if a.seq_length is not None and a.context_parallel_size > 1:
        rule(a.seq_length % (2 * a.context_parallel_size) == 0, 1336, "seq length % (2 x cp)")
    if a.seq_length is not None:
        rule(a.max_position_embeddings >= a.seq_length, 1354, "max position embeddings >= seq length")
    if a.recompute_granularity == "selective":
        rule(a.recompute_method is None, 1426, "no recompute method with selective recomputation")
    sequence_parallel = a.sequence_parallel and a.tensor_model_parallel_size > 1  # arguments.py:1433-1439
    if a.tp_comm_overlap:
        rule(sequence_parallel, 1442, "--tp-comm-overlap needs sequence parallelism")
    for kind in a.cp_comm_type:  # not validate_args: Transformer Engine's attention refuses any other
        if kind not in TE_CP_COMM_TYPES:
            raise AssertionError(f"{TE_CP}: --cp-comm-type {kind}: Transformer Engine takes "
                                 f"{', '.join(TE_CP_COMM_TYPES)}")
    if a.expert_model_parallel_size > 1:
        rule(a.num_experts is not None, 1656, "expert parallelism without --num-experts")
        rule(a.num_experts % a.expert_model_parallel_size == 0, 1657, "experts % ep")
    if a.multi_latent_attention:
        rule(not a.group_query_attention, 1974, "group query attention with multi latent attention")


def core_checks(args: argparse.Namespace, world_size: int) -> None:
    """megatron-core's own checks, from the installed package: the model's
    ``TransformerConfig`` (heads, query groups and experts against tp, the
    recomputation and MoE settings) and the micro-batch calculator
    (global batch = micro-batch x dp x micro-batches)."""
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer import TransformerConfig

    a = args
    known = {f.name for f in dataclasses.fields(TransformerConfig)}
    for option, name in CORE_FIELDS.items():
        assert name in known, f"the installed megatron-core's TransformerConfig has no {name} ({option})"
    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size
    kwargs = dict(num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=a.num_attention_heads,
                  kv_channels=a.kv_channels, ffn_hidden_size=a.ffn_hidden_size,
                  num_query_groups=a.num_query_groups if a.group_query_attention else None,
                  tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, context_parallel_size=cp,
                  expert_model_parallel_size=a.expert_model_parallel_size,
                  sequence_parallel=a.sequence_parallel and tp > 1, gated_linear_unit=a.swiglu,
                  add_bias_linear=a.add_bias_linear, normalization=a.normalization or "LayerNorm",
                  bf16=a.bf16, fp16=a.fp16, recompute_granularity=a.recompute_granularity,
                  recompute_method=a.recompute_method, recompute_num_layers=a.recompute_num_layers,
                  cp_comm_type=a.cp_comm_type[0] if len(a.cp_comm_type) == 1 else a.cp_comm_type,
                  cross_entropy_loss_fusion=a.cross_entropy_loss_fusion,
                  **{k: getattr(a, k) for k in ("hidden_dropout", "attention_dropout") if getattr(a, k) is not None})
    if pp > 1:
        kwargs["pipeline_dtype"] = __import__("torch").bfloat16 if a.bf16 else __import__("torch").float16
    if a.num_experts:
        kwargs.update(num_moe_experts=a.num_experts, moe_router_topk=a.moe_router_topk,
                      moe_ffn_hidden_size=a.moe_ffn_hidden_size,
                      moe_shared_expert_intermediate_size=a.moe_shared_expert_intermediate_size,
                      moe_token_dispatcher_type=a.moe_token_dispatcher_type,
                      moe_expert_capacity_factor=a.moe_expert_capacity_factor,
                      moe_pad_expert_input_to_capacity=a.moe_pad_expert_input_to_capacity,
                      moe_layer_freq=a.moe_layer_freq)
    config = TransformerConfig
    if a.multi_latent_attention:  # Megatron-LM builds an MLATransformerConfig (arguments.py's core config)
        from megatron.core.transformer.transformer_config import MLATransformerConfig as config

        kwargs.update(multi_latent_attention=True, q_lora_rank=a.q_lora_rank, kv_lora_rank=a.kv_lora_rank,
                      qk_head_dim=a.qk_head_dim, qk_pos_emb_head_dim=a.qk_pos_emb_head_dim, v_head_dim=a.v_head_dim,
                      qk_layernorm=a.qk_layernorm)
    config(**kwargs)
    dp = world_size // (tp * pp * cp)
    ConstantNumMicroBatchesCalculator(a.global_batch_size, a.micro_batch_size, dp, False, 0)
