"""The fused Triton kernel: load K/V, scale, round, encode to e4m3, store to the cache slot.

One program handles a [BLOCK_T tokens, BLOCK_H heads, BLOCK_D dims] tile of K and the same tile of
V, so cache_loc is read once for both. Sizes, strides and the recipe's switches are runtime
arguments (one compiled kernel serves every shape and recipe); only what changes the generated code
is a constexpr: the tile, the encoder, and whether the vectorization hints hold.

Two interchangeable e4m3 encoders, chosen by the SOFTWARE constexpr:
- hardware: Triton's cast, `cvt.rn.satfinite.e4m3` on sm_89+ (RNE, ±448 saturation, NaN -> 0x7F),
  with an explicit fix-up for the recipes whose overflow is NaN;
- software: exact integer bit operations. Triton's interpreter rounds float downcasts wrongly
  (triton-lang/triton#8322), and GPUs below sm_89 have no fp8 cast, so this path is the one used
  there; it is forced on the H200 to test it.
"""

from __future__ import annotations

import triton
import triton.language as tl

INT_ARGS = [
    "ks_from_ptr", "vs_from_ptr", "mul_reciprocal", "scale_in_input", "intermediate", "saturate",
    "T", "H", "D", "page_size", "num_slots", "loc_stride",
    "k_st", "k_sh", "k_sd", "v_st", "v_sh", "v_sd",
    "kc_sp", "kc_so", "kc_sh", "kc_sd", "vc_sp", "vc_so", "vc_sh", "vc_sd",
]


@triton.jit
def _round_bf16_sw(y):
    """RNE of fp32 to bf16, returned as fp32: add 0x7FFF plus the kept LSB, drop 16 bits.

    Subnormals need no special case (bf16 shares fp32's exponent range); a carry out of the
    largest finite value correctly gives inf. NaN passes through unchanged.
    """
    b = y.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return tl.where(y != y, y, r.to(tl.float32, bitcast=True))


@triton.jit
def _round_input(y, IN_DTYPE: tl.constexpr, SOFTWARE: tl.constexpr):
    """Round fp32 values to the input dtype (RNE), returned as fp32."""
    if IN_DTYPE == tl.bfloat16:
        if SOFTWARE:
            out = _round_bf16_sw(y)
        else:
            out = y.to(tl.bfloat16).to(tl.float32)  # cvt.rn.bf16.f32
    elif IN_DTYPE == tl.float16:
        out = y.to(tl.float16).to(tl.float32)  # cvt.rn.f16.f32; numpy's correct cast when interpreted
    else:
        out = y
    return out


@triton.jit
def _e4m3_sw(y, saturate):
    """fp32 -> e4m3fn byte with integer operations and one exact fp32 add (c10's method)."""
    b = y.to(tl.uint32, bitcast=True)
    sign = (b >> 24) & 0x80
    a = b & 0x7FFFFFFF
    is_nan = a > 0x7F800000
    # Overflow: clamp the magnitude to 448 (saturate) or to 480, whose encoding is 0x7F (NaN).
    a = tl.minimum(a, tl.where(saturate != 0, 0x43E00000, 0x43F00000))
    # Normal (|y| >= 2**-6): rebias the exponent from 127 to 7 and drop 20 mantissa bits, adding
    # 0x7FFFF plus the lowest kept bit: round to nearest, ties to even.
    normal = (a - 0x3C000000 + 0x7FFFF + ((a >> 20) & 1)) >> 20
    # Subnormal: 2**14 + |y| rounds |y| to the e4m3 quantum 2**-9 (an IEEE add rounds to nearest
    # even); the low mantissa bits are then the e4m3 code. Exact on every backend, FTZ included.
    subnormal = (a.to(tl.float32, bitcast=True) + 16384.0).to(tl.uint32, bitcast=True) - 0x46800000
    mag = tl.where(a >= 0x3C800000, normal, subnormal)
    return tl.where(is_nan, 0x7F, mag | sign).to(tl.uint8)


@triton.jit
def _e4m3_hw(y, saturate):
    """fp32 -> e4m3fn byte through the hardware cast, plus the NaN-overflow fix-up."""
    byte = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)  # RNE, ±448 saturation, NaN -> 0x7F
    sign = ((y.to(tl.uint32, bitcast=True) >> 24) & 0x80).to(tl.uint8)
    nan_overflow = (saturate == 0) & (tl.abs(y) > 464.0)  # rounds past 448 onto the NaN pattern
    return tl.where(nan_overflow, sign | 0x7F, byte)


@triton.jit
def _load_scale(ptr, value, from_ptr, IN_DTYPE: tl.constexpr, scale_in_input, SOFTWARE: tl.constexpr):
    """The scale as fp32: the float argument, or the tensor's one element, rounded if the recipe says."""
    s = tl.full((), value, tl.float32)  # the interpreter would type an fp32 subnormal as fp64
    if from_ptr != 0:
        s = tl.load(ptr).to(tl.float32)
    if scale_in_input != 0:
        s = _round_input(s, IN_DTYPE, SOFTWARE)
    return s


@triton.jit
def _quantize(x, s, mul_reciprocal, intermediate, saturate, IN_DTYPE: tl.constexpr, SOFTWARE: tl.constexpr):
    """Input values -> e4m3 bytes under the recipe's switches (see kernel/recipe.py)."""
    if SOFTWARE and IN_DTYPE == tl.bfloat16:
        # Widen by bits: the interpreter's bf16 -> fp32 cast loses subnormals (0x8001 -> -0).
        x32 = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        x32 = x.to(tl.float32)  # exact widening
    if mul_reciprocal != 0:
        y = x32 * tl.math.div_rn(1.0, s)
    else:
        y = tl.math.div_rn(x32, s + tl.zeros_like(x32))
    if intermediate != 0:
        y = _round_input(y, IN_DTYPE, SOFTWARE)
    if SOFTWARE:
        byte = _e4m3_sw(y, saturate)
    else:
        byte = _e4m3_hw(y, saturate)
    return byte


@triton.jit
def _offsets(rows, h64, d64, s_h, s_d, VEC: tl.constexpr):
    """Element offsets of a [BT, BH, BD] tile from each token's row offset.

    With VEC the wrapper has checked that every row offset is a multiple of 16 and dims are
    unit-stride, so the hints let Triton emit 16-byte loads and stores.
    """
    rows = rows[:, None] + h64[None, :] * s_h
    if VEC:
        rows = tl.multiple_of(rows, (16, 16))
        return rows[:, :, None] + d64[None, None, :]
    return rows[:, :, None] + (d64 * s_d)[None, None, :]


@triton.jit(do_not_specialize=INT_ARGS)
def fp8_kv_write(
    k_ptr, v_ptr, kc_ptr, vc_ptr, loc_ptr, ks_ptr, vs_ptr,
    ks_value, vs_value, ks_from_ptr, vs_from_ptr,
    mul_reciprocal, scale_in_input, intermediate, saturate,
    T, H, D, page_size, num_slots, loc_stride,
    k_st, k_sh, k_sd, v_st, v_sh, v_sd,
    kc_sp, kc_so, kc_sh, kc_sd, vc_sp, vc_so, vc_sh, vc_sd,
    SOFTWARE: tl.constexpr, VEC: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    t64, h64, d64 = t.to(tl.int64), h.to(tl.int64), d.to(tl.int64)  # offsets are 64-bit safe

    # Padding (negative) and out-of-range slots write nothing, whatever cache_loc holds.
    loc = tl.load(loc_ptr + t64 * loc_stride, mask=t < T, other=-1).to(tl.int64)
    writes = (t < T) & (loc >= 0) & (loc < num_slots)
    page = loc // page_size
    offset = loc - page * page_size
    k_slot_rows = page * kc_sp + offset * kc_so
    v_slot_rows = page * vc_sp + offset * vc_so

    d_ok = d < D
    if VEC:
        d_ok = tl.max_constancy(d_ok, 16)  # D % 16 == 0, so the mask is constant per 16 dims
    mask = writes[:, None, None] & (h < H)[None, :, None] & d_ok[None, None, :]

    ks = _load_scale(ks_ptr, ks_value, ks_from_ptr, k_ptr.dtype.element_ty, scale_in_input, SOFTWARE)
    vs = _load_scale(vs_ptr, vs_value, vs_from_ptr, k_ptr.dtype.element_ty, scale_in_input, SOFTWARE)

    # Both loads are issued before any store: the stores may alias the inputs as far as the
    # compiler knows, so this order is what keeps K's and V's reads in flight together.
    xk = tl.load(k_ptr + _offsets(t64 * k_st, h64, d64, k_sh, k_sd, VEC), mask=mask, other=0.0)
    xv = tl.load(v_ptr + _offsets(t64 * v_st, h64, d64, v_sh, v_sd, VEC), mask=mask, other=0.0)
    bk = _quantize(xk, ks, mul_reciprocal, intermediate, saturate, k_ptr.dtype.element_ty, SOFTWARE)
    tl.store(kc_ptr + _offsets(k_slot_rows, h64, d64, kc_sh, kc_sd, VEC), bk, mask=mask)
    bv = _quantize(xv, vs, mul_reciprocal, intermediate, saturate, k_ptr.dtype.element_ty, SOFTWARE)
    tl.store(vc_ptr + _offsets(v_slot_rows, h64, d64, vc_sh, vc_sd, VEC), bv, mask=mask)

