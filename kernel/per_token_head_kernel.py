"""The per-(token, head) FP8 write as one Triton launch: the spec of kernel/per_token_head.py, exactly.

One program a [BLOCK_T tokens, BLOCK_H heads, BLOCK_D dims] tile of K and the same tile of V, each
head's D values one row of BLOCK_D lanes, so a head's amax is one in-register reduction (axis 2); the
grid covers token blocks and head blocks. The launch creates no tensor and reads nothing back
(graph-capturable). Pointer alignment is not specialized (each of 7 pointers would double the compiled
variants); instead the wrapper, after it checked strides and base addresses, says how many bytes of a
head's row a thread may load (X_ALIGN) and store (C_ALIGN) at once, and VEC, the larger in elements,
that dims are unit-stride and the mask constant over that many (see `_widths`).
Exactness, on GPU and in the interpreter alike:
- NaN never reaches a floating-point max or min: a head's amax is the integer max of its |x|'s bit
  patterns, which order like the values, and a NaN's bits exceed inf's, so the same max says whether
  the head holds a NaN (a flag), and s = NaN by an explicit select (Triton's NaN rule for a float max
  differs between the compiled reduction, which drops NaN, and the interpreter's numpy, which keeps it);
- the per-head divisions are correctly rounded: amax / 448 by Markstein's correction with RN(1/448) a
  constant where tl.fma rounds once (EXACT_FMA; `_over_448`), vLLM's reciprocal 1/s by `tl.math.div_rn`
  (IEEE; Triton's `/` is the approximate div.full.f32); per element, vLLM's recipe multiplies by that
  reciprocal and FlashInfer's divides, correctly rounded by kernel/triton_kernel.py's Markstein sequence
  where tl.fma rounds once, else by div_rn;
- the floors and the NaN scale are fp32 bit patterns, not literals left to a compiler to round;
- the e4m3 encoders are kernel/triton_kernel.py's (software: exact integer operations, for the
  interpreter and below sm_89; hardware: cvt.rn.satfinite), both saturating at ±448 with NaN passing
  as 0x7F, which is the recipe's clamp, so the clamp is not repeated before them.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernel.backend import fma_is_exact, interpreted, resolve_encoder
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
from kernel.triton_kernel import _e4m3_hw, _e4m3_sw, _markstein, markstein_with

# RN(1/448), exact though rounded twice (double, then fp32): 1/7's bits repeat 001, so never a tie.
RECIPROCAL_448_BITS = tl.constexpr(fp32_bits(1 / 448))

POINTER_ARGS = ["k_ptr", "v_ptr", "kc_ptr", "vc_ptr", "loc_ptr", "ks_ptr", "vs_ptr"]
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
def _rows(base, rows, h64, s_h, ALIGN: tl.constexpr):
    """[BT, BH] pointers to each head's first element from each token's row offset (in elements);
    ALIGN > 1: the wrapper has checked that every one of them is ALIGN-byte aligned."""
    ptrs = base + (rows[:, None] + h64[None, :] * s_h)
    if ALIGN > 1:
        ptrs = tl.multiple_of(ptrs, (ALIGN, ALIGN))
    return ptrs


@triton.jit
def _tile(rows, d64, s_d, VEC: tl.constexpr):
    """[BT, BH, BD] pointers of the heads' elements; with VEC > 1 dims are unit-stride (wrapper-checked),
    which tells Triton the row is contiguous."""
    if VEC > 1:
        return rows[:, :, None] + d64[None, None, :]
    return rows[:, :, None] + (d64 * s_d)[None, None, :]


@triton.jit
def _widen(x, SOFTWARE: tl.constexpr):
    """Input values -> fp32, exactly."""
    if SOFTWARE and x.dtype == tl.bfloat16:
        # Widen by bits: the interpreter's bf16 -> fp32 cast loses subnormals (kernel/triton_kernel.py).
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return x.to(tl.float32)


@triton.jit
def _amax_bits(x32):
    """[BT, BH, BD] fp32 values -> each head's max |x| as fp32 bits (int32 [BT, BH]). |x|'s bits as integers
    order like |x| (+0 < subnormals < normals < inf < NaNs): one exact max on every backend gives amax and,
    above inf's bits, the head's NaN flag. Lanes outside the heads hold 0 (the loads' `other`), which never
    raises it."""
    amax_bits = tl.max(x32.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2)
    return amax_bits


@triton.jit
def _over_448(a, EXACT_FMA: tl.constexpr):
    """a / 448, correctly rounded (IEEE fp32 division), for a >= 0 or +inf.
    Where tl.fma rounds once: Markstein's correction with RN(1/448) a constant (kernel/triton_kernel.py's
    `_markstein`, whose range holds 448), which saves the IEEE division's multi-instruction sequence and its
    slow-path branch once a head. It is exact wherever nothing underflows, so for every a >= 2**-100; a
    smaller amax gives a quotient far below either floor (vLLM's scale floor, 1e-6; FlashInfer floors amax
    first, at 1e-12, so its quotient is at least 2**-49). a = +inf gives +inf. Checked for every fp32 a by
    `python -m tools.sweep_pth_scales` on CUDA (docs/results/)."""
    if EXACT_FMA:
        return markstein_with(a, tl.zeros_like(a) + 448.0, _f32(RECIPROCAL_448_BITS))
    return tl.math.div_rn(a, tl.zeros_like(a) + 448.0)


@triton.jit
def _scale_of(amax_bits, VLLM: tl.constexpr, EXACT_FMA: tl.constexpr, FLOOR_V: tl.constexpr,
              FLOOR_F: tl.constexpr, NAN_BITS: tl.constexpr):
    """Each head's `_amax_bits` -> its fp32 scale."""
    has_nan = amax_bits > 0x7F800000
    amax = tl.where(has_nan, 0, amax_bits).to(tl.float32, bitcast=True)
    if VLLM:
        s = _over_448(amax, EXACT_FMA)
        s = tl.where(s < _f32(FLOOR_V), _f32(FLOOR_V), s)
    else:
        s = _over_448(tl.where(amax < _f32(FLOOR_F), _f32(FLOOR_F), amax), EXACT_FMA)
    return tl.where(has_nan, _f32(NAN_BITS), s)


@triton.jit
def _reciprocal(s, VLLM: tl.constexpr):
    """vLLM's recipe multiplies by the IEEE reciprocal of each head's scale (FlashInfer's divides: s)."""
    if VLLM:
        return tl.math.div_rn(tl.zeros_like(s) + 1.0, s)
    return s


@triton.jit
def _encode(x32, s, r, VLLM: tl.constexpr, SOFTWARE: tl.constexpr, EXACT_FMA: tl.constexpr):
    """fp32 values, with their head's scale `s` and `_reciprocal` `r` (x32's shape, or one that broadcasts to
    it) -> e4m3 bytes."""
    if VLLM:
        y = x32 * r
    elif EXACT_FMA:
        # s = max(amax, 1e-12) / 448 lies in [2**-49, 2**120] (or is inf or NaN, whose quotients Markstein's
        # sequence gets right: x / inf = ±0, inf / inf and NaN: NaN), inside its exact range [2**-64, 2**126].
        y = _markstein(x32, s)
    else:
        y = tl.math.div_rn(x32, s + tl.zeros_like(x32))  # div_rn takes operands of one shape
    if SOFTWARE:
        return _e4m3_sw(y, True, False, False, False)  # e4m3 only (no E5M2, no FNUZ)
    return _e4m3_hw(y, True, False)


@triton.jit
def _quantize_heads(x, VLLM: tl.constexpr, SOFTWARE: tl.constexpr, EXACT_FMA: tl.constexpr,
                    FLOOR_V: tl.constexpr, FLOOR_F: tl.constexpr, NAN_BITS: tl.constexpr):
    """[BT, BH, BD] input values -> (e4m3 bytes [BT, BH, BD], each head's fp32 scale [BT, BH])."""
    x32 = _widen(x, SOFTWARE)
    s = _scale_of(_amax_bits(x32), VLLM, EXACT_FMA, FLOOR_V, FLOOR_F, NAN_BITS)
    return _encode(x32, s[:, :, None], _reciprocal(s, VLLM)[:, :, None], VLLM, SOFTWARE, EXACT_FMA), s


@triton.jit
def _store_words(ptrs, byte, mask, s, RUN: tl.constexpr, SCALE: tl.constexpr):
    """Store a [.., BD] byte tile as 4-byte words by inline PTX, each warp instruction writing runs of 4 * RUN
    contiguous bytes.

    Why: rows 4-byte aligned but no more (the inline layout's D + 4 pitch) get, from Triton's coalescing pass,
    a store layout of 4 bytes a thread, and the tile is moved to it from the loads' 8 a thread through shared
    memory (6 shared stores and 7 barriers in the inline kernel's SASS). Inline PTX is no memory op to that
    pass, so the tile keeps the loads' layout: the RUN consecutive lanes holding one run of 8 * RUN contiguous
    bytes swap words by warp shuffles, the first store writes the run's first half, word by word across the
    lanes, and the second its other half. Where it is used, and what else was tried: `_words`.
    The caller's conditions (`_words`): each thread holds its elements in groups of 8 consecutive bytes of one
    row, in lane order, RUN lanes to a run, the run inside the row's D elements and the mask constant over it
    (each lane stores by its own mask), and pointers 4-byte aligned.
    SCALE: the run is the head's whole row of D = 8 * RUN bytes, and the run's first lane also stores `s`, the
    head's fp32 scale (broadcast to the tile's shape), at byte D: the inline layout's scale, stored here
    because a store of the [BT, BH] scales from their own layout is one more shared-memory move."""
    tl.inline_asm_elementwise(
        asm="""{
        .reg .u32 lane, p, half, src_a, src_b, a0, a1, b0, b1, wa, wb;
        .reg .u64 back, at;
        .reg .pred keep, odd;
        mov.u32 lane, %laneid;
        sub.u32 p, $14, 1;
        and.b32 p, lane, p;                // this lane's place in its run
        shr.u32 half, $14, 1;
        sub.u32 src_a, lane, p;
        shr.u32 wa, p, 1;
        add.u32 src_a, src_a, wa;          // the lane holding word p of the run
        add.u32 src_b, src_a, half;        // ... and word RUN + p
        shfl.sync.idx.b32 a0, $2, src_a, 31, -1;
        shfl.sync.idx.b32 a1, $3, src_a, 31, -1;
        shfl.sync.idx.b32 b0, $2, src_b, 31, -1;
        shfl.sync.idx.b32 b1, $3, src_b, 31, -1;
        and.b32 wa, p, 1;
        setp.ne.u32 odd, wa, 0;
        selp.b32 wa, a1, a0, odd;
        selp.b32 wb, b1, b0, odd;
        setp.eq.b32 keep, $4, 0x01010101;
        setp.eq.and.b32 keep, $5, 0x01010101, keep;
        mul.wide.u32 back, p, 4;
        sub.u64 at, $6, back;              // the run's start + 4 p
        @keep st.global.b32 [at], wa;
        mul.wide.u32 back, $14, 4;
        add.u64 at, at, back;              // + 4 RUN
        @keep st.global.b32 [at], wb;
        setp.eq.and.u32 keep, p, 0, keep;
        setp.ne.and.u32 keep, $30, 0, keep;
        add.u64 at, at, back;              // + 8 RUN: the scale's place, stored by lane 0 of the run
        @keep st.global.b32 [at], $22;
        mov.b32 $0, 0;
        mov.b32 $1, 0;
        }""",
        constraints="=r,=r,r,r,r,r," + "l," * 8 + "r," * 23 + "r",
        args=[byte, mask.to(tl.uint8), ptrs, tl.full(byte.shape, RUN, tl.int32),
              s.to(tl.uint32, bitcast=True) + tl.zeros(byte.shape, tl.uint32), tl.full(byte.shape, SCALE, tl.int32)],
        dtype=tl.uint8, is_pure=False, pack=8)


@triton.jit
def _store_heads(byte, s, c_ptr, c_slot, c_sh, c_sd, s_ptr, s_slot, s_sh, h64, d64, mask, writes, D,
                 INLINE: tl.constexpr, VEC: tl.constexpr, C_ALIGN: tl.constexpr, WORDS: tl.constexpr):
    """Store a tile's bytes where `mask`, and each head's scale where `writes` ([BT, BH]: the head exists
    and its token's slot is in range)."""
    rows = _rows(c_ptr, c_slot, h64, c_sh, C_ALIGN)  # cache bytes: C_ALIGN-byte aligned rows
    SCALE_IN_WORDS: tl.constexpr = INLINE and WORDS * 8 == byte.shape[2]  # the row is one run (`_store_words`)
    if WORDS:
        _store_words(_tile(rows, d64, c_sd, VEC), byte, mask, s[:, :, None], WORDS, SCALE_IN_WORDS)
    else:
        tl.store(_tile(rows, d64, c_sd, VEC), byte, mask=mask)
    if not INLINE:  # the scale caches' float32 words
        tl.store(s_ptr + s_slot[:, None] + h64[None, :] * s_sh, s, mask=writes)
    elif not SCALE_IN_WORDS:  # the scale's 4 bytes, little-endian, at positions D..D+3 of the head's slot
        at = rows + D * c_sd.to(tl.int64)  # position D of each head's slot
        if C_ALIGN >= 4:  # unit dim stride and D a multiple of C_ALIGN: 4-byte aligned, one fp32 store
            tl.store(tl.multiple_of(at, (4, 4)).to(tl.pointer_type(tl.float32)), s, mask=writes)
        else:
            j = tl.arange(0, 4)
            bits = s.to(tl.uint32, bitcast=True)
            b = ((bits[:, :, None] >> (j * 8).to(tl.uint32)[None, None, :]) & 0xFF).to(tl.uint8)
            tl.store(_tile(at, j.to(tl.int64), c_sd, 1), b, mask=writes[:, :, None] & (j < 4)[None, None, :])


@triton.jit
def slot_parts(loc, t, T, num_slots, page_size):
    """Each token's (slot in range, page, offset in the page) from its int64 cache_loc entry. Padding (negative)
    and out-of-range slots are not in range, and write nothing, whatever cache_loc holds; their page and offset
    are slot 0's."""
    in_range = (t < T) & (loc >= 0) & (loc < num_slots)
    slot = tl.where(in_range, loc, 0)
    page = slot // page_size
    return in_range, page, slot - page * page_size


@triton.jit
def token_slots(loc_ptr, t, loc_stride, T, num_slots, page_size):
    """`slot_parts` of each token's cache_loc entry, loaded here (past T: -1, padding)."""
    loc = tl.load(loc_ptr + t.to(tl.int64) * loc_stride, mask=t < T, other=-1).to(tl.int64)
    return slot_parts(loc, t, T, num_slots, page_size)


@triton.jit(do_not_specialize=INT_ARGS, do_not_specialize_on_alignment=POINTER_ARGS)
def per_token_head_write(
    k_ptr, v_ptr, kc_ptr, vc_ptr, loc_ptr, ks_ptr, vs_ptr,
    T, H, D, page_size, num_slots, loc_stride,
    k_st, k_sh, k_sd, v_st, v_sh, v_sd,
    kc_sp, kc_so, kc_sh, kc_sd, vc_sp, vc_so, vc_sh, vc_sd,
    ks_sp, ks_so, ks_sh, vs_sp, vs_so, vs_sh,
    VLLM: tl.constexpr, INLINE: tl.constexpr, SOFTWARE: tl.constexpr, EXACT_FMA: tl.constexpr,
    FLOOR_V: tl.constexpr, FLOOR_F: tl.constexpr, NAN_BITS: tl.constexpr,
    VEC: tl.constexpr, X_ALIGN: tl.constexpr, C_ALIGN: tl.constexpr, WORDS: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    t64, h64, d64 = t.to(tl.int64), h.to(tl.int64), d.to(tl.int64)  # offsets are 64-bit safe

    d_ok = d < D
    if VEC > 1:
        d_ok = tl.max_constancy(d_ok, VEC)  # D % VEC == 0, so the mask is constant per VEC dims
    inside = (t < T)[:, None, None] & (h < H)[None, :, None] & d_ok[None, None, :]

    # The inputs are read wherever the tile lies inside [T, H, D], padding tokens included, so the reads
    # need not wait for cache_loc: they are issued first, before the slot lookup, whose 64-bit division
    # branches and so would keep the compiler from moving them above it. K's and V's are both issued
    # before any store, since the stores may alias the inputs as far as the compiler knows.
    xk = tl.load(_tile(_rows(k_ptr, t64 * k_st, h64, k_sh, X_ALIGN), d64, k_sd, VEC), mask=inside, other=0.0)
    xv = tl.load(_tile(_rows(v_ptr, t64 * v_st, h64, v_sh, X_ALIGN), d64, v_sd, VEC), mask=inside, other=0.0)
    in_range, page, offset = token_slots(loc_ptr, t, loc_stride, T, num_slots, page_size)
    writes = in_range[:, None] & (h < H)[None, :]
    mask = inside & in_range[:, None, None]
    bk, sk = _quantize_heads(xk, VLLM, SOFTWARE, EXACT_FMA, FLOOR_V, FLOOR_F, NAN_BITS)
    _store_heads(bk, sk, kc_ptr, page * kc_sp + offset * kc_so, kc_sh, kc_sd,
                 ks_ptr, page * ks_sp + offset * ks_so, ks_sh, h64, d64, mask, writes, D, INLINE, VEC, C_ALIGN, WORDS)
    bv, sv = _quantize_heads(xv, VLLM, SOFTWARE, EXACT_FMA, FLOOR_V, FLOOR_F, NAN_BITS)
    _store_heads(bv, sv, vc_ptr, page * vc_sp + offset * vc_so, vc_sh, vc_sd,
                 vs_ptr, page * vs_sp + offset * vs_so, vs_sh, h64, d64, mask, writes, D, INLINE, VEC, C_ALIGN, WORDS)


def _scale_strides(sc: torch.Tensor | None, page_size: int) -> tuple[int, int, int]:
    """(page, offset, head) element strides of a scale cache; a 2-D [S, H] one reuses its slot stride."""
    if sc is None:
        return 0, 0, 0
    if sc.dim() == 2:
        return page_size * sc.stride(0), sc.stride(0), sc.stride(1)
    return sc.stride(0), sc.stride(1), sc.stride(2)


def _alignment(*byte_offsets: int) -> int:
    """The largest power of two up to 16 dividing every offset (0 divides by anything)."""
    return math.gcd(16, *byte_offsets)


def _widths(plan: PTHPlan, kc: torch.Tensor, vc: torch.Tensor, cap: int = 16) -> tuple[int, int]:
    """(input elements, cache bytes) that one thread loads and stores at once ((1, 1): no alignment hint).

    Every dim stride must be 1. Then each input row is 16-, 8-, ... byte aligned as the gcd of the base
    addresses and the token and head strides in bytes says, and each cache row (bytes) likewise; the
    inline layout's head stride D + 4 allows at most 4 bytes. Each width divides D, so that no masked lane
    splits a vector, and is at most `cap` (tools.tile_sweep's narrower choices). Widths below 4 are not used:
    they would gain little and add compiled variants. The two may differ (8 bf16 elements loaded, 16 bytes
    stored): at T = 32768, 8x128, storing 8 bytes instead of 4 took the separate layout from 76.7 % to 84.2 %
    of a copy (docs/results/tile-sweep-per-token-head-h200-2026-12-04-c.csv)."""
    k, v = plan.k, plan.v
    kcs, vcs = Plan.cache_strides(kc, plan.page_size), Plan.cache_strides(vc, plan.page_size)
    if not k.stride(2) == v.stride(2) == kcs[3] == vcs[3] == 1:
        return 1, 1
    size = k.element_size()
    x = _alignment(k.data_ptr(), v.data_ptr(), *(s * size for s in (*k.stride()[:2], *v.stride()[:2])))
    c = _alignment(kc.data_ptr(), vc.data_ptr(), *kcs[:3], *vcs[:3])

    def width(n: int) -> int:
        n = max(1, min(n, cap))
        while plan.head_dim % n:
            n //= 2
        return n if n >= 4 else 1
    return width(x // size), width(c)


def _words(c_align: int, x_vec: int, dim: int, block_d: int, elements: int, warps: int, software: bool) -> int:
    """`_store_words`'s RUN (lanes a run), or 0 for Triton's own stores.

    It can apply where the kernel is compiled (inline PTX), rows are 4-byte aligned but no more (wider rows get
    wider plain stores), each thread loads 8 elements of a row at once (16-byte loads of 16-bit inputs) and the
    tile holds at least 8 a thread, and D is the tile's BLOCK_D, at least 64, so a warp's lanes cover whole
    8-byte groups of D in runs of min(D / 8, 32). It does apply where it measured faster than Triton's
    shared-memory move (inline layout, T = 16384 and 32768, two H100s, docs/results/h100-2026-12-07-f.md): on
    the software encoder, 6 to 11 points of a copy at 8x128 and 4x256; on the hardware encoder at D = 256
    (a row is one warp's run), 0.5 to 1.2 points. On the hardware encoder at 8x128 it was 3 to 4 points
    slower, as were storing each lane's own two words and storing 128 bytes an instruction in lane order
    with addresses shuffled too, so that layout keeps Triton's stores."""
    if interpreted() or c_align != 4 or x_vec != 8 or elements < 8 * 32 * warps or dim != block_d or dim < 64:
        return 0
    run = min(block_d // 8, 32)
    return run if software or dim == 256 else 0


def choose_pth_tile(num_tokens: int, heads: int, dim: int, software: bool) -> tuple[int, int, int, int]:
    """(BLOCK_T, BLOCK_H, BLOCK_D, num_warps). BLOCK_D is D's next power of two: a head's amax needs its
    whole row in one program.

    Compiled, 4 warps, element counts as kernel/fused.py's choose_tile measured them for the per-tensor
    kernel (docs/results/kernel-design-2026-12-02.md): 1024 elements for decode (T <= 64), where smaller,
    sooner-starting programs matter more than work a program; 2048 for prefill on the hardware encoder,
    4096 on the ALU-bound software one. The heads take what the tile holds, the rest is whole tokens;
    a tile spans at least two (token, head) rows, since Triton 3.6 fails to compile [1, 1, N] tiles whose
    row pointers carry an alignment hint. Two token buckets keep the compiled variants few.
    Interpreted: each program costs milliseconds, so tiles are larger, but small enough that CI's cases
    span several programs on the token and head axes (T > 8, H > 4).
    """
    if interpreted():
        return min(_pow2_at_least(num_tokens), 8), min(_pow2_at_least(heads), 4), _pow2_at_least(dim), 1
    return pth_tile_for(heads, dim, 1024 if num_tokens <= 64 else (4096 if software else 2048))


def pth_tile_for(heads: int, dim: int, elements: int, warps: int = 4) -> tuple[int, int, int, int]:
    """(BLOCK_T, BLOCK_H, BLOCK_D, num_warps) of a compiled tile of about `elements` elements."""
    block_d = _pow2_at_least(dim)
    block_h = min(_pow2_at_least(heads), max(1, elements // block_d))
    block_t = max(1, elements // (block_h * block_d))
    if block_t * block_h == 1:
        block_t = 2
    return block_t, block_h, block_d, warps


def launch_per_token_head(plan: PTHPlan, encoder: str | None = None, *, tile: tuple[int, int] | None = None,
                          vec: int | None = None) -> None:
    """Run the kernel for a validated plan (nothing to do for T == 0).
    `tile` (elements, num_warps) and `vec` (a cap on `_widths`) replace the wrapper's choice on CUDA: for
    tuning sweeps (tools.tile_sweep --per-token-head)."""
    if plan.num_tokens == 0:
        return
    if plan.k.device.type == "cuda" and plan.k.device.index != torch.cuda.current_device():
        with torch.cuda.device(plan.k.device):  # Triton launches on the current device (docs/facts.md)
            return launch_per_token_head(plan, encoder, tile=tile, vec=vec)
    if plan.k.device.type != "cuda" and not interpreted():
        raise ValueError(f"fused_fp8_set_kv_buffer: tensors must be on a CUDA device (or run with "
                         f"TRITON_INTERPRET=1), got {plan.k.device}")
    software = resolve_encoder(encoder, plan.k.device) == "software"
    kc = plan.k_cache if plan.k_cache.dtype == torch.uint8 else plan.k_cache.view(torch.uint8)
    vc = plan.v_cache if plan.v_cache.dtype == torch.uint8 else plan.v_cache.view(torch.uint8)
    x_vec, c_align = _widths(plan, kc, vc, 16 if vec is None else vec)
    heads, dim = plan.num_heads, plan.head_dim
    block_t, block_h, block_d, warps = (pth_tile_for(heads, dim, *tile) if tile else
                                        choose_pth_tile(plan.num_tokens, heads, dim, software))
    if max(x_vec, c_align) == 1 and not tile and not interpreted():
        # Unvectorized, larger tiles spill: 1024 elements ran at 28.6 % of a copy, 2048 at 8.1 %, 4096 at 3.9 %
        # (T = 32768, 8x128, docs/results/h200-2026-12-04-c.md).
        block_t, block_h, block_d, warps = pth_tile_for(heads, dim, 1024)
    grid = (triton.cdiv(plan.num_tokens, block_t), triton.cdiv(heads, block_h))
    # Inline: the scale pointers are unused; the cache_loc tensor stands in (no tensor is made).
    ks = plan.k_scale_cache if plan.k_scale_cache is not None else plan.cache_loc
    vs = plan.v_scale_cache if plan.v_scale_cache is not None else plan.cache_loc
    per_token_head_write[grid](
        plan.k, plan.v, kc, vc, plan.cache_loc, ks, vs,
        plan.num_tokens, plan.num_heads, plan.head_dim, plan.page_size, plan.num_slots, plan.cache_loc.stride(0),
        *plan.k.stride(), *plan.v.stride(),
        *Plan.cache_strides(plan.k_cache, plan.page_size), *Plan.cache_strides(plan.v_cache, plan.page_size),
        *_scale_strides(plan.k_scale_cache, plan.page_size), *_scale_strides(plan.v_scale_cache, plan.page_size),
        VLLM=plan.recipe.rule == "vllm", INLINE=plan.inline, SOFTWARE=software, EXACT_FMA=fma_is_exact(),
        FLOOR_V=fp32_bits(FLOOR_VLLM), FLOOR_F=fp32_bits(FLOOR_FLASHINFER), NAN_BITS=NAN_SCALE_BITS,
        VEC=max(x_vec, c_align), X_ALIGN=x_vec * plan.k.element_size() if x_vec > 1 else 1, C_ALIGN=c_align,
        WORDS=_words(c_align, x_vec, dim, block_d, block_t * block_h * block_d, warps, software),
        BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_D=block_d,
        num_warps=warps,
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
