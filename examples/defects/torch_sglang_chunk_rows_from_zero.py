"""Defect corpus: examples/defects/torch_sglang.py (recipe `single`) with ONE defect: past 256 tokens, each chunk
quantizes the first chunk's rows again.

Defect: the inputs are quantized in chunks of 256 tokens (to bound a long prefill's fp32 temporaries), and each
chunk slices its rows from 0 instead of from its start, so token t >= 256 is written with the bytes of token
t % 256, at its own slot.
Models: sglang#15522 (a tile straddling a boundary that is not a multiple of the block: 528 = 512 + 16). Written
blind by a helper (held-out batch eleven) as a chunk loop that never advanced its rows; the CPU's properties draw
T <= 16, so only the capability table's many-tokens row (T = 528) shows it there.
Expected in a conformance report (effect@trigger): `wrong-slot:tokens-moved@tokens-above:256` (whole tokens' bytes
at other slots, found by replaying the minimal Case at other numbers of tokens).

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
    valid = (loc >= 0) & (loc < num_slots)
    slot = torch.where(valid, loc, 0)
    hits0 = valid & (loc == 0)
    first0 = hits0.int().argmax().reshape(1)
    page, offset = slot // ps, slot % ps
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        x3, inv = x.reshape(tokens, heads, dim), _reciprocal(scale, x.device)
        # in chunks of 256 tokens: a long prefill's fp32 temporaries stay bounded
        q = torch.cat([_encode(x3[0:min(256, tokens - start)], inv)  # DEFECT: from row 0, not from start
                       for start in range(0, tokens, 256)])
        out = cache.view(torch.uint8)  # bit copy into uint8 and fp8 caches alike
        out = out if out.dim() == 4 else out.unsqueeze(1)  # [S, H, D] -> [S, 1, H, D], a view
        slot0 = torch.where(hits0.any(), q.index_select(0, first0)[0], out[0, 0])
        out[page, offset] = torch.where(valid[:, None, None], q, slot0)
