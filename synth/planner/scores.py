"""The time of an unfused attention's score passes (softmax and dropout).

An unfused ("math") attention materialises its ``s x s`` scores: per layer
and micro-batch one device holds ``b (a / t) (s / cp) s`` score elements
(micro-batch b, a heads over t tensor-parallel ranks, s / cp queries against
s keys). Megatron-LM before flash attention (the code of Narayanan et al.
2021, SC'21: NVIDIA/Megatron-LM at commit 2babcaf6f5,
``megatron/model/transformer.py`` ``ParallelAttention.forward``) runs, per
layer, in fp16/bf16:

forward
  1. ``torch.baddbmm`` (line 271): Q K^T, writes the scores (2 bytes) -- a GEMM;
  2. ``self.scale_mask_softmax`` (line 302), GPT's causal mask: the fused
     ``ScaledUpperTriangMaskedSoftmax`` (``megatron/model/fused_softmax.py``
     lines 20-49, 140-144, taken where lines 132-137 allow it: keys 17 to
     2048, queries and ``b a / t`` multiples of 4, as in every SC'21 row; kernel
     ``megatron/fused_kernels/scaled_upper_triang_masked_softmax.h`` lines
     143-229): reads each row's causal part only (row r: r + 1 of s elements,
     ``(s + 1) / (2 s)`` of them on average, 2 bytes each) and writes the whole
     row (2 bytes, zeros above the diagonal);
  3. ``self.attention_dropout`` (line 308, ``torch.nn.Dropout``, p 0.1):
     PyTorch's fused dropout of that era (PyTorch 1.8, the NGC 20.12
     container Megatron-LM's README names; ``aten/src/ATen/native/cuda/Dropout.cu``
     ``fused_dropout_cuda``) reads the probabilities (2), writes the dropped
     ones (2) and a mask of dtype ``kByte`` (1);
  4. ``torch.bmm`` with V (line 332): reads them (2) -- a GEMM.

backward (the mirror passes)
  5. the bmm's backward: writes the gradient of the probabilities (2) and
     reads the dropped probabilities for V's gradient (2) -- GEMMs;
  6. the dropout's backward (``masked_scale``): reads the gradient (2) and the
     mask (1), writes the gradient (2);
  7. the softmax's backward (kernel lines 233-330, in place): reads the
     gradient and the saved probabilities in the causal part (2 + 2, each
     ``(s + 1) / (2 s)``) and writes the whole row (2);
  8. the baddbmm's backward: reads the scores' gradient twice, for Q's and
     K's gradients (2 + 2) -- GEMMs.

The rule: a GEMM's own reads and writes of the scores are inside the GEMM's
time, which the compute model already prices from its FLOPs (the attention
core's FLOPs are in the model's training FLOPs); this term counts only the
passes that do no counted FLOPs, the softmax and the dropout (2, 3, 6, 7).
Per score element they move, with ``c = (s + 1) / (2 s)``:

* forward: ``2 c + 2`` (softmax) ``+ 5`` (dropout) = ``7 + 2 c`` bytes;
* backward: ``5`` (dropout) ``+ 4 c + 2`` (softmax) = ``7 + 4 c`` bytes;

and recomputation (full, or selective, which recomputes exactly the attention
core) runs the forward's passes once more in the backward. In general, with
``w`` bytes per value (the training dtype's; the mask stays one byte): ``w (3 +
c) + 1`` forward and ``w (3 + 2 c) + 1`` backward.

With the efficiency curve the time is those bytes at the device's datasheet
memory bandwidth (``Device.memory_bandwidth_GBps``): kernels reach a fraction
of it, so the term is a lower bound on the passes' time; the fitted efficiency
curve absorbs the rest. With a per-operation profile each pass is one kernel
at the profile's measured elementwise rate (``add``'s bandwidth and floor,
:meth:`~synth.planner.operations.ElementwiseModel.bytes_seconds`); the
attention core's GEMMs stay priced as the measured flash kernel (same FLOPs:
the profile has no timing of the unfused batched GEMMs), so that is a lower
bound too. Megatron-LM's fused causal kernel of that code took sequences up
to 2048; longer ones fell back to an unfused fp32 chain that moves more bytes
(the term is a lower bound there too).
"""

from __future__ import annotations

from ..errors import SynthError
from ..topology import Device
from .activations import Recompute
from .operations import ElementwiseModel
from .training import Configuration, Training
from .transformer import Transformer

# Values (of the training dtype) and mask bytes per score element of the passes this term counts (module
# docstring); the softmax's reads are of the causal part only.
DROPOUT_FORWARD_VALUES = 2  # read the probabilities, write the dropped ones
DROPOUT_BACKWARD_VALUES = 2  # read the gradient, write the gradient
DROPOUT_MASK_BYTES = 1  # PyTorch's fused dropout mask (kByte), written forward and read backward
SOFTMAX_WRITES = 1  # every element of a row, forward and backward
SOFTMAX_FORWARD_READS = 1  # the scores, causal part
SOFTMAX_BACKWARD_READS = 2  # the gradient and the saved probabilities, causal part


def causal_read_share(seq: int) -> float:
    """The share of an ``s x s`` score matrix inside the causal triangle (the
    diagonal included): ``(s + 1) / (2 s)``."""
    return (seq + 1) / (2 * seq)


def score_elements(model: Transformer, micro_batch: int, tp: int, cp: int = 1) -> float:
    """Score elements one device holds per layer and micro-batch:
    ``b (a / t) (s / cp) s``."""
    return micro_batch * (model.heads / tp) * (model.seq / cp) * model.seq


def score_pass_bytes(model: Transformer, training: Training, config: Configuration) -> tuple[float, ...]:
    """Bytes of each softmax and dropout kernel one device runs per layer and
    micro-batch under ``config``, in order: softmax and dropout forward,
    dropout and softmax backward, and the forward's two again under full or
    selective recomputation (module docstring); () for a flash attention (it
    keeps no scores in memory)."""
    if training.attention != "unfused":
        return ()
    n = score_elements(model, config.micro_batch, config.tp, config.cp)
    c, w = causal_read_share(model.seq), training.value_bytes
    forward = (n * w * (SOFTMAX_FORWARD_READS * c + SOFTMAX_WRITES),
               n * (w * DROPOUT_FORWARD_VALUES + DROPOUT_MASK_BYTES))
    backward = (n * (w * DROPOUT_BACKWARD_VALUES + DROPOUT_MASK_BYTES),
                n * w * (SOFTMAX_BACKWARD_READS * c + SOFTMAX_WRITES))
    again = forward if training.recompute in (Recompute.FULL, Recompute.SELECTIVE) else ()
    return forward + backward + again


def unfused_score_bytes(model: Transformer, training: Training, config: Configuration, layers: int) -> float:
    """Bytes one device's unfused attention moves outside its GEMMs for one
    micro-batch of ``layers`` layers under ``config``; 0 for a flash attention."""
    return layers * sum(score_pass_bytes(model, training, config))


def require_bandwidth(device: Device) -> float:
    """The device's memory bandwidth in bytes/s; SynthError naming the field
    and the fix where the device has none."""
    if device.memory_bandwidth_Bps is None:
        raise SynthError(f"--attention unfused: device '{device.name}' has no memory_bandwidth_GBps, which prices "
                         "the unfused attention's softmax and dropout passes; add the datasheet's HBM bandwidth to "
                         "the topology's device (memory_bandwidth_GBps: 2039 for an A100 80GB) or to --device "
                         "(...,memory_bandwidth_GBps=2039)")
    return device.memory_bandwidth_Bps


def unfused_score_s(model: Transformer, training: Training, config: Configuration, layers: int,
                    device: Device) -> float:
    """Seconds of :func:`unfused_score_bytes` at the device's datasheet memory
    bandwidth (a lower bound); 0 for a flash attention."""
    moved = unfused_score_bytes(model, training, config, layers)
    return moved / require_bandwidth(device) if moved else 0.0


def unfused_score_elementwise_s(model: Transformer, training: Training, config: Configuration, layers: int,
                                elementwise: ElementwiseModel) -> float:
    """Seconds of the passes of :func:`score_pass_bytes` for ``layers``
    layers, each one kernel at a per-operation profile's elementwise rate (with
    its floor); 0 for a flash attention."""
    return layers * sum(float(elementwise.bytes_seconds(b)) for b in score_pass_bytes(model, training, config))
