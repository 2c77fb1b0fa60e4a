"""The per-(token, head) FP8 write as one Triton launch: the spec of kernel/per_token_head.py, exactly.

One program a token and BLOCK_H heads, each head's D values in one row of BLOCK_D lanes, so a head's
amax is one in-register reduction. The launch creates no tensor and reads nothing back (graph-capturable).
Exactness, on GPU and in the interpreter alike:
- NaN never reaches tl.max or a min/max: lanes holding NaN enter the max as 0 and a head's NaN is
  tracked as a flag, then s = NaN by an explicit select (Triton's NaN rule for max differs between the
  compiled reduction, which drops NaN, and the interpreter's numpy, which keeps it);
- both divisions are `tl.math.div_rn` (IEEE; Triton's `/` is the approximate div.full.f32);
- the floors and the NaN scale are fp32 bit patterns, not literals left to a compiler to round;
- the e4m3 encoders are kernel/triton_kernel.py's (software: exact integer operations, for the
  interpreter and below sm_89; hardware: cvt.rn.satfinite).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel.backend import interpreted, resolve_encoder
from kernel.fused import _pow2_at_least
from kernel.per_token_head import (
    FLOOR_FLASHINFER,
    FLOOR_VLLM,
    NAN_SCALE_BITS,
    PTHPlan,
    fp32_bits,
    make_pth_plan,
    write_per_token_head,
)
from kernel.plan import Plan
from kernel.recipe import DEFAULT_RECIPE
from kernel.triton_kernel import _e4m3_hw, _e4m3_sw

INT_ARGS = [
    "T", "H", "D", "page_size", "num_slots", "loc_stride",
    "k_st", "k_sh", "k_sd", "v_st", "v_sh", "v_sd",
    "kc_sp", "kc_so", "kc_sh", "kc_sd", "vc_sp", "vc_so", "vc_sh", "vc_sd",
    "ks_sp", "ks_so", "ks_sh", "vs_sp", "vs_so", "vs_sh",
]


@triton.jit
def _f32(bits: tl.constexpr):
    return tl.full((), bits, tl.uint32).to(tl.float32, bitcast=True)


@triton.jit
def _write_one(x_ptr, x_row, x_sh, x_sd, c_ptr, c_row, c_sh, c_sd, s_ptr, s_row, s_sh,
               h64, d64, h_ok, inside, writes, D,
               VLLM: tl.constexpr, INLINE: tl.constexpr, SOFTWARE: tl.constexpr,
               FLOOR_V: tl.constexpr, FLOOR_F: tl.constexpr, NAN_BITS: tl.constexpr):
    """Quantize one token's [BLOCK_H, BLOCK_D] heads of K (or V) and store bytes and scales where `writes`
    ([BLOCK_H]: the head exists and the token's slot is in range)."""
    x = tl.load(x_ptr + x_row + h64[:, None] * x_sh + d64[None, :] * x_sd, mask=inside, other=0.0)
    if SOFTWARE and x_ptr.dtype.element_ty == tl.bfloat16:
        # Widen by bits: the interpreter's bf16 -> fp32 cast loses subnormals (kernel/triton_kernel.py).
        x32 = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        x32 = x.to(tl.float32)
    is_nan = x32 != x32
    amax = tl.max(tl.where(is_nan, 0.0, tl.abs(x32)), axis=1)  # NaN-free: exact on every backend
    has_nan = tl.max(is_nan.to(tl.int32), axis=1) > 0
    q_max = tl.zeros_like(amax) + 448.0
    if VLLM:
        s = tl.math.div_rn(amax, q_max)
        s = tl.where(s < _f32(FLOOR_V), _f32(FLOOR_V), s)
    else:
        s = tl.math.div_rn(tl.where(amax < _f32(FLOOR_F), _f32(FLOOR_F), amax), q_max)
    s = tl.where(has_nan, _f32(NAN_BITS), s)
    if VLLM:
        y = x32 * tl.math.div_rn(tl.zeros_like(s) + 1.0, s)[:, None]
        y = tl.where(y > 448.0, 448.0, tl.where(y < -448.0, -448.0, y))  # tl.clamp; NaN passes
    else:
        y = tl.math.div_rn(x32, s[:, None] + tl.zeros_like(x32))
    if SOFTWARE:
        byte = _e4m3_sw(y, True, False, False, False)  # e4m3 only (no E5M2, no FNUZ)
    else:
        byte = _e4m3_hw(y, True, False)
    tl.store(c_ptr + (c_row + h64 * c_sh)[:, None] + d64[None, :] * c_sd, byte, mask=inside & writes[:, None])
    if INLINE:  # the scale's 4 bytes, little-endian, at positions D..D+3 of the head's slot
        j = tl.arange(0, 4)
        bits = s.to(tl.uint32, bitcast=True)
        b = ((bits[:, None] >> (j * 8).to(tl.uint32)[None, :]) & 0xFF).to(tl.uint8)
        ptrs = c_ptr + (c_row + h64 * c_sh)[:, None] + (D + j).to(tl.int64)[None, :] * c_sd
        tl.store(ptrs, b, mask=writes[:, None] & (j < 4)[None, :])
    else:
        tl.store(s_ptr + s_row + h64 * s_sh, s, mask=writes)


@triton.jit(do_not_specialize=INT_ARGS)
def per_token_head_write(
    k_ptr, v_ptr, kc_ptr, vc_ptr, loc_ptr, ks_ptr, vs_ptr,
    T, H, D, page_size, num_slots, loc_stride,
    k_st, k_sh, k_sd, v_st, v_sh, v_sd,
    kc_sp, kc_so, kc_sh, kc_sd, vc_sp, vc_so, vc_sh, vc_sd,
    ks_sp, ks_so, ks_sh, vs_sp, vs_so, vs_sh,
    VLLM: tl.constexpr, INLINE: tl.constexpr, SOFTWARE: tl.constexpr,
    FLOOR_V: tl.constexpr, FLOOR_F: tl.constexpr, NAN_BITS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h64 = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    d64 = tl.arange(0, BLOCK_D).to(tl.int64)
    h_ok = h64 < H
    inside = h_ok[:, None] & (d64 < D)[None, :]
    # The token's slot, once a head lane: masks stay vectors (the interpreter refuses a scalar's in a store).
    loc = tl.load(loc_ptr + t * loc_stride + tl.zeros_like(h64)).to(tl.int64)
    in_range = (loc >= 0) & (loc < num_slots)  # padding and out-of-range slots write nothing
    writes = h_ok & in_range
    page = tl.where(in_range, loc, 0) // page_size  # [BLOCK_H], the same in every lane
    offset = tl.where(in_range, loc, 0) - page * page_size
    _write_one(k_ptr, t * k_st, k_sh, k_sd, kc_ptr, page * kc_sp + offset * kc_so, kc_sh, kc_sd,
               ks_ptr, page * ks_sp + offset * ks_so, ks_sh, h64, d64, h_ok, inside, writes, D,
               VLLM, INLINE, SOFTWARE, FLOOR_V, FLOOR_F, NAN_BITS)
    _write_one(v_ptr, t * v_st, v_sh, v_sd, vc_ptr, page * vc_sp + offset * vc_so, vc_sh, vc_sd,
               vs_ptr, page * vs_sp + offset * vs_so, vs_sh, h64, d64, h_ok, inside, writes, D,
               VLLM, INLINE, SOFTWARE, FLOOR_V, FLOOR_F, NAN_BITS)


def _scale_strides(sc: torch.Tensor | None, page_size: int) -> tuple[int, int, int]:
    """(page, offset, head) element strides of a scale cache; a 2-D [S, H] one reuses its slot stride."""
    if sc is None:
        return 0, 0, 0
    if sc.dim() == 2:
        return page_size * sc.stride(0), sc.stride(0), sc.stride(1)
    return sc.stride(0), sc.stride(1), sc.stride(2)


def launch_per_token_head(plan: PTHPlan, encoder: str | None = None) -> None:
    """Run the kernel for a validated plan (nothing to do for T == 0)."""
    if plan.num_tokens == 0:
        return
    if plan.k.device.type == "cuda" and plan.k.device.index != torch.cuda.current_device():
        with torch.cuda.device(plan.k.device):  # Triton launches on the current device (docs/facts.md)
            return launch_per_token_head(plan, encoder)
    if plan.k.device.type != "cuda" and not interpreted():
        raise ValueError(f"fused_fp8_set_kv_buffer: tensors must be on a CUDA device (or run with "
                         f"TRITON_INTERPRET=1), got {plan.k.device}")
    software = resolve_encoder(encoder, plan.k.device) == "software"
    block_d = _pow2_at_least(plan.head_dim)
    cap = 4 if interpreted() else max(1, 2048 // block_d)
    block_h = min(_pow2_at_least(plan.num_heads), cap)
    grid = (plan.num_tokens, triton.cdiv(plan.num_heads, block_h))
    kc = plan.k_cache if plan.k_cache.dtype == torch.uint8 else plan.k_cache.view(torch.uint8)
    vc = plan.v_cache if plan.v_cache.dtype == torch.uint8 else plan.v_cache.view(torch.uint8)
    # Inline: the scale pointers are unused; the cache_loc tensor stands in (no tensor is made).
    ks = plan.k_scale_cache if plan.k_scale_cache is not None else plan.cache_loc
    vs = plan.v_scale_cache if plan.v_scale_cache is not None else plan.cache_loc
    per_token_head_write[grid](
        plan.k, plan.v, kc, vc, plan.cache_loc, ks, vs,
        plan.num_tokens, plan.num_heads, plan.head_dim, plan.page_size, plan.num_slots, plan.cache_loc.stride(0),
        *plan.k.stride(), *plan.v.stride(),
        *Plan.cache_strides(plan.k_cache, plan.page_size), *Plan.cache_strides(plan.v_cache, plan.page_size),
        *_scale_strides(plan.k_scale_cache, plan.page_size), *_scale_strides(plan.v_scale_cache, plan.page_size),
        VLLM=plan.recipe.rule == "vllm", INLINE=plan.inline, SOFTWARE=software,
        FLOOR_V=fp32_bits(FLOOR_VLLM), FLOOR_F=fp32_bits(FLOOR_FLASHINFER), NAN_BITS=NAN_SCALE_BITS,
        BLOCK_H=block_h, BLOCK_D=block_d, num_warps=1 if interpreted() else 4,
    )


def fused_per_token_head(k: object, v: object, k_cache: object, v_cache: object, cache_loc: object,
                         k_scale: object = None, v_scale: object = None, page_size: object = 16,
                         use_triton: bool = True, *, per_token_head: object = True, recipe: object = DEFAULT_RECIPE,
                         checked: object = False, encoder: str | None = None, k_scale_cache: object = None,
                         v_scale_cache: object = None, cache_dtype: object = None) -> None:
    """What `kernel.fused_fp8_set_kv_buffer(per_token_head=...)` runs: validate, then one launch
    (use_triton=False: the reference)."""
    plan = make_pth_plan(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
                         per_token_head=per_token_head, recipe=recipe, checked=checked,
                         k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache, cache_dtype=cache_dtype)
    if not use_triton:
        if plan.num_tokens:
            write_per_token_head(plan)
        return
    launch_per_token_head(plan, encoder)
