"""A stateful implementation (SGLang convention, recipe `divide`): the reference, except that every third
call flips one bit of the first token's first K byte. Whether an example fails depends on the calls
before it, as with a kernel that caches launch state: meta_tests/test_draw_order.py runs a property on it."""

from __future__ import annotations

import torch

from kernel import naive_fp8_set_kv_buffer

CALLS = [0]


def fused_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                            use_triton=True):
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe="divide")
    CALLS[0] += 1
    if CALLS[0] % 3 or cache_loc.numel() == 0:
        return
    slot = int(cache_loc[0])
    ps = page_size if k_cache.dim() == 4 else 1
    if 0 <= slot < k_cache.shape[0] * ps:
        where = (slot // ps, slot % ps, 0, 0) if k_cache.dim() == 4 else (slot, 0, 0)
        k_cache.view(torch.uint8)[where] ^= 1
