"""Defect corpus: examples/defects/triton_sglang.py (recipe `single`) with TWO independent defects: ignores
cache_loc's stride; raises on a uint8 cache.

Defect: (1) as triton_sglang_loc_stride_ignored.py: cache_loc read at `loc_ptr + t`; (2) a uint8 cache is refused
with a TypeError.
Models: flashinfer#527, ROCm/aiter#3492; LMCache#4064 (uint8 caches).
Expected in a conformance report (effect@trigger): `strides:cache-loc-ignored@strided-loc`,
`raises:TypeError@cache-uint8`.

The changed lines are marked `# DEFECT`; everything else (the convention, the recipe, the layouts handled) is the
control, examples/defects/triton_sglang.py.
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
def _quantize_store(x_ptr, c_ptr, x_off, c_off, s, ok, inb, S_PTR: tl.constexpr, INTERP: tl.constexpr):
    if S_PTR:  # a tensor scale is read on the device: no host sync, graph capturable
        s = tl.load(s)
    inv = tl.math.div_rn(1.0, tl.cast(s, tl.float32))  # IEEE 1/s; cast: the interpreter may pass fp64
    x = tl.load(x_ptr + x_off, mask=inb, other=0.0)
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
               H: tl.constexpr, D: tl.constexpr, HP: tl.constexpr, DP: tl.constexpr,
               KS_PTR: tl.constexpr, VS_PTR: tl.constexpr, INTERP: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(loc_ptr + t).to(tl.int64)  # DEFECT 1: cache_loc's stride (s_loc) is ignored
    h = tl.arange(0, HP)[:, None].to(tl.int64)
    d = tl.arange(0, DP)[None, :].to(tl.int64)
    inb = (h < H) & (d < D)  # the tile's tail past H and D
    tile = tl.zeros((HP, DP), tl.int64) + slot  # a tile mask: the interpreter mis-broadcasts a scalar bool
    ok = inb & (tile >= 0) & (tile < num_slots)  # padding and out-of-range entries write nothing
    page, off = slot // page_size, slot % page_size
    _quantize_store(k_ptr + t * skt, kc_ptr, h * skh + d * skd, page * kcp + off * kco + h * kch + d * kcd,
                    ks, ok, inb, KS_PTR, INTERP)
    _quantize_store(v_ptr + t * svt, vc_ptr, h * svh + d * svd, page * vcp + off * vco + h * vch + d * vcd,
                    vs, ok, inb, VS_PTR, INTERP)


def _cache_strides(c: torch.Tensor) -> tuple[int, int, int, int]:
    """(page, offset, head, dim) strides; a 3-D cache is pages of one slot."""
    return c.stride() if c.dim() == 4 else (c.stride(0), 0, c.stride(1), c.stride(2))


def fused_fp8_set_kv_buffer(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            cache_loc: torch.Tensor, k_scale: float | torch.Tensor | None = None,
                            v_scale: float | torch.Tensor | None = None, page_size: int = 16,
                            use_triton: bool = True) -> None:
    """Quantize k and v to e4m3 (recipe `single`) and write token t to slot cache_loc[t], in one launch."""
    if k_cache.dtype != torch.float8_e4m3fn or v_cache.dtype != torch.float8_e4m3fn:  # DEFECT 2
        raise TypeError(f"caches must be float8_e4m3fn, got {k_cache.dtype}/{v_cache.dtype}")
    tokens, heads, dim = k.shape[0], k_cache.shape[-2], k_cache.shape[-1]
    if tokens == 0:
        return
    ps = page_size if k_cache.dim() == 4 else 1
    num_slots = k_cache.shape[0] * ps
    k3, v3 = k.reshape(tokens, heads, dim), v.reshape(tokens, heads, dim)  # splitting H*D is always a view
    ks = k_scale if isinstance(k_scale, torch.Tensor) else float(1.0 if k_scale is None else k_scale)
    vs = v_scale if isinstance(v_scale, torch.Tensor) else float(1.0 if v_scale is None else v_scale)
    _kv_kernel[(tokens,)](k3, v3, k_cache.view(torch.uint8), v_cache.view(torch.uint8), cache_loc, ks, vs,
                          num_slots, ps, cache_loc.stride(0), *k3.stride(), *v3.stride(),
                          *_cache_strides(k_cache), *_cache_strides(v_cache), H=heads, D=dim,
                          HP=triton.next_power_of_2(heads), DP=triton.next_power_of_2(dim),
                          KS_PTR=isinstance(ks, torch.Tensor), VS_PTR=isinstance(vs, torch.Tensor), INTERP=_INTERP)
