"""Example: an adapter, for a kernel whose calling convention the suite does not know.

`store_kv_fp8` stands for your kernel: it takes the K and V caches as one tuple, the tokens' slots
first, and the scales as a tuple that must not hold None. It computes recipe `divide` in plain torch
(written for this example; any kernel goes here). The adapter below gives it the SGLang signature, so

    make test PYTEST_ARGS="--impl examples/adapter.py:fused_fp8_set_kv_buffer"
    make conformance IMPL=examples/adapter.py:fused_fp8_set_kv_buffer

hold it to the spec (docs/conventions.md). Everything the adapter does is attributed to the kernel,
so it only renames and reorders: no copies, no casts, no host syncs (those would break CUDA graphs).
"""

from __future__ import annotations

import torch


def store_kv_fp8(slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                 caches: tuple[torch.Tensor, torch.Tensor], scales: tuple[float | torch.Tensor, float | torch.Tensor],
                 block_size: int) -> None:
    """"Your kernel": e4m3(x / s) saturating, NaN -> 0x7F, into [blocks, block_size, H, D] caches."""
    heads, dim = caches[0].shape[-2:]
    slots = slots.long()
    valid = (slots >= 0) & (slots < caches[0].shape[0] * block_size)
    for x, cache, scale in ((keys, caches[0], scales[0]), (values, caches[1], scales[1])):
        # A float becomes an fp32 tensor first: on CUDA, torch divides by a Python float as a
        # multiplication by its reciprocal (recipe `single`), and this kernel divides.
        s = scale.reshape(()) if torch.is_tensor(scale) else torch.tensor(scale, dtype=torch.float32, device=x.device)
        y = x.reshape(x.shape[0], heads, dim).float() / s
        q = torch.where(y.isnan(), 0x7F, y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8))
        kept = slots[valid]  # boolean indexing syncs: this kernel is not graph-capturable, and the suite says so
        cache.view(torch.uint8)[kept // block_size, kept % block_size] = q[valid]


def fused_fp8_set_kv_buffer(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            cache_loc: torch.Tensor, k_scale: float | torch.Tensor | None = None,
                            v_scale: float | torch.Tensor | None = None, page_size: int = 16,
                            use_triton: bool = True) -> None:
    """The adapter, in the sglang convention: rename, reorder, and say what None means (1.0)."""
    if k_cache.dim() == 3:  # [S, H, D] is [S, 1, H, D] with one slot a page: a view, not a copy
        k_cache, v_cache, page_size = k_cache.unsqueeze(1), v_cache.unsqueeze(1), 1
    store_kv_fp8(cache_loc, k, v, (k_cache, v_cache),
                 (1.0 if k_scale is None else k_scale, 1.0 if v_scale is None else v_scale), page_size)
