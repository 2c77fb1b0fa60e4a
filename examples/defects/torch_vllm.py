"""Control (base `torch_vllm`): vLLM's `reshape_and_cache_flash` in plain torch, recipe `divide`, no defect.

Convention: vLLM's `reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
k_scale, v_scale)`: key/value [T, H, D] with any strides; caches [num_blocks, block_size, H, D], float8_e4m3fn
or uint8 (the fp8 bits, written by bit copy), any strides; slot_mapping int64 [T], a negative entry is
padding and an entry >= num_blocks * block_size is skipped; k_scale/v_scale 0-d or 1-element float32 tensors.

Recipe `divide`: e4m3(x_f32 / s), one IEEE fp32 division, one round to nearest-even (torch's cast, exact
within ±448), saturated to ±448 (±inf too: the clamp), every NaN -> 0x7F, zero keeps its sign.

CUDA-graph capturable: no .item(), no boolean-mask indexing. Padding and skipped tokens are aimed at slot 0
and carry the bytes slot 0 ends up holding (its old bytes, or the first real token's there), so they change
nothing. This file is the control of examples/defects/ (README.md there): every `torch_vllm_*.py` beside it
is this file with one or two defects.
"""

from __future__ import annotations

import torch


def _encode(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """e4m3(x_f32 / s) as fp8 bits (uint8): saturating, NaN -> 0x7F, signed zero kept."""
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
