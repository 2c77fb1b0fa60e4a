"""The fused Triton kernel: load K/V, scale, round, encode to fp8, store to the cache slot.

One program handles a [BLOCK_T tokens, BLOCK_H heads, BLOCK_D dims] tile of K and the same tile of
V, so cache_loc is read once for both. Sizes and strides are runtime arguments (the wrapper may fold
[H, D] into one row, kernel.fused.geometry). The recipe's four switches are constexprs: each recipe
compiles to straight-line code holding only its own steps. (Runtime switches kept every recipe's
code, and its registers, in one kernel, which cost bandwidth: docs/results/kernel-design-2026-12-02.md.)
Pointer alignment is not specialized (each of 7 pointers would double the variants); VEC says, after
the wrapper has checked, that every row starts 16-byte aligned, which 16-byte loads and stores need.

A scale is a float argument, one tensor element, or (PER_HEAD) one element per head: the wrapper
then keeps H and D apart, so that the tile's head index is the head. Scale tensors travel as integer
addresses, so that the scale kinds share compiled variants.

The E5M2 constexpr picks the cache's format (e4m3 otherwise; kernel.plan, docs/e5m2.md): the same
encoders with e5m2's constants. FNUZ (e4m3fnuz, ROCm MI300's e4m3) takes the software encoder only.
Two interchangeable encoders, chosen by the SOFTWARE constexpr:
- hardware: Triton's cast, `cvt.rn.satfinite.e4m3` on sm_89+ (RNE, ±448 saturation, NaN -> 0x7F),
  with an explicit fix-up for the recipes whose overflow is NaN;
- software: exact integer bit operations and fp32 adds. Triton's interpreter rounds float
  downcasts wrongly (triton-lang/triton#8322), and GPUs below sm_89 have no fp8 cast, so this path
  is the one used there; it is forced on the H200 to test it.
"""

from __future__ import annotations

import triton
import triton.language as tl

POINTER_ARGS = ["k_ptr", "v_ptr", "kc_ptr", "vc_ptr", "loc_ptr"]
INT_ARGS = [
    "ks_addr", "vs_addr", "ks_from_ptr", "vs_from_ptr", "ks_stride", "vs_stride",
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
def _e4m3_sw(y, SATURATE: tl.constexpr, ROUND_BF16: tl.constexpr, E5M2: tl.constexpr, FNUZ: tl.constexpr):
    """fp32 -> e4m3fn byte (E5M2: e5m2 byte) with integer operations and one fp32 add, which does the rounding.

    Adding c = 2**(E+20) to |y| (E: |y|'s binade, at least e4m3's -6) leaves |y| rounded to
    nearest-even at c's ulp, 2**(E-3), which is e4m3's quantum in that binade, subnormals included.
    The sum's bits minus c's bits are then |y| / quantum (8..16 for normals, 0..8 for subnormals),
    and the byte is (E + 6) * 8 plus that: a carry into the next binade falls out of the addition.
    ROUND_BF16 first rounds |y| to bf16 (the unfused recipes' intermediate step) the same way.
    The work is kept on the FMA pipe where it can be: this encoder is ALU-bound on Hopper, where
    integer operations issue at half the rate of fp32 adds (docs/results/kernel-design-2026-12-02.md).
    E5M2: the same with e5m2's 2 mantissa bits and binades from -14: c = 2**(E+21), the quantum
    2**(E-2), |y| / quantum 4..8 for normals, and the byte (E + 14) * 4 plus that.
    FNUZ: e4m3fnuz, e4m3's arithmetic with binades from -7 (bias 8): the byte (E + 7) * 8 plus |y| / quantum;
    the clamp at 240 (saturate) or 248 (the tie with 256: the carry lands on 0x80, fnuz's NaN); every
    NaN is 0x80 and a zero byte keeps no sign (fnuz has no -0: 0x80 would read as NaN).
    """
    b = y.to(tl.uint32, bitcast=True)
    a = b & 0x7FFFFFFF
    is_nan = a > 0x7F800000
    # Overflow: clamp the magnitude to 448 (saturate) or to 480, whose encoding is 0x7F (NaN);
    # (464, 480) round up to 480 and 464 itself is a tie that goes to the even 448. Both limits are
    # bf16 values, so clamping before the bf16 rounding gives what clamping after it would.
    if E5M2:
        # 57344 (saturate), or 61440, the tie between 57344 and 65536, which goes to the even 65536:
        # the carry lands on 0x7C, e5m2's inf. Both are bf16 (and fp16) values too.
        a = tl.minimum(a, 0x47600000 if SATURATE else 0x47700000)
    elif FNUZ:
        a = tl.minimum(a, 0x43700000 if SATURATE else 0x43780000)  # 240, or 248 (bf16 and fp16 values)
    else:
        a = tl.minimum(a, 0x43E00000 if SATURATE else 0x43F00000)
    exponent = a & 0x7F800000  # 2**E as bits
    mag_f = a.to(tl.float32, bitcast=True)
    if ROUND_BF16:
        # RNE to bf16: adding c16 = 2**(E+16) rounds |y| at c16's ulp, 2**(E-7), bf16's quantum in
        # binade E; subtracting it back is exact. (fp32 subnormals, E = 0 here, are rounded more
        # finely than bf16 would, but they are far below e4m3's smallest subnormal either way.)
        # A carry into binade E+1 needs no care: the e4m3 step below still uses E, and the carry
        # falls out of its integer arithmetic as it does there.
        c16 = (exponent + (16 << 23)).to(tl.float32, bitcast=True)
        mag_f = (mag_f + c16) - c16
    if E5M2:
        binade = tl.maximum(exponent, 0x38800000)  # 2**E as bits, E >= -14
        c = binade + (21 << 23)
    elif FNUZ:
        binade = tl.maximum(exponent, 0x3C000000)  # 2**E as bits, E >= -7
        c = binade + (20 << 23)
    else:
        binade = tl.maximum(exponent, 0x3C800000)  # 2**E as bits, E >= -6
        c = binade + (20 << 23)
    total = (mag_f + c.to(tl.float32, bitcast=True)).to(tl.uint32, bitcast=True)
    if E5M2:
        mag = total - c + (binade >> 21) - 452  # (E + 127) * 4 - 452 = (E + 14) * 4
    elif FNUZ:
        mag = total - c + (binade >> 20) - 960  # (E + 127) * 8 - 960 = (E + 7) * 8
    else:
        mag = total - c + (binade >> 20) - 968  # (E + 127) * 8 - 968 = (E + 6) * 8
    if FNUZ:  # a constexpr branch: e4m3's and e5m2's code is the line below, unchanged
        return tl.where(is_nan, 0x80, tl.where(mag == 0, 0, mag | ((b >> 24) & 0x80))).to(tl.uint8)
    else:
        return tl.where(is_nan, 0x7F, mag | ((b >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def _e4m3_hw(y, SATURATE: tl.constexpr, E5M2: tl.constexpr):
    """fp32 -> e4m3fn byte (E5M2: e5m2 byte) through the hardware cast, plus the overflow fix-up.
    The hardware encoder only runs compiled on sm_89+ (kernel.backend.resolve_encoder), where Triton
    lowers both casts to cvt.rn.satfinite (RNE, saturating at the format's largest finite value)."""
    if E5M2:
        # satfinite already gives ±57344 past the range; only NaN is set here, to the reference's 0x7F
        # whatever its sign (a clamp before the cast, for targets without cvt, cost 14 points of
        # bandwidth: docs/results/h200-2026-12-04-b.md).
        byte = y.to(tl.float8e5).to(tl.uint8, bitcast=True)
        byte = tl.where(y != y, 0x7F, byte).to(tl.uint8)
        if not SATURATE:
            # From 61440 (the tie that rounds to 65536) the non-saturating rule gives inf: ±57344's
            # byte (0x7B/0xFB) plus one (0x7C/0xFC).
            byte = byte + (tl.abs(y) >= 61440.0).to(tl.uint8)
    else:
        byte = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)  # RNE, ±448 saturation, NaN -> 0x7F
        if not SATURATE:
            # Past 464 the cast gave ±448 (0x7E/0xFE); the NaN of that sign is one more (0x7F/0xFF).
            byte = byte | (tl.abs(y) > 464.0).to(tl.uint8)
    return byte


@triton.jit
def _load_scale(addr, value, from_ptr, stride, h64, h_ok, IN_DTYPE: tl.constexpr, SCALE_IN_INPUT: tl.constexpr,
                SOFTWARE: tl.constexpr, PER_HEAD: tl.constexpr):
    """The scale as fp32: the float argument, or the tensor's one element, rounded if the recipe says.
    `addr` is the scale tensor's address as an integer: a typed pointer argument would make each scale
    kind (float: no tensor; a tensor) its own compiled variant.
    PER_HEAD (either scale is per head): tensor[h * stride] for each head h of the tile ([1, BLOCK_H, 1];
    a one-element tensor has stride 0, a float is broadcast; heads past H read 1.0)."""
    ptr = addr.to(tl.int64).to(tl.pointer_type(tl.float32))
    v = tl.full((), value, tl.float32)  # the interpreter would type an fp32 subnormal as fp64
    if PER_HEAD:
        s = tl.where(h_ok, v, 1.0)
        if from_ptr != 0:
            s = tl.load(ptr + h64 * stride, mask=h_ok, other=1.0).to(tl.float32)
        s = s[None, :, None]
    else:
        s = v
        if from_ptr != 0:
            s = tl.load(ptr).to(tl.float32)
    if SCALE_IN_INPUT:
        s = _round_input(s, IN_DTYPE, SOFTWARE)
    return s


@triton.jit
def fma_probe(out_ptr):
    """fma(1 + 2**-12, 1 + 2**-12, -1): 2**-11 + 2**-24 when rounded once, 2**-11 when rounded twice."""
    a = tl.full((1,), 1.0 + 2.0**-12, tl.float32)
    tl.store(out_ptr + tl.arange(0, 1), tl.fma(a, a, tl.full((1,), -1.0, tl.float32)))


@triton.jit
def _markstein(x32, s):
    """x / s for 2**-64 <= s <= 2**126, without a division per element.

    Triton's IEEE division (`div.rn.f32`) is a multi-instruction sequence with a slow-path call per
    element, which made the divide recipes ALU-bound (docs/results/kernel-design-2026-12-02.md).
    Instead, Markstein's correction of q0 = x * RN(1/s): the residual x - q0 * s is exact in one
    FMA, and RN(q0 + residual * RN(1/s)) is the correctly rounded quotient (Markstein's theorem,
    Handbook of Floating-Point Arithmetic, 2nd ed., Theorem 4.10) wherever nothing underflows.
    For s in this range that holds for every quotient from 2**-36 upwards, far below the 2**-10
    under which every e4m3 byte is ±0. The residual is ±inf or NaN only when q0 is ±inf or NaN,
    which is then the answer.
    Signs: negations are written `v * -1.0`, an exact sign flip that ptxas folds into the FMA's
    operand. Triton compiles `-v` as `0 - v`, which costs an add and turns -0 into +0. With true
    negations the signs come out right by themselves: x = ±0 gives q0 = ±0, residual = +0, and
    q0 + (-0) * r = q0; a nonzero x gives a nonzero exact value, whose rounding keeps its sign.
    """
    return markstein_with(x32, s, tl.math.div_rn(1.0, s))  # the division once a program: s is uniform


@triton.jit
def markstein_with(x32, s, r):
    """`_markstein`'s x / s given r = RN(1/s), which a constant divisor passes as a constant."""
    q0 = x32 * r
    residual = tl.fma(q0, s, x32 * -1.0)
    return tl.where(tl.abs(residual) < float("inf"), tl.fma(residual * -1.0, r, q0), q0)


@triton.jit
def _divide(x32, s, EXACT_FMA: tl.constexpr, PER_HEAD: tl.constexpr):
    """x / s, correctly rounded like IEEE fp32 division wherever a byte can depend on it.

    Scales outside [2**-64, 2**126] (subnormal scales included) are first brought into it: x and s
    are both multiplied by k = 2**100 or 2**-100, which leaves the quotient's value unchanged and is
    exact unless x * k leaves fp32's range; then the quotient is at least 2**92 (it saturates, as an
    overflow to ±inf does) or below 2**-126 (±0 in e4m3, and the sign survives the scaling). Both
    branches are the same few instructions, so the rare one costs no registers in the common one
    (an IEEE-division fallback there raised the divide recipes' register count:
    docs/results/kernel-design-2026-12-02.md).
    Triton interpreters whose fma rounds twice (EXACT_FMA false, kernel.backend.fma_is_exact) take
    IEEE division. Checked: numpy with an exact FMA against IEEE division (bf16, fp16 and random fp32
    inputs, thousands of scales), and through this kernel by conformance/test_exhaustive.py (tiny,
    subnormal and huge scales) and tools.sweep_fp32.
    """
    if EXACT_FMA:
        if PER_HEAD:  # a scale per head: the same scaling, chosen per lane (k = 1 is exact)
            kh = tl.where((s >= 2.0**-64) & (s <= 2.0**126), 1.0, tl.where(s < 1.0, 2.0**100, 2.0**-100))
            q = _markstein(x32 * kh, s * kh)
        elif (s >= 2.0**-64) & (s <= 2.0**126):
            q = _markstein(x32, s)
        else:
            k = tl.where(s < 1.0, 2.0**100, 2.0**-100)
            q = _markstein(x32 * k, s * k)
    else:
        q = tl.math.div_rn(x32, s + tl.zeros_like(x32))
    return q


@triton.jit
def _quantize(x, s, MUL_RECIPROCAL: tl.constexpr, INTERMEDIATE: tl.constexpr, SATURATE: tl.constexpr,
              IN_DTYPE: tl.constexpr, SOFTWARE: tl.constexpr, EXACT_FMA: tl.constexpr, PER_HEAD: tl.constexpr,
              E5M2: tl.constexpr, FNUZ: tl.constexpr):
    """Input values -> fp8 bytes (e4m3, or e5m2, or e4m3fnuz) under the recipe's switches (see kernel/recipe.py).
    FNUZ comes with SOFTWARE set (fused.kernel_args): no GPU this kernel targets has an e4m3fnuz cast
    that Triton lowers the same everywhere (NVIDIA has none)."""
    if SOFTWARE and IN_DTYPE == tl.bfloat16:
        # Widen by bits: the interpreter's bf16 -> fp32 cast loses subnormals (0x8001 -> -0).
        x32 = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        x32 = x.to(tl.float32)  # exact widening
    if MUL_RECIPROCAL:
        y = x32 * tl.math.div_rn(1.0, s)
    else:
        y = _divide(x32, s, EXACT_FMA, PER_HEAD)
    if SOFTWARE and IN_DTYPE == tl.bfloat16:
        byte = _e4m3_sw(y, SATURATE, INTERMEDIATE, E5M2, FNUZ)  # the encoder rounds to bf16 itself, with fp32 adds
    else:
        if INTERMEDIATE:
            y = _round_input(y, IN_DTYPE, SOFTWARE)
        if SOFTWARE:  # always for FNUZ: kernel_args sets it
            byte = _e4m3_sw(y, SATURATE, False, E5M2, FNUZ)
        else:
            byte = _e4m3_hw(y, SATURATE, E5M2)
    return byte


@triton.jit
def _pointers(base, rows, h64, d64, s_h, s_d, VEC: tl.constexpr):
    """Pointers to a [BT, BH, BD] tile from each token's row offset (in elements).

    With VEC the wrapper has checked that the base is 16-byte aligned, every row offset a multiple
    of 16 elements and dims unit-stride: each row then starts 16-byte aligned, and the hint lets
    Triton emit 16-byte loads and stores.
    """
    rows = base + (rows[:, None] + h64[None, :] * s_h)
    if VEC:
        rows = tl.multiple_of(rows, (16, 16))
        return rows[:, :, None] + d64[None, None, :]
    return rows[:, :, None] + (d64 * s_d)[None, None, :]


@triton.jit(do_not_specialize=INT_ARGS, do_not_specialize_on_alignment=POINTER_ARGS)
def fp8_kv_write(
    k_ptr, v_ptr, kc_ptr, vc_ptr, loc_ptr, ks_addr, vs_addr,
    ks_value, vs_value, ks_from_ptr, vs_from_ptr, ks_stride, vs_stride,
    T, H, D, page_size, num_slots, loc_stride,
    k_st, k_sh, k_sd, v_st, v_sh, v_sd,
    kc_sp, kc_so, kc_sh, kc_sd, vc_sp, vc_so, vc_sh, vc_sd,
    MUL_RECIPROCAL: tl.constexpr, SCALE_IN_INPUT: tl.constexpr, INTERMEDIATE: tl.constexpr,
    SATURATE: tl.constexpr, SOFTWARE: tl.constexpr, EXACT_FMA: tl.constexpr, VEC: tl.constexpr,
    PER_HEAD: tl.constexpr, E5M2: tl.constexpr, FNUZ: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    t64, h64, d64 = t.to(tl.int64), h.to(tl.int64), d.to(tl.int64)  # offsets are 64-bit safe

    d_ok = d < D
    if VEC:
        d_ok = tl.max_constancy(d_ok, 16)  # D % 16 == 0, so the mask is constant per 16 dims
    inside = (t < T)[:, None, None] & (h < H)[None, :, None] & d_ok[None, None, :]

    # The inputs are read wherever the tile lies inside [T, H, D], padding tokens included, so the
    # reads need not wait for cache_loc: masked by `writes`, a decode call was two dependent DRAM
    # round trips. They are issued first: the slot lookup's 64-bit division branches, and the compiler
    # moves no load above a branch. Both are issued before any store: the stores may alias the inputs
    # as far as the compiler knows, so this order is what keeps K's and V's reads in flight together.
    xk = tl.load(_pointers(k_ptr, t64 * k_st, h64, d64, k_sh, k_sd, VEC), mask=inside, other=0.0)
    xv = tl.load(_pointers(v_ptr, t64 * v_st, h64, d64, v_sh, v_sd, VEC), mask=inside, other=0.0)
    ks = _load_scale(ks_addr, ks_value, ks_from_ptr, ks_stride, h64, h < H, k_ptr.dtype.element_ty, SCALE_IN_INPUT,
                     SOFTWARE, PER_HEAD)
    vs = _load_scale(vs_addr, vs_value, vs_from_ptr, vs_stride, h64, h < H, k_ptr.dtype.element_ty, SCALE_IN_INPUT,
                     SOFTWARE, PER_HEAD)

    # Padding (negative) and out-of-range slots write nothing, whatever cache_loc holds.
    loc = tl.load(loc_ptr + t64 * loc_stride, mask=t < T, other=-1).to(tl.int64)
    writes = (t < T) & (loc >= 0) & (loc < num_slots)
    page = loc // page_size
    offset = loc - page * page_size
    k_slot_rows = page * kc_sp + offset * kc_so
    v_slot_rows = page * vc_sp + offset * vc_so
    mask = inside & writes[:, None, None]
    bk = _quantize(xk, ks, MUL_RECIPROCAL, INTERMEDIATE, SATURATE, k_ptr.dtype.element_ty, SOFTWARE, EXACT_FMA,
                   PER_HEAD, E5M2, FNUZ)
    tl.store(_pointers(kc_ptr, k_slot_rows, h64, d64, kc_sh, kc_sd, VEC), bk, mask=mask)
    bv = _quantize(xv, vs, MUL_RECIPROCAL, INTERMEDIATE, SATURATE, k_ptr.dtype.element_ty, SOFTWARE, EXACT_FMA,
                   PER_HEAD, E5M2, FNUZ)
    tl.store(_pointers(vc_ptr, v_slot_rows, h64, d64, vc_sh, vc_sd, VEC), bv, mask=mask)

