"""The mutant catalogue: realistic bugs of a fused paged-KV FP8 write, as exact source edits.

Each mutant is one or more `Edit`s (file, anchor text that must occur exactly once, replacement).
`tools.mutants` applies them to a temporary copy of the repository, never to the live tree, and
runs the suite against the copy; a mutant the suite does not kill is a gap in the strategies or
the properties. `tier` says where it can be killed:
- "cpu": by the CPU suite under Triton's interpreter (software encoder);
- "gpu": only on a CUDA machine (the hardware encoder, Triton's non-IEEE `/`, caches above 2**31
  bytes in conformance/test_bigcache.py, CUDA-graph capture in conformance/test_graphs.py);
- `runner="memcheck"`: only compute-sanitizer sees it (the bytes are right, the reads are not).

When the lead edits kernel/, an anchor may stop matching: the harness reports such a mutant as
"stale" and meta_tests/test_mutant_catalogue.py fails, so the catalogue is updated with the code.

The last kill result of each mutant is kept in docs/results/mutants.json (`--record` merges a run's
$OUT/mutants.json into it); `python -m tools.mutant_catalogue --markdown` prints the catalogue with
those results as docs/mutants.md's kill table.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Tier = Literal["cpu", "gpu"]
Runner = Literal["pytest", "memcheck"]

TK = "kernel/triton_kernel.py"
FU = "kernel/fused.py"
PL = "kernel/plan.py"


@dataclass(frozen=True)
class Edit:
    path: str
    anchor: str
    replacement: str


@dataclass(frozen=True)
class Mutant:
    name: str
    description: str
    edits: tuple[Edit, ...]
    tier: Tier = "cpu"
    runner: Runner = "pytest"
    kill_hint: str = ""  # the input that kills it: for the report when it survives


def _m(name: str, description: str, *edits: tuple[str, str, str], tier: Tier = "cpu",
       runner: Runner = "pytest", hint: str = "") -> Mutant:
    return Mutant(name, description, tuple(Edit(*e) for e in edits), tier, runner, hint)


MUTANTS: tuple[Mutant, ...] = (
    # -- masks and grid edges ------------------------------------------------------------------
    _m("mask-head-off-by-one", "head mask h <= H: the first head past H is written",
       (TK, "& (h < H)[None, :, None] &", "& (h <= H)[None, :, None] &"),
       hint="H not a power of two (H=3: BLOCK_H=4), any written token"),
    _m("mask-dim-off-by-one", "dim mask d <= D: one dim past the head is written",
       (TK, "d_ok = d < D\n", "d_ok = d <= D\n"),
       hint="D not a power of two below 128 (D=80, D=5)"),
    _m("grid-floor-tokens", "token grid uses floor division: the last partial token block is dropped",
       (FU, "grid = (triton.cdiv(plan.num_tokens, block_t),", "grid = (plan.num_tokens // block_t,"),
       hint="T not a multiple of BLOCK_T (interpreter: T=3, or T=9 with BLOCK_T=8)"),
    _m("grid-floor-heads", "head grid uses floor division: the last partial head block is dropped",
       (FU, "triton.cdiv(g.heads, block_h),", "g.heads // block_h,"),
       hint="H=5 (BLOCK_H=4): head 4 never written; H=3: nothing written"),
    _m("grid-floor-dims", "dim grid uses floor division: the last partial dim block is dropped",
       (FU, "triton.cdiv(g.dim, block_d))", "g.dim // block_d)"),
       hint="D=192 (dims 128..191 dropped) or D=80 (nothing written)"),
    _m("fold-checks-inputs-only", "[H, D] folded into one axis when K and V allow it, whatever the caches do",
       (FU, "((k[1], k[2]), (v[1], v[2]), (kc[2], kc[3]), (vc[2], vc[3]))", "((k[1], k[2]), (v[1], v[2]))"),
       hint="contiguous K and V with a cache whose heads are not back to back (padded or permuted heads)"),
    _m("padding-written", "loc < 0 not masked: padding tokens write before the cache",
       (TK, "writes = (t < T) & (loc >= 0) & (loc < num_slots)", "writes = (t < T) & (loc < num_slots)"),
       hint="a cache_loc entry of -1 (padding) with a small slot (H*D <= 256 bytes lands in the guard band)"),
    _m("out-of-range-written", "loc < num_slots not masked: slots past the cache are written",
       (TK, "writes = (t < T) & (loc >= 0) & (loc < num_slots)", "writes = (t < T) & (loc >= 0)"),
       hint="checked=False and a cache_loc entry == num_slots (lands in the guard band after the cache)"),
    # -- paged addressing ----------------------------------------------------------------------
    _m("page-offset-swapped", "K's slot address uses page and offset swapped",
       (TK, "k_slot_rows = page * kc_sp + offset * kc_so", "k_slot_rows = offset * kc_sp + page * kc_so"),
       hint="page_size > 1 and a slot whose page != offset (e.g. slot 1 with page_size 3)"),
    _m("page-size-hardcoded", "page index uses the default page size 16, not page_size",
       (TK, "page = loc // page_size\n", "page = loc // 16\n"),
       hint="page_size != 16 and a slot >= min(page_size, 16)"),
    _m("flat-cache-page-stride", "3-D cache: page stride taken as the slot stride",
       (PL, "return page_size * s_slot, s_slot, s_head, s_dim", "return s_slot, s_slot, s_head, s_dim"),
       hint="a 3-D [S, H, D] cache, page_size > 1, a slot >= page_size"),
    _m("v-cache-uses-k-slot-strides", "V's slot address uses K's cache page/offset strides",
       (TK, "v_slot_rows = page * vc_sp + offset * vc_so", "v_slot_rows = page * kc_sp + offset * kc_so"),
       hint="k_cache and v_cache with different layouts (e.g. V padded per page or interleaved K/V pages)"),
    _m("v-cache-uses-k-head-strides", "V's cache head/dim strides are K's",
       (TK, "_pointers(vc_ptr, v_slot_rows, h64, d64, vc_sh, vc_sd, VEC)",
        "_pointers(vc_ptr, v_slot_rows, h64, d64, kc_sh, kc_sd, VEC)"),
       hint="k_cache and v_cache whose head or dim strides differ (permuted or padded heads in one of them)"),
    _m("v-input-uses-k-strides", "V's input is read with K's strides",
       (TK, "_pointers(v_ptr, t64 * v_st, h64, d64, v_sh, v_sd, VEC)",
        "_pointers(v_ptr, t64 * k_st, h64, d64, k_sh, k_sd, VEC)"),
       hint="k and v with different layouts (e.g. v a slice of a fused QKV buffer, k contiguous)"),
    _m("input-assumed-contiguous", "K's input strides assumed contiguous [T, H, D]",
       (TK, "_pointers(k_ptr, t64 * k_st, h64, d64, k_sh, k_sd, VEC)",
        "_pointers(k_ptr, t64 * (H * D), h64, d64, D, 1, VEC)"),
       hint="a non-contiguous k: padded token rows, permuted heads or a dim step > 1"),
    _m("cache-assumed-contiguous", "K's cache strides assumed contiguous [P, page_size, H, D]",
       (TK, "k_slot_rows = page * kc_sp + offset * kc_so", "k_slot_rows = loc * (H * D)"),
       (TK, "_pointers(kc_ptr, k_slot_rows, h64, d64, kc_sh, kc_sd, VEC)",
        "_pointers(kc_ptr, k_slot_rows, h64, d64, D, 1, VEC)"),
       hint="a non-contiguous k_cache (padded pages, permuted head/offset, K/V interleaved pages)"),
    _m("vec-ignores-dim-stride", "vectorized path taken with a non-unit dim stride",
       (FU, "return (g.dim % 16 == 0 and g.k[2] == g.v[2] == g.k_cache[3] == g.v_cache[3] == 1\n            and",
        "return (g.dim % 16 == 0\n            and"),
       hint="D % 16 == 0, row strides multiples of 16, and a dim stride of 2 (layout step=2) in any tensor"),
    _m("loc-read-as-int32", "cache_loc read through an int32 view (int64 entries read as two halves)",
       (FU, "v_bytes, plan.cache_loc, ks_ptr", "v_bytes, plan.cache_loc.view(torch.int32), ks_ptr"),
       hint="an int64 cache_loc with T >= 2"),
    _m("loc-assumed-contiguous", "cache_loc's stride ignored",
       (FU, "plan.cache_loc.stride(0),\n", "1,\n"),
       hint="a strided cache_loc view (loc_step > 1) with T >= 2"),
    _m("offsets-int32", "64-bit casts dropped: offsets computed in 32 bits",
       (TK, "t64, h64, d64 = t.to(tl.int64), h.to(tl.int64), d.to(tl.int64)", "t64, h64, d64 = t, h, d"),
       (TK, "mask=t < T, other=-1).to(tl.int64)", "mask=t < T, other=-1).to(tl.int32)"),
       tier="gpu", hint="a cache above 2**31 bytes written at its last pages (conformance/test_bigcache.py)"),
    _m("t0-max", "the wrapper skips all-padding batches with cache_loc.max(): raises for T=0",
       (FU, "    if plan.num_tokens == 0:\n", "    if int(plan.cache_loc.max()) < 0:\n"),
       hint="T=0 (must be a no-op)"),
    # -- scale ---------------------------------------------------------------------------------
    _m("reciprocal-as-division", "mul_reciprocal recipes compute x / s",
       (TK, "y = x32 * tl.math.div_rn(1.0, s)", "y = _divide(x32, s, EXACT_FMA, PER_HEAD)"),
       hint="recipe unfused/single with a scale that is not a power of two (0.3)"),
    _m("division-as-reciprocal", "divide recipes compute x * (1/s)",
       (TK, "        y = _divide(x32, s, EXACT_FMA, PER_HEAD)\n", "        y = x32 * tl.math.div_rn(1.0, s)\n"),
       hint="recipe divide/unfused-tensor1 with a scale that is not a power of two (0.3)"),
    _m("division-uncorrected", "x / s as x * RN(1/s) scaled, without Markstein's correction step",
       (TK, "return tl.where(tl.abs(residual) < float(\"inf\"), tl.fma(residual * -1.0, r, q0), q0)", "return q0"),
       hint="recipe divide, scale 0.3: some quotients are off by an ulp, a few of those change the byte"),
    _m("division-residual-test-dropped", "the corrected quotient is used even where the residual is not finite",
       (TK, "return tl.where(tl.abs(residual) < float(\"inf\"), tl.fma(residual * -1.0, r, q0), q0)",
        "return tl.fma(residual * -1.0, r, q0)"),
       hint="recipe divide with an ±inf input: inf * s - inf is NaN, so the byte becomes 0x7F, not 0x7E"),
    _m("division-negation-as-subtraction", "the division's negations written `-v`, which Triton compiles as `0 - v`",
       (TK, "residual = tl.fma(q0, s, x32 * -1.0)", "residual = tl.fma(q0, s, -x32)"),
       (TK, "tl.fma(residual * -1.0, r, q0), q0)", "tl.fma(-residual, r, q0), q0)"),
       tier="gpu", hint="recipe divide with a -0.0 input on CUDA: 0 - (-0) is +0, so the byte is 0x00, not 0x80 "
                        "(the interpreter's negation keeps -0)"),
    _m("division-range-unscaled", "scales outside [2**-64, 2**126] go through Markstein's division unscaled",
       (TK, "q = _markstein(x32 * k, s * k)", "q = _markstein(x32, s)"),
       hint="a divide recipe with a subnormal scale (1e-40): RN(1/s) overflows to inf"),
    _m("scale-k-only", "V is written unscaled (the scale is applied to K only)",
       (TK, "bv = _quantize(xv, vs,", "bv = _quantize(xv, vs * 0.0 + 1.0,"),
       hint="a v_scale != 1"),
    _m("v-uses-k-scale", "V is scaled with k_scale",
       (TK, "bv = _quantize(xv, vs,", "bv = _quantize(xv, ks,"),
       hint="k_scale != v_scale"),
    _m("per-head-first-only", "a per-head scale tensor is read at its first element for every head",
       (TK, "s = tl.load(ptr + h64 * stride, mask=h_ok, other=1.0)",
        "s = tl.load(ptr + h64 * 0, mask=h_ok, other=1.0)"),
       hint="a [H] k_scale or v_scale whose heads differ (conformance/test_per_head.py)"),
    _m("per-head-unit-stride", "a per-head scale tensor is read as if contiguous",
       (FU, "return scale.tensor.data_ptr(), 0.0, 1, scale.tensor.stride(0)",
        "return scale.tensor.data_ptr(), 0.0, 1, 1"),
       hint="a [H] scale that is a strided view (every second element of a buffer)"),
    _m("per-head-folded", "heads are folded into one row with a per-head scale: the tile's head is not the head",
       (FU, "    if not per_head and all(s_h", "    if all(s_h"),
       hint="a [H] scale on a contiguous layout"),
    _m("scale-applied-twice", "the reciprocal is applied twice",
       (TK, "y = x32 * tl.math.div_rn(1.0, s)", "y = x32 * tl.math.div_rn(1.0, s) * tl.math.div_rn(1.0, s)"),
       hint="a mul_reciprocal recipe with scale != 1"),
    _m("tensor0d-scale-not-rounded", "unfused-tensor0d: the scale is not rounded to the input dtype",
       (TK, "        s = _round_input(s, IN_DTYPE, SOFTWARE)\n", "        s = s\n"),
       hint="recipe unfused-tensor0d, bf16/fp16 input, scale 0.3 (not representable in bf16)"),
    _m("scale-rounding-wrong-recipe", "the scale is rounded for every divide recipe, not only tensor0d",
       (FU, 'SCALE_IN_INPUT=r.scale_dtype == "input"', 'SCALE_IN_INPUT=r.scale_op == "divide"'),
       hint="recipe unfused-tensor1 or divide, bf16/fp16 input, scale 0.3"),
    _m("float-scale-as-tensor", "a Python float scale is turned into a device tensor each call",
       (FU, "    return dummy, scale.value, 0, 0\n",
        "    held = globals().setdefault('_held', [])\n"
        "    held.append(torch.tensor([scale.value], dtype=torch.float32, device='cuda'))\n"
        "    return held[-1].data_ptr(), 0.0, 1, 0\n"),
       tier="gpu", hint="a float scale under CUDA-graph capture (conformance/test_graphs.py)"),
    # -- rounding ------------------------------------------------------------------------------
    _m("single-rounding", "the intermediate rounding to the input dtype is skipped",
       (FU, 'INTERMEDIATE=r.intermediate == "input"', "INTERMEDIATE=False"),
       hint="recipe unfused, bf16 input, scale 0.3 (about 2% of bytes differ)"),
    _m("double-rounding-always", "every recipe rounds to the input dtype first",
       (FU, 'INTERMEDIATE=r.intermediate == "input"', "INTERMEDIATE=True"),
       hint="recipe single or divide, bf16 input, scale 0.3"),
    _m("fp16-rounded-as-bf16", "the intermediate rounding uses bf16 for fp16 inputs",
       (TK, "    if IN_DTYPE == tl.bfloat16:\n", "    if IN_DTYPE != tl.float32:\n"),
       hint="recipe unfused, fp16 input, scale 0.3"),
    _m("bf16-truncation", "bf16 intermediate rounding truncates",
       (TK, "mag_f = (mag_f + c16) - c16", "mag_f = (a & 0xFFFF0000).to(tl.float32, bitcast=True)"),
       hint="recipe unfused, bf16 input, scale 0.3"),
    _m("bf16-ties-away", "bf16 intermediate rounding breaks ties away from zero",
       (TK, "mag_f = (mag_f + c16) - c16", "mag_f = ((a + 0x8000) & 0xFFFF0000).to(tl.float32, bitcast=True)"),
       hint="recipe unfused, bf16 input, a scale with a short reciprocal: fp32(2/3) = 0.6666667 and x = bf16 "
            "0x3C0B (62 of 65,536 bf16 values tie there; none at scale 0.3, 0.75 or 3)"),
    _m("e4m3-ties-away", "the software e4m3 encoder rounds ties away from zero",
       (TK, "total = (mag_f + c.to(",
        "total = ((mag_f.to(tl.uint32, bitcast=True) + 1).to(tl.float32, bitcast=True) + c.to("),
       hint="a value exactly halfway between two e4m3 values (bf16 0x3FC8 = 1.5625 at scale 1)"),
    _m("e4m3-subnormal-binade", "subnormals rounded as if e4m3's smallest binade were 2**-7, not 2**-6",
       (TK, "binade = tl.maximum(exponent, 0x3C800000)", "binade = tl.maximum(exponent, 0x3C000000)"),
       hint="a scaled value below 2**-6 (an e4m3 subnormal)"),
    _m("negative-zero-flushed", "negative results that round to zero become +0 (0x00, not 0x80)",
       (TK, "return tl.where(is_nan, 0x7F, mag | ((b >> 24) & 0x80)).to(tl.uint8)",
        "return tl.where(is_nan, 0x7F, tl.where(mag == 0, 0, mag | ((b >> 24) & 0x80))).to(tl.uint8)"),
       hint="-0.0, or a negative value below 2**-10 after scaling"),
    # -- rounding the scale to the input dtype (unfused-tensor0d): wrong only at exact ties -------
    # The scale's own rounding is separate code from the quotient's: `_round_bf16_sw` is reached only
    # from `_load_scale` (the software encoder rounds the bf16 quotient inside `_e4m3_sw`), so these
    # are invisible to the input-dtype ties of conformance/test_ties.py. Each rounds every non-tie
    # scale correctly; only a scale whose fp32 value lies exactly halfway between two bf16 (fp16)
    # values tells them apart (strategies.scales value class "input-tie").
    _m("scale-bf16-ties-away", "the software bf16 rounding of the scale breaks ties away from zero",
       (TK, "r = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000", "r = (b + 0x8000) & 0xFFFF0000"),
       hint="recipe unfused-tensor0d, bf16 input, a scale halfway between two bf16 values whose lower one is "
            "even: fp32 0x3F808000 (1.00390625): RNE gives 1.0, the mutant 1.0078125"),
    _m("scale-bf16-ties-to-zero", "the software bf16 rounding of the scale drops the kept-LSB term: ties go "
       "toward zero", (TK, "r = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000", "r = (b + 0x7FFF) & 0xFFFF0000"),
       hint="recipe unfused-tensor0d, bf16 input, a scale halfway between two bf16 values whose lower one is "
            "odd: fp32 0x3F818000 (1.01171875): RNE gives 1.015625, the mutant 1.0078125"),
    _m("scale-fp16-ties-away", "the scale is rounded to fp16 by a hand-written fp32 -> fp16 conversion "
       "(ISPC / float_to_half_fast3 style: exact below and above fp16's normal range, ties away within it)",
       (TK, "        s = _round_input(s, IN_DTYPE, SOFTWARE)\n",
        "        if IN_DTYPE == tl.float16:\n"
        "            sb = s.to(tl.uint32, bitcast=True)\n"
        "            half_up = ((sb + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)\n"
        "            s = tl.where((s >= 2.0**-14) & (s < 65520.0), half_up, _round_input(s, IN_DTYPE, SOFTWARE))\n"
        "        else:\n"
        "            s = _round_input(s, IN_DTYPE, SOFTWARE)\n"),
       hint="recipe unfused-tensor0d, fp16 input, a scale halfway between two fp16 values whose lower one is "
            "even: fp32 0x3F801000 (1.00048828125): RNE gives 1.0, the mutant 1.0009765625"),
    # -- overflow and NaN ----------------------------------------------------------------------
    _m("saturate-always", "the software encoder always saturates (unfused-nan gives 448, not NaN)",
       (TK, "a = tl.minimum(a, 0x43E00000 if SATURATE else 0x43F00000)", "a = tl.minimum(a, 0x43E00000)"),
       hint="recipe unfused-nan with a scaled value above 464"),
    _m("saturate-inverted", "the saturate flag is read inverted",
       (TK, "a = tl.minimum(a, 0x43E00000 if SATURATE else 0x43F00000)",
        "a = tl.minimum(a, 0x43F00000 if SATURATE else 0x43E00000)"),
       hint="any scaled value above 464"),
    _m("nan-sign-kept", "NaN keeps its sign (-NaN becomes 0xFF, not 0x7F)",
       (TK, "return tl.where(is_nan, 0x7F, mag | ((b >> 24) & 0x80)).to(tl.uint8)",
        "return tl.where(is_nan, 0x7F | ((b >> 24) & 0x80), mag | ((b >> 24) & 0x80)).to(tl.uint8)"),
       hint="a negative NaN input (bf16 0xFFC0)"),
    _m("inf-is-nan", "the software encoder treats ±inf as NaN",
       (TK, "is_nan = a > 0x7F800000", "is_nan = a >= 0x7F800000"),
       hint="an infinite input, or an input that overflows the input dtype after scaling (unfused)"),
    _m("hw-nan-threshold-448", "hardware encoder: NaN-overflow fix-up from 448 instead of 464",
       (TK, "byte = byte | (tl.abs(y) > 464.0).to(tl.uint8)", "byte = byte | (tl.abs(y) > 448.0).to(tl.uint8)"),
       tier="gpu", hint="recipe unfused-nan, hardware encoder, a scaled value in (448, 464]"),
    _m("hw-nan-fixup-dropped", "hardware encoder: the NaN-overflow fix-up is missing",
       (TK, "        byte = byte | (tl.abs(y) > 464.0).to(tl.uint8)\n", "        byte = byte\n"),
       tier="gpu", hint="recipe unfused-nan, hardware encoder, a scaled value above 464"),
    # -- stores and loads ----------------------------------------------------------------------
    _m("store-value-conversion", "an fp8 cache is passed as fp8: the store value-converts the byte",
       (FU, "k_bytes = plan.k_cache if plan.k_cache.dtype == torch.uint8 else plan.k_cache.view(torch.uint8)",
        "k_bytes = plan.k_cache"),
       hint="a float8_e4m3fn k_cache (any write)"),
    # -- memory overlap (kernel/plan.py `_check_disjoint`, kernel/overlap.py) -------------------------
    # Block added with strategies/overlap.py: killed by conformance/test_errors.py's overlap classes
    # (a cache sharing a byte with the other cache, k/v, cache_loc or a scale tensor must raise) and, for
    # the checks that reject too much, by conformance/test_overlap.py (disjoint pools must be accepted).
    # meta_tests/test_memory_overlap.py (brute-force byte sets) kills the kernel/overlap.py ones too, but it is
    # not among the mutant harness's modules.
    _m("overlap-caches-only", "the overlap check compares the two caches only, not what the call reads",
       (PL, "views = _judged(zip(names, others))", "views = []"),
       hint="a cache sharing a byte with k, v, cache_loc or a scale tensor (test_errors cache-overlaps-*)"),
    _m("overlap-skips-scales", "scale tensors are left out of the overlap check",
       (PL, "_check_disjoint(k_cache, v_cache, k, v, cache_loc, ks.tensor, vs.tensor)",
        "_check_disjoint(k_cache, v_cache, k, v, cache_loc)"),
       hint="a tensor scale whose 4 bytes lie inside a cache (test_errors cache-overlaps-scale)"),
    _m("overlap-skips-cache-loc", "cache_loc is left out of the overlap check",
       (PL, "_check_disjoint(k_cache, v_cache, k, v, cache_loc, ks.tensor, vs.tensor)",
        "_check_disjoint(k_cache, v_cache, k, v, None, ks.tensor, vs.tensor)"),
       hint="cache_loc whose bytes lie inside a cache (test_errors cache-overlaps-cache-loc)"),
    _m("overlap-v-cache-reads-unchecked", "v_cache is checked against k_cache only, not against the reads",
       (PL, "for name, layout, addr in caches[:i] + views:",
        "for name, layout, addr in caches[:i] + (views if i == 0 else []):"),
       hint="v_cache sharing a byte with k, v, cache_loc or a scale tensor"),
    _m("overlap-extents-only", "overlap decided by byte extents alone: disjoint interleaved halves are rejected",
       ("kernel/overlap.py", "return _solvable(base_b - base_a, a.terms, a.element_size, b.terms, b.element_size)",
        "return True"),
       hint="K and V as the halves of one [P, 2, ps, H, D] pool, or interleaved per slot, head or byte "
            "(test_overlap: a valid call that must be accepted)"),
    _m("overlap-last-index-excluded", "the exact search stops one short of the cache's last index in each dim",
       ("kernel/overlap.py", "[(s, 0, n - 1) for s, n in a_terms]", "[(s, 0, n - 2) for s, n in a_terms]"),
       hint="the cache's last byte is the first byte of the other cache or of an input (placement "
            "cache-last-is-first), with extents meeting only there"),
    _m("overlap-element-bytes-ignored", "the exact search compares element starts, not bytes",
       ("kernel/overlap.py", "w_lo, w_hi = 1 - b_size, a_size - 1", "w_lo, w_hi = 0, 0"),
       hint="a cache whose first byte is the top byte of a 2-, 4- or 8-byte element of k, v, cache_loc or a "
            "scale (placement cache-first-is-last)"),
    _m("overlap-element-window-widened", "the byte window of an element is one byte too wide on each side",
       ("kernel/overlap.py", "w_lo, w_hi = 1 - b_size, a_size - 1", "w_lo, w_hi = -b_size, a_size"),
       hint="K and V interleaved so that a K byte sits next to a V byte without sharing it (a [P, ps, H, D, 2] "
            "per-byte pool, or any interleaved pool: test_overlap)"),
    # -- the eager fast path (kernel/dispatch.py): only compiled launches take it ------------------
    _m("fast-path-ignores-alignment", "the fast path reuses the first call's VEC variant whatever the pointers",
       ("kernel/dispatch.py", "vec = e.vec_layout and not ((a_k | a_v | kc | vc) & 15)", "vec = e.vec_layout"),
       tier="gpu", hint="a second call of a layout whose k starts off 16-byte alignment (test_repeat moves it)"),
    _m("fast-path-skips-overlap", "the fast path launches without the overlap check",
       ("kernel/dispatch.py", "    if not reads_disjoint(kc, vc, e, read):\n", "    if False:\n"),
       tier="gpu", hint="an overlapping call of a layout seen valid before (aliased caches)"),
    _m("vec-ignores-alignment", "vectorized path taken without checking that the base pointers are 16-byte aligned",
       (FU, " and all(t.data_ptr() % 16 == 0 for t in (plan.k, plan.v, plan.k_cache, plan.v_cache))", ""),
       tier="gpu", hint="a view starting at an odd element offset with D % 16 == 0 and 16-multiple strides "
                        "(CUDA: misaligned 16-byte access)"),
    _m("unmasked-load", "input loads are not masked (the bytes stay right: only memcheck sees it)",
       (TK, "k_sh, k_sd, VEC), mask=inside, other=0.0)", "k_sh, k_sd, VEC))"),
       tier="gpu", runner="memcheck",
       hint="compute-sanitizer memcheck on any case whose tile reaches past the input (T < BLOCK_T)"),
    # -- per-(token, head) scales (kernel/per_token_head_kernel.py, issue 26) ----------------------
    _m("pth-unwidened-page-stride", "inline layout: cache strides computed for head_dim D, not the widened D + 4 "
       "(kvcached#424: every page after the first garbled)",
       ("kernel/per_token_head_kernel.py",
        "*Plan.cache_strides(plan.k_cache, plan.page_size), *Plan.cache_strides(plan.v_cache, plan.page_size),",
        "*[s * plan.head_dim // plan.k_cache.shape[-1] if i == 0 else s\n"
        "          for i, s in enumerate(Plan.cache_strides(plan.k_cache, plan.page_size))],\n"
        "        *[s * plan.head_dim // plan.v_cache.shape[-1] if i == 0 else s\n"
        "          for i, s in enumerate(Plan.cache_strides(plan.v_cache, plan.page_size))],"),
       hint="inline layout, a 4-D cache, a token written to a page other than the first"),
    _m("pth-amax-over-heads", "amax reduced over the program's heads too: one scale a token, not a head",
       ("kernel/per_token_head_kernel.py",
        "amax_bits = tl.max(x32.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2)",
        "amax_bits = tl.max(x32.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2)\n"
        "    amax_bits = tl.zeros_like(amax_bits) + tl.max(amax_bits, axis=1)[:, None]"),
       hint="H >= 2 heads of one token with different amax"),
    _m("pth-scale-not-stored", "the per-head scale is never stored (inline bytes and scale caches keep old values)",
       ("kernel/per_token_head_kernel.py",
        "tl.store(tl.multiple_of(at, (4, 4)).to(tl.pointer_type(tl.float32)), s, mask=writes)", "pass"),
       ("kernel/per_token_head_kernel.py",
        "tl.store(_tile(at, j.to(tl.int64), c_sd, 1), b, mask=writes[:, :, None] & (j < 4)[None, None, :])", "pass"),
       ("kernel/per_token_head_kernel.py", "tl.store(s_ptr + s_slot[:, None] + h64[None, :] * s_sh, s, mask=writes)",
        "pass"),
       ("kernel/per_token_head_kernel.py", "@keep st.global.b32 [at], $22;", ""),  # compiled, `_store_words`
       hint="any written token, either layout"),
    _m("pth-inline-scale-in-data", "inline layout: the scale's 4 bytes land on the head's last 4 data bytes",
       ("kernel/per_token_head_kernel.py", "at = rows + D * c_sd.to(tl.int64)",
        "at = rows + (D - 4) * c_sd.to(tl.int64)"),
       ("kernel/per_token_head_kernel.py", "@keep st.global.b32 [at], $22;",
        "sub.u64 at, at, 4;\n        @keep st.global.b32 [at], $22;"),  # compiled, `_store_words`
       hint="inline layout, any written token"),
    _m("pth-scale-cache-head-stride-ignored", "separate layout: the scale cache's head stride taken as 1",
       ("kernel/per_token_head_kernel.py", "tl.store(s_ptr + s_slot[:, None] + h64[None, :] * s_sh, s, mask=writes)",
        "tl.store(s_ptr + s_slot[:, None] + h64[None, :], s, mask=writes)"),
       hint="separate layout, H >= 2, a scale cache that is head-major, padded or every other element"),
    _m("pth-words-halves-swapped", "compiled inline store (`_store_words`): in the first of its two stores each lane "
       "writes the other word of the 8 bytes it takes from its run, so the words trade places in pairs",
       ("kernel/per_token_head_kernel.py", "selp.b32 wa, a1, a0, odd;", "selp.b32 wa, a0, a1, odd;"),
       tier="gpu", hint="inline layout on CUDA, bf16/fp16 inputs, any written token: the software encoder at D of "
       "64, 128 or 256, the hardware one at D = 256"),
    _m("pth-zero-head-no-floor", "no floor on the scale: s = amax / 448, so an all-zero head is 0 * (1/0) or 0/0 = NaN",
       ("kernel/per_token_head_kernel.py", "s = tl.where(s < _f32(FLOOR_V), _f32(FLOOR_V), s)", "s = s + 0.0"),
       ("kernel/per_token_head_kernel.py", "tl.where(amax < _f32(FLOOR_F), _f32(FLOOR_F), amax)", "amax"),
       hint="an all-zero head (strategies.per_token_head HEAD_KINDS 'zero'), or a subnormal amax"),
    # -- e5m2 caches (issue 26: conformance/test_e5m2.py) ---------------------------------------------
    _m("e5m2-rounding-e4m3-constants", "the software encoder's e5m2 branch keeps e4m3's smallest binade "
       "(2**-6, not 2**-14): e5m2 values below 2**-6 are rounded on a coarser grid",
       (TK, "binade = tl.maximum(exponent, 0x38800000)", "binade = tl.maximum(exponent, 0x3C800000)"),
       hint="an e5m2 cache and a scaled value below 2**-6 (e5m2's normals reach down to 2**-14)"),
    _m("e5m2-written-as-e4m3", "an e5m2 cache is written with e4m3 bits (vLLM's Triton path: vllm#54341)",
       (FU, 'E5M2=plan.cache_format == "fp8_e5m2",', "E5M2=False,"),
       hint="any nonzero value into a float8_e5m2 cache, or a uint8 cache with cache_dtype='fp8_e5m2'"),
    # -- e4m3fnuz caches (issue 26: conformance/test_fnuz.py) ------------------------------------------
    _m("fnuz-written-as-e4m3fn", "an e4m3fnuz cache is written with e4m3fn bits (bias 7, NaN 0x7F, ±448: "
       "vllm#45720's class)",
       (FU, "FNUZ=fnuz,", "FNUZ=False,"),
       hint="any normal value into a float8_e4m3fnuz cache, or a uint8 cache with cache_dtype='fp8_e4m3fnuz'"),
    _m("fnuz-negative-zero-kept", "the fnuz encoder keeps zero's sign: -0 (and negatives rounding to zero) "
       "become 0x80, which e4m3fnuz reads as NaN",
       (TK, "tl.where(is_nan, 0x80, tl.where(mag == 0, 0, mag | ((b >> 24) & 0x80)))",
        "tl.where(is_nan, 0x80, mag | ((b >> 24) & 0x80))"),
       hint="-0.0, or a negative value below 2**-11 after scaling, into an e4m3fnuz cache"),
)


def by_name() -> dict[str, Mutant]:
    return {m.name: m for m in MUTANTS}


# -- classes, kill records and the kill table ---------------------------------------------------------
KILLS = Path(__file__).resolve().parent.parent / "docs" / "results" / "mutants.json"


def classes() -> dict[str, str]:
    """Mutant name -> its class: the `# -- CLASS ---` heading it sits under in this file (the heading's
    words up to a parenthesis or a colon)."""
    found, current = {}, ""
    for line in Path(__file__).read_text().splitlines():
        heading = re.match(r"\s*# -- (.+?) -{3,}$", line)
        if heading:
            current = re.split(r" \(|:", heading.group(1))[0].strip()
        named = re.match(r'\s*_m\("([\w-]+)"', line)
        if named:
            found[named.group(1)] = current
    return found


def load_kills(path: Path = KILLS) -> dict[str, Any]:
    """{"runs": {label: {date, machine, command}}, "kills": {mutant: {run, result, killed_by, seconds}}}."""
    return json.loads(path.read_text()) if path.exists() else {"runs": {}, "kills": {}}


def dump_kills(record: dict[str, Any]) -> str:
    """The record as JSON with one line per run and per mutant (short diffs when a run is merged)."""
    def block(items: dict[str, Any]) -> str:
        return ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in items.items())
    return f'{{\n "runs": {{\n{block(record["runs"])}\n }},\n "kills": {{\n{block(record["kills"])}\n }}\n}}\n'


def merge_kills(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new`'s results replace `old`'s for the mutants it ran; runs no kill points to any more go."""
    kills = {**old["kills"], **new["kills"]}
    order = [m.name for m in MUTANTS] + sorted(set(kills) - {m.name for m in MUTANTS})
    kills = {n: kills[n] for n in order if n in kills}
    runs = {**old["runs"], **new["runs"]}
    return {"runs": {k: v for k, v in runs.items() if any(e["run"] == k for e in kills.values())}, "kills": kills}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(record: dict[str, Any]) -> str:
    """The catalogue as a table: name, class, what it changes, tier, and the last recorded result."""
    cls, kills = classes(), record["kills"]
    killed = sum(kills.get(m.name, {}).get("result") == "killed" for m in MUTANTS)
    lines = [f"{len(MUTANTS)} mutants, {killed} killed at their last recorded run "
             f"({len(MUTANTS) - sum(m.name in kills for m in MUTANTS)} not run).", "",
             "| mutant | class | what it changes | tier | last result |", "|---|---|---|---|---|"]
    for m in MUTANTS:
        k = kills.get(m.name)
        if k is None:
            result = "not run"
        else:
            killer = re.sub(r"^conformance\.", "", k["killed_by"])
            result = (f"{k['result']}" + (f" by `{killer}`" if killer else "")
                      + f", {k['seconds']} s ({k['run']})")
        tier = m.tier + (" (memcheck)" if m.runner == "memcheck" else "")
        lines.append(f"| {m.name} | {cls.get(m.name, '')} | {_cell(m.description)} | {tier} | {_cell(result)} |")
    lines += ["", "| run | date | machine | command |", "|---|---|---|---|"]
    lines += [f"| {label} | {r['date']} | {r['machine']} | `{r['command']}` |" for label, r in record["runs"].items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from tools._cli import parser

    p = parser("mutant_catalogue", __doc__)
    p.add_argument("--markdown", action="store_true", help="print the kill table (docs/mutants.md's)")
    p.add_argument("--record", metavar="RUN.json", type=Path,
                   help="merge a run's mutants.json (written by tools.mutants) into the kill record")
    p.add_argument("--kills", type=Path, default=KILLS, help="the kill record (default docs/results/mutants.json)")
    args = p.parse_args(argv)
    if args.record:
        args.kills.write_text(dump_kills(merge_kills(load_kills(args.kills), load_kills(args.record))))
        print(f"merged {args.record} into {args.kills}", file=sys.stderr)
    if args.markdown or not args.record:
        print(markdown(load_kills(args.kills)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
