"""Example: vLLM's `reshape_and_cache_flash` FP8 write, in plain torch, computing recipe `divide`.

Convention: vLLM's `reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
k_scale, v_scale)`. key/value [T, H, D]; caches [num_blocks, block_size, H, D], float8_e4m3fn or uint8 (the
fp8 bits, written by bit copy); slot_mapping int64 [T], a negative entry is padding; kv_cache_dtype "fp8" or
"fp8_e4m3" (e4m3), or "fp8_e5m2" (caches float8_e5m2 or uint8); k_scale/v_scale one-element float32 tensors
(0-d or [1]) on the key's device, or [H] per-attention-head scales (vllm#30141: head h divided by scale[h]).

Recipe `divide`: e4m3(x_f32 / s), one IEEE fp32 division (a 0-d device tensor divides elementwise on CPU and
CUDA, no reciprocal fast path), one round to nearest-even onto e4m3, saturated to ±448 (±inf too), every NaN
-> 0x7F, zeros keep their sign: vLLM's `__nv_cvt_float_to_fp8(x / s, __NV_SATFINITE, __NV_E4M3)`. Within ±448
torch's `.to(float8_e4m3fn)` rounds to nearest-even on every version; the clamp before it makes overflow
saturate on every version, and the NaN byte is set explicitly. e5m2 is the same onto the e5m2 grid, saturated
to ±57344 (`__NV_E5M2`).

No host sync, so it is CUDA-graph capturable: no boolean indexing, no .item(). Padding and out-of-range
tokens (slot >= num_blocks * block_size) are pointed at slot 0 and carry the bytes slot 0 ends up holding (its
old bytes, or those of the first real token written there), so they change nothing.

It checks none of its arguments, as vLLM's op checks none: `make conformance` on it names three defects, all
of the argument contract (`validation:accepted`, `validation:other-exception`, `validation:unnamed`), and no
other (docs/results/heldout-cpu-2026-12-07-e.md).
"""

from __future__ import annotations

import torch

#: kv_cache_dtype -> (the fp8 dtype, its largest finite value)
FORMATS = {"fp8": (torch.float8_e4m3fn, 448.0), "fp8_e4m3": (torch.float8_e4m3fn, 448.0),
           "fp8_e5m2": (torch.float8_e5m2, 57344.0)}


def _encode(x: torch.Tensor, scale: torch.Tensor, kv_cache_dtype: str) -> torch.Tensor:
    """fp8(x_f32 / s), saturating, NaN -> 0x7F, as fp8 bits (uint8)."""
    dtype, top = FORMATS[kv_cache_dtype]
    y = x.float() / scale.reshape(-1, 1)  # exact widening, then IEEE fp32 division (one scale, or head h's)
    q = y.clamp(-top, top).to(dtype).view(torch.uint8)  # clamp: torch <= 2.11 gives NaN past e4m3's 464
    return torch.where(y.isnan(), 0x7F, q)  # torch's cast keeps a NaN's sign; the contract drops it


def reshape_and_cache_flash(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, slot_mapping: torch.Tensor, kv_cache_dtype: str,
                            k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
    """Write token t's fp8 K and V to slot slot_mapping[t] of the paged caches (negative: padding)."""
    if kv_cache_dtype not in FORMATS:
        raise ValueError(f"kv_cache_dtype must be one of {sorted(FORMATS)}, got {kv_cache_dtype!r}")
    for cache in (key_cache, value_cache):
        if cache.dtype not in (torch.uint8, FORMATS[kv_cache_dtype][0]):
            raise TypeError(f"a {kv_cache_dtype} cache must be uint8 or {FORMATS[kv_cache_dtype][0]}, got "
                            f"{cache.dtype}")
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale.numel() != 1 and tuple(scale.shape) != (key.shape[1],):
            raise ValueError(f"{name} must be a 0-d or 1-element tensor, or a [{key.shape[1]}] tensor (one scale a "
                             f"head), got shape {tuple(scale.shape)}")
    # T is slot_mapping's length: under CUDA-graph padding the keys may be longer (vllm#13922)
    key, value = key[:slot_mapping.shape[0]], value[:slot_mapping.shape[0]]
    if key.shape[0] == 0:  # a shape, not a value: no sync
        return
    block_size = key_cache.shape[1]
    valid = (slot_mapping >= 0) & (slot_mapping < key_cache.shape[0] * block_size)
    slot = torch.where(valid, slot_mapping, 0)  # invalid tokens aim at slot 0 ...
    hits0 = valid & (slot_mapping == 0)
    first0 = hits0.int().argmax().reshape(1)  # ... and carry what slot 0 ends up holding
    block, offset = slot // block_size, slot % block_size
    for x, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        q = _encode(x, scale, kv_cache_dtype)
        out = cache.view(torch.uint8)  # bit copy into uint8 and fp8 caches alike
        slot0 = torch.where(hits0.any(), q.index_select(0, first0)[0], out[0, 0])
        out[block, offset] = torch.where(valid[:, None, None], q, slot0)
