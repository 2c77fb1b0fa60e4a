"""Defect corpus: examples/defects/torch_vllm.py (recipe `divide`) with ONE defect: a 0-d scale double-rounds
through the input dtype.

Defect: for a 0-d scale tensor only, the quotient is computed as `x / scale.to(x.dtype)`, in bf16/fp16: the scale
and the quotient are both rounded to the input dtype before the e4m3 rounding (recipe unfused-tensor0d); a 1-element
scale takes the fp32 path.
Models: triton#11753 (rounding through an intermediate format); the 0-d-tensor `div_` rounding of docs/facts.md.
Expected in a conformance report (effect@trigger): `rounding:unfused-tensor0d@scale-kind:tensor0d`.

The changed lines are marked `# DEFECT`; everything else (the convention, the recipe, the layouts handled) is the
control, examples/defects/torch_vllm.py.
"""

from __future__ import annotations

import torch


def _encode(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3(x_f32 / s) as fp8 bits (uint8): saturating, NaN -> 0x7F, signed zero kept."""
    if scale.dim() == 0:  # DEFECT: a 0-d scale divides in the input dtype (x / in(s), rounded to in)
        y = (x / scale.to(x.dtype)).float()
    else:
        y = x.float() / scale.reshape(())
    q = y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(y.isnan(), 0x7F, q)


def reshape_and_cache_flash(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, slot_mapping: torch.Tensor, kv_cache_dtype: str,
                            k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
    """Write token t's fp8 K and V to slot slot_mapping[t] of the paged caches (negative: padding)."""
    if kv_cache_dtype not in ("fp8", "fp8_e4m3"):
        raise ValueError(f"kv_cache_dtype must be 'fp8' or 'fp8_e4m3', got {kv_cache_dtype!r}")
    # T is slot_mapping's length: under CUDA-graph padding the keys may be longer (vllm#13922)
    key, value = key[:slot_mapping.shape[0]], value[:slot_mapping.shape[0]]
    if key.shape[0] == 0:  # a shape, not a value: no host sync
        return
    block_size = key_cache.shape[1]
    num_slots = key_cache.shape[0] * block_size
    valid = (slot_mapping >= 0) & (slot_mapping < num_slots)
    slot = torch.where(valid, slot_mapping, 0)
    hits0 = valid & (slot_mapping == 0)
    first0 = hits0.int().argmax().reshape(1)
    block, offset = slot // block_size, slot % block_size
    for x, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        q = _encode(x, scale)
        out = cache.view(torch.uint8)  # bit copy into uint8 and fp8 caches alike
        slot0 = torch.where(hits0.any(), q.index_select(0, first0)[0], out[0, 0])
        out[block, offset] = torch.where(valid[:, None, None], q, slot0)
