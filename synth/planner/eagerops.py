"""Bytes moved by the elementwise operations torchtitan's Llama writes out of
several eager PyTorch kernels (``--framework torchtitan``), where the layer
model prices one fused kernel at a measured rate.

Sources: pytorch/torchtitan at 9dec370 (the commit of its December 2024
benchmark, ``benchmarks/llama3_h100_202412_torchtitan.md``), run without
``torch.compile`` (``training.compile = false``). Each kernel reads its inputs
and writes its output once; a kernel's bytes are counted for the values of the
tensor it runs over (T x width), not for the per-row statistics or the
weights, which are small beside them. The backward's kernels are those of
PyTorch's autograd formulas for the forward's operations, counted operation by
operation.
"""

from __future__ import annotations

# RMSNorm (torchtitan/models/norms.py lines 96-101: ``output = self._norm(x.float()).type_as(x)``,
# ``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``, ``output * self.weight``), bytes per
# element of a bf16 input:
# forward: x.float() 2+4, pow 4+4, mean 4 (one value a row), x * rsqrt 4+4, type_as 4+2, * weight 2+2 = 36;
# backward: the weight's gradient (grad x output 2+2+2, summed over tokens 2), grad x weight 2+2,
# type_as's gradient to fp32 2+4, the product's two gradients (grad x rsqrt 4+4; grad x x 4+4+4 summed
# per row 4), mean's gradient spread over the row (write 4), pow's (x.pow(1) 4+4, x 2 4+4, x grad 4+4+4),
# the two gradients of x added 4+4+4, float()'s gradient to bf16 4+2 = 92.
RMS_NORM_BYTES = (36, 92)
# Rotary positions (torchtitan/models/llama/model.py lines 108-113): per element of the queries and the
# keys, ``x.float()`` 2+4, the complex product with ``freqs_cis`` 4+4, ``type_as`` 4+2 = 20 forward; the
# backward runs the same three kernels (the bf16 gradient to fp32, the product with the conjugate, back to
# bf16): 20.
ROTARY_BYTES = (20, 20)
# Kernels launched, (forward, backward), as PyTorch's dispatcher runs the operations above: RMSNorm's six
# forward operations over the values and two over each row's statistic (mean's + eps, rsqrt); its backward's
# thirteen over the values and three over the rows (rsqrt's gradient). Rotary positions:
# three forward kernels for the queries and three for the keys; backward, each also materialises the
# conjugate of freqs_cis (one more). repeat_kv: one copy each for the keys and the values, one sum each backward.
RMS_NORM_LAUNCHES = (8, 16)
ROTARY_LAUNCHES = (6, 8)
REPEAT_KV_LAUNCHES = (2, 2)


def repeat_kv_bytes(n_rep: int) -> tuple[int, int]:
    """Bytes per key (or value) value that ``repeat_kv`` moves (torchtitan/
    models/llama/model.py lines 116-125, called on the keys and the values
    at lines 201-202): ``unsqueeze.expand.reshape`` copies each bf16 value
    ``n_rep`` times (read 2, write ``2 n_rep``); the backward sums the
    ``n_rep`` copies' gradients (read ``2 n_rep``, write 2). Nothing when
    every query head has its own key head (``n_rep`` 1: a view)."""
    if n_rep <= 1:
        return 0, 0
    return 2 + 2 * n_rep, 2 * n_rep + 2


# torchtitan's defaults outside the layers, bytes per parameter of the device's shard (fp32):
# AdamW: torchtitan/optimizer.py lines 132-138 pass ``foreach = not fused`` and ``--optimizer.fused`` is
# off unless set (torchtitan/config_manager.py lines 194-197), so torch.optim.AdamW runs its foreach
# implementation (``_multi_tensor_adamw``): the weight decay ``_foreach_mul_(params)`` 4+4, ``_foreach_lerp_``
# of the first moment toward the gradient 4+4+4, ``_foreach_mul_`` of the second 4+4, its
# ``_foreach_addcmul_`` with the gradient 4+4+4, ``_foreach_sqrt`` 4+4, ``_foreach_div_`` by the bias
# correction 4+4, ``_foreach_add_`` of eps 4+4, and ``_foreach_addcdiv_`` into the weights 4+4+4+4 = 80
# (fused AdamW: 28).
FOREACH_ADAMW_BYTES = 80
# Gradient clipping (train.py lines 311-315, ``max_norm = 1.0``, ``foreach=True``; torchtitan/utils.py lines
# 383 and 404): ``get_total_norm``'s ``_foreach_norm`` reads each gradient (4) and ``clip_grads_with_norm_``
# multiplies every gradient by the clamped coefficient, clipped or not (4+4) = 12.
CLIP_GRAD_NORM_BYTES = 12
