"""DEMO ONLY: a deliberately broken KV-cache write, to show a red run, a failure file and a replay.

This is not part of the package and nothing imports it. It is the "obvious" torch write that
divides in fp32 and casts once:

    cache[slot] = (k.float() / scale).to(torch.float8_e4m3fn)

BUG (on purpose): it ignores `recipe`. It always computes the `divide` recipe (one rounding), so
it differs from the default `unfused` recipe (multiply by 1/s, round to the input dtype, then to
e4m3) at non-dyadic scales, where the double rounding lands on a different e4m3 value. It also
leaves NaN's sign to torch's cast (0xFF for a negative NaN, where every recipe says 0x7F).

Try it (see docs/repro.md):
    python -m pytest conformance/test_bit_exact.py --impl examples/broken_impl.py:broken_fp8_set_kv_buffer
    python -m tools.repro failures/<the file it names>
    python -m tools.identify examples/broken_impl.py:broken_fp8_set_kv_buffer
"""

from __future__ import annotations

import torch


def _quantize(x: torch.Tensor, scale: float | torch.Tensor | None) -> torch.Tensor:
    s = 1.0 if scale is None else scale
    if isinstance(s, torch.Tensor):
        s = s.reshape(())
    # BUG: recipe ignored. The clamp makes the cast saturate on every torch version (torch <= 2.11
    # gives NaN past 464 without it); torch's cast keeps a NaN's sign, the contract drops it.
    return (x.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)


def broken_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None,
                             page_size=16, use_triton=True, *, recipe="unfused", checked=False) -> None:
    heads, dim = k_cache.shape[-2], k_cache.shape[-1]
    loc = cache_loc.long()
    keep = (loc >= 0) & (loc < k_cache.numel() // (heads * dim))  # padding and overflow: skipped
    slots = loc[keep]
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        data = _quantize(x.reshape(x.shape[0], heads, dim)[keep], scale)
        out = cache.view(torch.uint8)
        if cache.dim() == 3:
            out[slots] = data
        else:
            out[slots // page_size, slots % page_size] = data
