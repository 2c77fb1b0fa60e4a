"""Defect corpus: examples/defects/torch_sglang.py (recipe `single`) with TWO independent defects: a uint8 cache
gets converted values; out-of-range slots wrap around.

Defect: (1) as torch_sglang_uint8_value_cast.py: `q.to(cache.dtype)` converts values into a uint8 cache; (2) an
entry >= the number of slots is reduced modulo the number of slots (a ring buffer) instead of skipped.
Models: vllm-xpu-kernels#475, LMCache#4064; related: vllm#13922.
Expected in a conformance report (effect@trigger): `storage:value-cast@cache-uint8`,
`out-of-range:written@out-of-range`.

The changed lines are marked `# DEFECT`; everything else (the convention, the recipe, the layouts handled) is the
control, examples/defects/torch_sglang.py.
"""

from __future__ import annotations

import torch


def _reciprocal(scale: float | torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """1/s as a 0-d fp32 tensor on the device: an IEEE fp32 division of the fp32 scale."""
    if isinstance(scale, torch.Tensor):
        s = scale.reshape(()).float()
    else:
        s = torch.full((), 1.0 if scale is None else float(scale), dtype=torch.float32, device=device)
    return 1.0 / s


def _encode(x: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """e4m3(x_f32 * (1/s)) as fp8 bits (uint8): saturating, NaN -> 0x7F, signed zero kept."""
    y = x.float() * inv
    q = y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
    return torch.where(y.isnan(), 0x7F, q)


def fused_fp8_set_kv_buffer(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            cache_loc: torch.Tensor, k_scale: float | torch.Tensor | None = None,
                            v_scale: float | torch.Tensor | None = None, page_size: int = 16,
                            use_triton: bool = True) -> None:
    """Quantize k and v (recipe `single`) and write token t to slot cache_loc[t] (negative: padding)."""
    tokens, heads, dim = k.shape[0], k_cache.shape[-2], k_cache.shape[-1]
    if tokens == 0:  # a shape, not a value: no host sync
        return
    ps = page_size if k_cache.dim() == 4 else 1  # a 3-D cache: pages of one slot
    num_slots = k_cache.shape[0] * ps
    loc = cache_loc.long()
    valid = loc >= 0  # DEFECT 2: out-of-range entries wrap around instead of being skipped
    slot = torch.where(valid, loc % num_slots, 0)
    hits0 = valid & (loc == 0)
    first0 = hits0.int().argmax().reshape(1)
    page, offset = slot // ps, slot % ps
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        q = _encode(x.reshape(tokens, heads, dim), _reciprocal(scale, x.device))
        q = q.view(torch.float8_e4m3fn).to(cache.dtype)  # DEFECT 1: values, not bits: uint8 converts
        out = cache if cache.dim() == 4 else cache.unsqueeze(1)  # [S, H, D] -> [S, 1, H, D], a view
        slot0 = torch.where(hits0.any(), q.index_select(0, first0)[0], out[0, 0])
        out[page, offset] = torch.where(valid[:, None, None], q, slot0)
