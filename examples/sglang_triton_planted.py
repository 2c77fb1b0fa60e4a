"""Example with PLANTED defects: an SGLang-convention Triton KV-cache write (one launch) computing recipe `single`.

Convention: SGLang's `fused_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None,
page_size=16, use_triton=True)`; `use_triton` is ignored (it always launches the kernel).
Recipe `single`: e4m3(x_f32 * (1/s)), 1/s an IEEE fp32 reciprocal (`tl.math.div_rn`, once per program), one
round to nearest-even, saturated to ±448 (±inf too), every NaN -> 0x7F, signed zero kept. Compiled (sm_89+),
the hardware cast `.to(tl.float8e4nv)` (cvt.rn.satfinite) rounds. Triton's interpreter gets that cast wrong, so
there the kernel rounds with exact fp32 adds and integer bit operations (and bf16 is widened by its bits).
Tensor scales are read by the kernel (graph capturable); a Python float scale is passed by value.

Planted defects, the ONLY deviations from `single`:
- power-of-two-only tiles: `tl.arange(0, H)` / `tl.arange(0, D)`, H and D constexprs, neither rounded up nor
  masked: a valid cache whose H or D (so H*D) is not a power of two fails to compile (Triton's ValueError).
- no uint8 cache: a uint8 cache (fp8 bits stored as bytes) is rejected with a TypeError.
- 32-bit offsets: the slot is cast to int32 and page, offset and the whole cache offset are int32, so past
  2**31 bytes of cache the offset wraps and the kernel writes the wrong place.
- a scale used only when both are given: with only one of k_scale / v_scale, K and V are both written with
  scale 1.0 (the given one is silently ignored).
- rounding once: it computes `single`, not the unfused server path's `unfused` (a defect only against
  `--recipe unfused`).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

if not torch.cuda.is_available():  # no GPU: run the kernel in Triton's interpreter (read when @triton.jit runs)
    os.environ.setdefault("TRITON_INTERPRET", "1")
_INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _quantize_store(x_ptr, c_ptr, x_off, c_off, s, ok, S_PTR: tl.constexpr, INTERP: tl.constexpr):
    if S_PTR:  # a tensor scale is read on the device: no host sync, graph capturable
        s = tl.load(s)
    inv = tl.math.div_rn(1.0, tl.cast(s, tl.float32))  # IEEE 1/s (`/` is not); cast: the interpreter may pass fp64
    x = tl.load(x_ptr + x_off)
    if x.dtype == tl.bfloat16:  # widen by its bits: exact (the interpreter's bf16 cast mangles subnormals)
        x = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    y = x.to(tl.float32) * inv
    if INTERP:  # exact RNE onto the e4m3 grid: the interpreter's fp8 cast rounds wrongly
        a = tl.where(tl.abs(y) < 448.0, tl.abs(y), 448.0)  # saturate; inf and NaN -> 448 (NaN fixed below)
        e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)  # binade, subnormals share -6
        big = (((e + 147) << 23) | 0x400000).to(tl.float32, bitcast=True)  # 1.5 * 2**23 * quantum 2**(e-3)
        r = (a + big) - big  # fp32 add rounds to nearest-even at the quantum: exact RNE of a
        rb = r.to(tl.int32, bitcast=True)  # r is on the grid: its fields are the e4m3 fields (subnormal: r*2**9)
        byte = tl.where(r >= 2.0**-6, (((rb >> 23) - 120) << 3) | ((rb >> 20) & 7), (r * 512.0).to(tl.int32))
        byte = byte | ((y.to(tl.int32, bitcast=True) >> 24) & 0x80)  # the sign bit, -0 included
        byte = tl.where(y != y, 0x7F, byte).to(tl.uint8)
    else:  # cvt.rn.satfinite: RNE, saturating, every NaN -> 0x7F
        byte = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    tl.store(c_ptr + c_off, byte, mask=ok)


@triton.jit
def _kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, loc_ptr, ks, vs, num_slots, page_size, s_loc,
               skt, skh, skd, svt, svh, svd, kcp, kco, kch, kcd, vcp, vco, vch, vcd,
               H: tl.constexpr, D: tl.constexpr, KS_PTR: tl.constexpr, VS_PTR: tl.constexpr, INTERP: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc_ptr + t * s_loc)
    tile = tl.zeros((H, D), slot.dtype) + slot  # a tile mask: the interpreter mis-broadcasts a scalar bool
    ok = (tile >= 0) & (tile < num_slots)  # padding and out-of-range entries write nothing
    slot32 = slot.to(tl.int32)  # PLANTED (32-bit offsets): everything below on the cache side is int32
    page, off = slot32 // page_size, slot32 % page_size
    h = tl.arange(0, H)[:, None]  # PLANTED (power-of-two-only tiles): no rounding up, no mask
    d = tl.arange(0, D)[None, :]
    h64, d64 = h.to(tl.int64), d.to(tl.int64)  # input offsets stay 64-bit: only the cache side is planted
    _quantize_store(k_ptr + t * skt, kc_ptr, h64 * skh + d64 * skd, page * kcp + off * kco + h * kch + d * kcd,
                    ks, ok, KS_PTR, INTERP)
    _quantize_store(v_ptr + t * svt, vc_ptr, h64 * svh + d64 * svd, page * vcp + off * vco + h * vch + d * vcd,
                    vs, ok, VS_PTR, INTERP)


def fused_fp8_set_kv_buffer(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            cache_loc: torch.Tensor, k_scale: float | torch.Tensor | None = None,
                            v_scale: float | torch.Tensor | None = None, page_size: int = 16,
                            use_triton: bool = True) -> None:
    """Quantize k and v to e4m3 (recipe `single`) and write token t to slot cache_loc[t], in one launch."""
    if k_cache.dtype != torch.float8_e4m3fn or v_cache.dtype != torch.float8_e4m3fn:
        raise TypeError(f"caches must be float8_e4m3fn, got {k_cache.dtype}/{v_cache.dtype}")  # PLANTED (no uint8)
    if k_scale is None or v_scale is None:  # PLANTED (a scale used only when both are given)
        k_scale = v_scale = None
    tokens, heads, dim = k.shape[0], k_cache.shape[-2], k_cache.shape[-1]
    if tokens == 0:
        return
    ps = page_size if k_cache.dim() == 4 else 1  # a 3-D cache: pages of one slot
    strides = lambda c: c.stride() if c.dim() == 4 else (c.stride(0), 0, *c.stride()[1:])  # page, offset, H, D
    num_slots = k_cache.shape[0] * ps
    k3, v3 = k.reshape(tokens, heads, dim), v.reshape(tokens, heads, dim)  # splitting H*D is always a view
    ks = k_scale if isinstance(k_scale, torch.Tensor) else float(1.0 if k_scale is None else k_scale)
    vs = v_scale if isinstance(v_scale, torch.Tensor) else float(1.0 if v_scale is None else v_scale)
    _kv_kernel[(tokens,)](k3, v3, k_cache.view(torch.uint8), v_cache.view(torch.uint8), cache_loc, ks, vs,
                          num_slots, ps, cache_loc.stride(0), *k3.stride(), *v3.stride(),
                          *strides(k_cache), *strides(v_cache), H=heads, D=dim,
                          KS_PTR=isinstance(ks, torch.Tensor), VS_PTR=isinstance(vs, torch.Tensor), INTERP=_INTERP)
