"""torchtitan's Llama without ``torch.compile`` (``--framework torchtitan``):
its RMSNorm, rotary positions and grouped keys' copies as the eager kernel
chains its source writes (:func:`torchtitan_eager_ops`,
:mod:`synth.planner.eagerops`), on the layer model of
:mod:`synth.planner.layercompute`; the forward its operator-level selective
checkpointing runs again (:func:`torchtitan_recompute_ops`) and the kernels
one of its layers launches (:func:`torchtitan_layer_launches`).
"""

from __future__ import annotations

from .eagerops import (REPEAT_KV_LAUNCHES, RMS_NORM_BYTES, RMS_NORM_LAUNCHES, ROTARY_BYTES, ROTARY_LAUNCHES,
                       repeat_kv_bytes)
from .layercompute import EAGER_LAUNCHES, layer_launches, rotary_values
from .operations import OperationProfile
from .optimes import ComputeTime, OpTime, Shard, bytes_pass_ops, gemm_ops
from .transformer import Transformer


def torchtitan_eager_ops(profile: OperationProfile, model: Transformer, shard: Shard,
                         ops: ComputeTime) -> ComputeTime:
    """``ops`` (a layer's, or the head's) as torchtitan's Llama runs them
    without ``torch.compile`` (:mod:`synth.planner.eagerops`): each RMSNorm
    (``norm1``, ``norm2``, ``final_norm``) and the rotary positions priced by
    the bytes their fp32 kernel chains move in place of the profile's fused
    rates, and, in a layer with fewer key heads than query heads, the keys'
    and values' copies for the attention (``repeat_kv``) added. Models
    without RMSNorm, rotary positions or grouped queries keep those
    operations as they are."""
    h, replicated = model.hidden, shard.replicated_tokens
    new: dict[str, list[OpTime]] = {}
    if model.norm == "rmsnorm":
        for name in ("norm1", "norm2", "final_norm"):
            new[name] = bytes_pass_ops(profile, name, replicated * h, RMS_NORM_BYTES)
    if model.positions == "rotary":
        new["rotary"] = bytes_pass_ops(profile, "rotary", rotary_values(model, shard), ROTARY_BYTES)
    names = {op.name for op in ops.ops}
    kept = [op for op in ops.ops if op.name.removesuffix(".backward") not in new]
    added = [op for name, passes in new.items() if name in names for op in passes]
    copies = repeat_kv_bytes(model.heads // model.kv_heads)
    if copies[0] and "qkv" in names:  # a layer: the keys and the values, each copied
        added += bytes_pass_ops(profile, "repeat_kv", 2 * shard.tokens * model.kv_dim // shard.tp, copies)
    return ComputeTime(tuple(kept + added))


def torchtitan_recompute_ops(profile: OperationProfile, model: Transformer, shard: Shard,
                             layer: ComputeTime) -> ComputeTime:
    """What torchtitan's operator-level selective checkpointing
    (``selective_ac_option = "op"``) recomputes in one layer's backward: the
    forward of every second GEMM in the order the layer runs them (wk, wo, w3
    of wq, wk, wv, wo, w1, w3, w2; wk, wo, down for an ungated MLP) at its own
    shape, and of every elementwise operation (norms, residual adds, the
    activation, rotary positions, the keys' and values' copies for grouped
    queries), none of which it saves; the attention core's
    output is saved and not recomputed (the memory side:
    :func:`synth.planner.frameworks.sac_activation_bytes`)."""
    t, tokens, h, f, kv, q = shard.tp, shard.tokens, model.hidden, model.ffn, model.kv_dim, model.q_dim
    gemms = [("wq", h, q // t), ("wk", h, kv // t), ("wv", h, kv // t), ("wo", q // t, h)]
    gemms += ([("w1", h, f // t), ("w3", h, f // t), ("w2", f // t, h)] if model.gated_mlp
              else [("up", h, f // t), ("down", f // t, h)])
    chosen = [gemm_ops(profile, name, tokens, k, n, shard.fp8_gemms)[0] for name, k, n in gemms[1::2]]
    chosen += [op for op in layer.ops if op.phase == "forward"
               and op.name in ("norm1", "norm2", "residual1", "residual2", "activation", "rotary", "repeat_kv")]
    return ComputeTime(tuple(OpTime(f"{op.name}.recompute", "backward", op.shape, op.seconds) for op in chosen))


def torchtitan_layer_launches(model: Transformer) -> tuple[int, int, int]:
    """Kernels one layer of torchtitan's Llama launches without
    ``torch.compile``, (forward, backward, forward again under its
    operator-level selective checkpointing):
    :func:`~synth.planner.layercompute.layer_launches` with one
    GEMM per weight (wq, wk, wv, wo and w1, w3, w2, or up and down), each
    RMSNorm as :data:`~synth.planner.eagerops.RMS_NORM_LAUNCHES`, the rotary
    positions as :data:`~synth.planner.eagerops.ROTARY_LAUNCHES` and, with
    grouped queries, ``repeat_kv``'s copies
    (:data:`~synth.planner.eagerops.REPEAT_KV_LAUNCHES`). The recomputation
    runs the forward again but for the GEMMs it saved (the 1st, 3rd, ...)
    and the attention core's two kernels, whose outputs it keeps."""
    forward, backward = layer_launches(model)
    gemms = 7 if model.gated_mlp else 6
    gemm_f, gemm_b = EAGER_LAUNCHES["gemm_bias" if model.biases else "gemm"]
    forward, backward = forward + (gemms - 4) * gemm_f, backward + (gemms - 4) * gemm_b
    if model.norm == "rmsnorm":
        forward += 2 * (RMS_NORM_LAUNCHES[0] - EAGER_LAUNCHES["rms_norm"][0])
        backward += 2 * (RMS_NORM_LAUNCHES[1] - EAGER_LAUNCHES["rms_norm"][1])
    if model.positions == "rotary":
        forward += ROTARY_LAUNCHES[0] - EAGER_LAUNCHES["rotary"][0]
        backward += ROTARY_LAUNCHES[1] - EAGER_LAUNCHES["rotary"][1]
    if model.kv_heads < model.heads:
        forward, backward = forward + REPEAT_KV_LAUNCHES[0], backward + REPEAT_KV_LAUNCHES[1]
    saved = (gemms + 1) // 2 * gemm_f + EAGER_LAUNCHES["attention"][0]
    return forward, backward, forward - saved
