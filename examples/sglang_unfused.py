"""Example: the unfused SGLang server write, in plain torch: whatever recipe torch's own ops compute.

Convention: SGLang's `fused_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None,
page_size=16, use_triton=True)`; `use_triton` is accepted and ignored (no kernel here).

Recipe: none chosen here. Like SGLang's `set_kv_buffer` it divides in the input dtype (`k.div_(k_scale)`, on a
copy so the caller's k is untouched; no division when the scale is None), casts with `.to(torch.float8_e4m3fn)`
and index_puts the bytes. Nothing is fixed up (NaN sign, overflow, how the scale is applied), so the recipe is
the one torch computes for this device, scale type and torch version; the suite's job is to identify it.

Measured on the CPU (AVX-512), torch 2.13, against the recipes:
- float, 0-d tensor and 1-element tensor scales all compute `unfused-tensor1`, e4m3(in(x / s)): the CPU
  divides exactly and, unlike CUDA, neither multiplies by 1/s nor rounds a 0-d scale to k's dtype first.
- None: no division, so every saturating recipe (they coincide at s = 1); the cast saturates on this torch.
- NaN bytes are torch's, not always 0x7F, and depend on dtype, scale kind and even the element's position
  (vector body or scalar tail): a negative NaN mostly gives 0xFF; with a scale, bf16's vectorized division
  writes every NaN as 0xFFFF, so a positive NaN gives 0xFF too.
On the H200 (torch 2.11, CUDA) the same code computes, by scale kind, what its conformance report lists
(docs/results/conformance-h200-2026-12-03-e/): a float multiplies by 1/s (`unfused-nan`, which it is held to),
a 0-d tensor is first rounded to k's dtype (`unfused-tensor0d`'s arithmetic) and a 1-element tensor divides
(`unfused-tensor1`'s), both with the cast's NaN past the range.
The rest of the call is a correct server path: padding and out-of-range slots write nothing, 2-D/3-D inputs,
3-D/4-D caches and uint8 caches (bit copy) are handled, and k, v are never modified. Boolean indexing of
cache_loc syncs with the host, as the server path does.
"""

from __future__ import annotations

import torch


def _quantize(x: torch.Tensor, scale: float | torch.Tensor | None) -> torch.Tensor:
    """The server's `x.div_(scale).to(float8_e4m3fn)`, as fp8 bits (uint8)."""
    if scale is not None:
        # div_ stores the quotient in x's dtype (that rounding is part of the unfused recipe). SGLang divides
        # the caller's k in place; the contract forbids modifying inputs, so divide a copy
        x = x.clone().div_(scale)
    return x.to(torch.float8_e4m3fn).view(torch.uint8)


def fused_fp8_set_kv_buffer(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            cache_loc: torch.Tensor, k_scale: float | torch.Tensor | None = None,
                            v_scale: float | torch.Tensor | None = None, page_size: int = 16,
                            use_triton: bool = True) -> None:
    """Quantize k and v with torch's ops and write token t to slot cache_loc[t] (negative: padding)."""
    heads, dim = k_cache.shape[-2], k_cache.shape[-1]
    num_slots = k_cache.shape[0] * (page_size if k_cache.dim() == 4 else 1)
    loc = cache_loc.long()
    keep = (loc >= 0) & (loc < num_slots)  # padding and out-of-range entries write nothing
    slots = loc[keep]
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        data = _quantize(x.reshape(x.shape[0], heads, dim), scale)[keep]  # [T, H*D] -> [T, H, D] too
        out = cache.view(torch.uint8)  # a uint8 cache holds the fp8 bits: copy bits, never convert values
        if cache.dim() == 3:
            out[slots] = data
        else:
            out[slots // page_size, slots % page_size] = data
