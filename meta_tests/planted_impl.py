"""A small planted-defect implementation for meta_tests/test_conformance_report.py (not a test module).

SGLang's convention, plain torch, recipe `divide` (e4m3(x_f32 / s), saturating), with three defects that
are defects under every recipe:
- cache_loc read as a Python index: a padding entry of -1 writes its token into the last slot;
- no NaN fix-up: torch's cast keeps a negative NaN's sign (0xFF where every recipe writes 0x7F);
- v_scale ignored when it is a Python float (V written as if the scale were None).
"""

from __future__ import annotations

import torch


def _encode(x: torch.Tensor, scale: float | torch.Tensor | None) -> torch.Tensor:
    s = 1.0 if scale is None else scale.reshape(()) if isinstance(scale, torch.Tensor) else scale
    return (x.float() / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)  # PLANTED: NaN sign kept


def fused_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                            use_triton=True) -> None:
    heads, dim = k_cache.shape[-2], k_cache.shape[-1]
    num_slots = k_cache.shape[0] * (page_size if k_cache.dim() == 4 else 1)
    if isinstance(v_scale, float):
        v_scale = None  # PLANTED: a float v_scale is dropped
    loc = cache_loc.long()
    loc = torch.where(loc == -1, num_slots - 1, loc)  # PLANTED: -1 is "the last slot", as a Python index
    keep = (loc >= 0) & (loc < num_slots)
    slots = loc[keep]
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        data = _encode(x.reshape(x.shape[0], heads, dim), scale)[keep]
        out = cache.view(torch.uint8)
        if cache.dim() == 3:
            out[slots] = data
        else:
            out[slots // page_size, slots % page_size] = data
