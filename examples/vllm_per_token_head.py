"""Example: vLLM's fp8_per_token_head KV-cache write (vllm#38378), in plain torch, recipe per-token-head-vllm.

Convention: vLLM's per-token-head backend, `reshape_and_cache(key, value, key_cache, value_cache,
slot_mapping, *, k_scale_cache, v_scale_cache)`: key/value [T, H, D], any strides; caches
[num_blocks, block_size, H, D], float8_e4m3fn or uint8 (the fp8 bits, written by bit copy), any strides;
k_scale_cache/v_scale_cache float32 [num_blocks, block_size, H], any strides; slot_mapping int32/int64 [T],
a negative entry is padding and an entry >= num_blocks * block_size is skipped.

Per head, in fp32: s = max(amax / 448, 1e-6); bytes = e4m3(clamp(x * (1 / s), -448, 448)), the fp32 s stored
to the scale cache. On torch's ops: `/` by a tensor divides truly (on CUDA too), the cast rounds to
nearest-even and, after the clamp, never overflows; torch's amax and maximum propagate NaN, so a head with a
NaN gets s = NaN and NaN bytes. Two things are set explicitly, because torch leaves them to the NaN's sign
and payload: every NaN byte is 0x7F and a NaN scale is stored as 0x7FC00000 (docs/per-token-head.md).

Written independently of kernel/per_token_head.py (no import from it); meta_tests/test_examples_per_token_head.py
holds it to the reference byte for byte. Not graph-capturable: the valid tokens are found with nonzero().
"""

from __future__ import annotations

import torch


def _quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, H, D] values -> (e4m3 bits [T, H, D] uint8, fp32 scales [T, H])."""
    x32 = x.float()
    amax = x32.abs().amax(dim=-1)
    q_max = torch.full_like(amax, 448.0)  # a tensor: CUDA's division by a Python scalar is a reciprocal multiply
    s = torch.maximum(amax / q_max, torch.full_like(amax, 1e-6))
    y = (x32 * (torch.ones_like(s) / s)[..., None]).clamp(-448.0, 448.0)
    q = torch.where(y.isnan(), 0x7F, y.to(torch.float8_e4m3fn).view(torch.uint8))
    return q, torch.where(s.isnan(), torch.nan, s)


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, *, k_scale_cache: torch.Tensor,
                      v_scale_cache: torch.Tensor) -> None:
    """Write token t's fp8 K and V heads and their scales to slot slot_mapping[t] (negative: padding)."""
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.dtype not in (torch.uint8, torch.float8_e4m3fn):
            raise TypeError(f"{name} must be uint8 or float8_e4m3fn, got {cache.dtype}")
    for name, sc in (("k_scale_cache", k_scale_cache), ("v_scale_cache", v_scale_cache)):
        if sc.dtype != torch.float32 or sc.shape != key_cache.shape[:-1]:
            raise ValueError(f"{name} must be float32 {list(key_cache.shape[:-1])}, got {sc.dtype} {list(sc.shape)}")
    block_size = key_cache.shape[1]
    slots = slot_mapping.long()
    tokens = ((slots >= 0) & (slots < key_cache.shape[0] * block_size)).nonzero().flatten()
    block, offset = slots[tokens] // block_size, slots[tokens] % block_size
    for x, cache, sc in ((key, key_cache, k_scale_cache), (value, value_cache, v_scale_cache)):
        q, s = _quantize(x[tokens])
        cache.view(torch.uint8)[block, offset] = q
        sc.view(torch.int32)[block, offset] = s.view(torch.int32)  # the bits, a NaN's included
