"""The fused FP8 KV-cache write: validate once, launch one Triton kernel.

The wrapper stays thin on purpose: after `make_plan` it only reads strides and pointers and
launches; it creates no tensors and runs no torch ops, so the call is CUDA-graph capturable with
every kind of scale (a Python float goes to the kernel as an fp32 argument, 1/scale is computed
in the kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from kernel import dispatch
from kernel.backend import fma_is_exact, interpreted, resolve_encoder
from kernel.plan import CacheDtypeArg, Plan, ScaleArg, make_plan
from kernel.recipe import DEFAULT_RECIPE, Recipe
from kernel.reference import naive_fp8_set_kv_buffer
from kernel.triton_kernel import fp8_kv_write


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


Strides3 = tuple[int, int, int]
Strides4 = tuple[int, int, int, int]


@dataclass(frozen=True)
class Geometry:
    """The sizes and element strides the kernel sees: (token, head, dim) for K and V,
    (page, offset, head, dim) for the caches."""

    heads: int
    dim: int
    k: Strides3
    v: Strides3
    k_cache: Strides4
    v_cache: Strides4


def geometry(plan: Plan) -> Geometry:
    """The plan's layout, with [H, D] folded into one axis of H*D elements where that is exact.

    Where all four tensors store a token's heads back to back (head stride = D x dim stride), element
    (h, d) sits at (h*D + d) x dim stride, so the kernel may see one head of H*D elements. Tiles then
    follow whole rows: no masked lanes at D = 80 (8x80 = 5 x 128), and one program a 1024-element
    row at 4x256, as at 8x128, where two 512-element halves ran slower
    (docs/results/kernel-design-2026-12-02.md).
    """
    kc = Plan.cache_strides(plan.k_cache, plan.page_size)
    vc = Plan.cache_strides(plan.v_cache, plan.page_size)
    k, v = tuple(plan.k.stride()), tuple(plan.v.stride())
    heads, dim = plan.num_heads, plan.head_dim
    per_head = "per-head" in (plan.k_scale.kind, plan.v_scale.kind)  # the kernel needs each element's head
    pairs = ((k[1], k[2]), (v[1], v[2]), (kc[2], kc[3]), (vc[2], vc[3]))
    if not per_head and all(s_h == dim * s_d for s_h, s_d in pairs):
        return Geometry(1, heads * dim, (k[0], 0, k[2]), (v[0], 0, v[2]),
                        (kc[0], kc[1], 0, kc[3]), (vc[0], vc[1], 0, vc[3]))
    return Geometry(heads, dim, k, v, kc, vc)  # type: ignore[arg-type]


def choose_tile(num_tokens: int, heads: int, dim: int, software: bool) -> tuple[int, int, int, int]:
    """(BLOCK_T, BLOCK_H, BLOCK_D, num_warps) for the kernel's (possibly folded) heads and dim.

    Compiled, 4 warps, tile sizes from the sweep in docs/results/tile-sweep-2026-12-02-final.csv
    (and the re-run of its software rows in docs/results/README.md):
    - decode (T <= 64) is latency-bound, and more, smaller programs start sooner: 512 elements. The
      sweep had 1024 0.05 us faster at T = 64 (8x128) and 0.03 us slower at 32x128; one decode bucket,
      not two, halves the compiled variants of the small T that most test cases draw;
    - prefill: 2048 elements on the hardware encoder, which was faster than 4096 for every recipe;
      4096 on the ALU-bound software encoder, where larger tiles won on the final kernel.
    Interpreted: each program costs tens of milliseconds, so tiles are larger, but still small
    enough that CI's cases span several programs on every axis (T > 8, H > 4 or D > 128).
    """
    if interpreted():
        return min(_pow2_at_least(num_tokens), 8), min(_pow2_at_least(heads), 4), \
            min(_pow2_at_least(dim), 128), 1
    if num_tokens <= 64:
        elements = 512
    else:
        elements = 4096 if software else 2048
    return tile_for(dim, elements)


def tile_for(dim: int, elements: int, warps: int = 4) -> tuple[int, int, int, int]:
    """(BLOCK_T, BLOCK_H, BLOCK_D, num_warps) for a compiled tile of about `elements` elements.

    BLOCK_D is the largest power of two dividing D when that is at least 64, so no lane is masked
    (16-wide blocks that divide D = 80 gave too little work a program:
    docs/results/kernel-design-2026-12-02.md); otherwise D's next power of two, at least 64, masked.
    At most 512, and at most half the tile: Triton 3.6's coalescing pass fails to compile a [1, 1, N]
    tile whose row pointers carry the alignment hint (PassManager::run failed on the H200), so a tile
    always spans at least two tokens. BLOCK_H is 1: the rest of the tile is whole tokens (per-head scales:
    `heads_in_tile` then spans several heads).
    Every contiguous layout is folded to one head of H*D elements (`geometry`), so this only
    changes tiles for strided heads, which no measured shape has; and the tile depends on nothing
    but D's power-of-two factors and the bucket, so the test suite's thousands of odd shapes need
    fewer compiled variants (docs/results/h200-2026-12-03-c.md).
    """
    whole = dim & -dim
    block_d = whole if whole >= 64 else max(_pow2_at_least(dim), 64)
    block_d = min(block_d, 512, elements // 2)
    return elements // block_d, 1, block_d, warps


def heads_in_tile(heads: int, block_t: int, block_d: int) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_H) for per-head scales, where H and D stay apart (`geometry`): a tile of BLOCK_T
    tokens spans several heads, as the folded row does, instead of BLOCK_T x 4 tokens of one head,
    which ran at 92 % of a copy at 8x128 (docs/results/h200-2026-12-04-b.md). BLOCK_H is the largest
    power of two that divides H (no masked heads), within a 512-element row, and the tile keeps at
    least two tokens (tile_for's rule)."""
    block_h = 1
    while heads % (block_h * 2) == 0 and block_h * 2 * block_d <= 512 and block_t // (block_h * 2) >= 2:
        block_h *= 2
    return block_t // block_h, block_h


def _vectorizable_layout(g: Geometry) -> bool:
    """True when dims are unit-stride, D a multiple of 16 and every row offset a multiple of 16
    elements: then 16-byte-aligned bases make every row of K, V and both caches start 16-byte aligned."""
    return (g.dim % 16 == 0 and g.k[2] == g.v[2] == g.k_cache[3] == g.v_cache[3] == 1
            and all(s % 16 == 0 for s in (*g.k[:2], *g.v[:2], *g.k_cache[:3], *g.v_cache[:3])))


def _vectorizable(plan: Plan, g: Geometry) -> bool:
    return _vectorizable_layout(g) and all(t.data_ptr() % 16 == 0 for t in (plan.k, plan.v, plan.k_cache, plan.v_cache))


def _scale_args(scale: ScaleArg, dummy: int) -> tuple[int, float, int, int]:
    """(address, value, from_pointer, head stride) for the kernel; a float travels by value (and the
    address is a dummy the kernel never reads: a real one, so that it is typed as 64 bits like the others)."""
    if scale.kind == "per-head":
        return scale.tensor.data_ptr(), 0.0, 1, scale.tensor.stride(0)
    if scale.tensor is not None:
        return scale.tensor.data_ptr(), 0.0, 1, 0
    return dummy, scale.value, 0, 0


def kernel_args(plan: Plan, software: bool,
                tile: tuple[int, int] | None = None) -> tuple[tuple[int, int, int], tuple, dict, int]:
    """(grid, positional arguments, constexprs, num_warps) of the kernel launch for a validated plan."""
    r = plan.recipe
    g = geometry(plan)
    fnuz = plan.cache_format == "fp8_e4m3fnuz"
    software = software or fnuz  # e4m3fnuz has only the software encoder (docs/e5m2.md, fnuz)
    per_head = "per-head" in (plan.k_scale.kind, plan.v_scale.kind)
    block_t, block_h, block_d, warps = (tile_for(g.dim, *tile) if tile
                                        else choose_tile(plan.num_tokens, g.heads, g.dim, software))
    if per_head and not interpreted():
        block_t, block_h = heads_in_tile(g.heads, block_t, block_d)
    grid = (triton.cdiv(plan.num_tokens, block_t), triton.cdiv(g.heads, block_h), triton.cdiv(g.dim, block_d))
    ks_ptr, ks_value, ks_from_ptr, ks_stride = _scale_args(plan.k_scale, plan.cache_loc.data_ptr())
    vs_ptr, vs_value, vs_from_ptr, vs_stride = _scale_args(plan.v_scale, plan.cache_loc.data_ptr())
    # Caches go to the kernel as bytes: one compiled variant serves fp8 and uint8 storage.
    k_bytes = plan.k_cache if plan.k_cache.dtype == torch.uint8 else plan.k_cache.view(torch.uint8)
    v_bytes = plan.v_cache if plan.v_cache.dtype == torch.uint8 else plan.v_cache.view(torch.uint8)
    args = (plan.k, plan.v, k_bytes, v_bytes, plan.cache_loc, ks_ptr, vs_ptr,
            ks_value, vs_value, ks_from_ptr, vs_from_ptr, ks_stride, vs_stride,
            plan.num_tokens, g.heads, g.dim, plan.page_size, plan.num_slots, plan.cache_loc.stride(0),
            *g.k, *g.v, *g.k_cache, *g.v_cache)
    constexprs = dict(
        MUL_RECIPROCAL=r.scale_op == "mul_reciprocal", SCALE_IN_INPUT=r.scale_dtype == "input",
        INTERMEDIATE=r.intermediate == "input", SATURATE=r.overflow == "saturate",
        SOFTWARE=software, EXACT_FMA=fma_is_exact(), VEC=_vectorizable(plan, g),
        PER_HEAD=per_head,
        E5M2=plan.cache_format == "fp8_e5m2", FNUZ=fnuz,
        BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_D=block_d,
    )
    return grid, args, constexprs, warps


def _remember(key: tuple, plan: Plan, compiled: object, grid: tuple[int, int, int], args: tuple,
              constexprs: dict) -> None:
    dispatch.remember(key, plan, compiled, grid, args, constexprs, _vectorizable_layout(geometry(plan)),
                      fp8_kv_write.arg_names)


def launch(plan: Plan, encoder: str | None = None, *, tile: tuple[int, int] | None = None,
           remember: tuple | None = None) -> None:
    """Run the kernel for a validated plan (nothing to do for T == 0).

    `tile` (elements, num_warps) replaces choose_tile's choice on CUDA: for tuning sweeps.
    `remember`: the call's `dispatch.call_key`, so that later calls of that layout take the fast path.
    """
    if plan.num_tokens == 0:
        if remember is not None:
            dispatch.remember_empty(remember, plan)
        return
    if plan.device.type == "cuda" and plan.device.index != torch.cuda.current_device():
        # Triton launches on the current device, whatever device the tensors are on (docs/facts.md).
        with torch.cuda.device(plan.device):
            return launch(plan, encoder, tile=tile, remember=remember)
    if plan.device.type != "cuda" and not interpreted():
        raise ValueError(f"fused_fp8_set_kv_buffer: tensors must be on a CUDA device (or run with "
                         f"TRITON_INTERPRET=1), got {plan.device}")
    software = resolve_encoder(encoder, plan.device) == "software"
    grid, args, constexprs, warps = kernel_args(plan, software, tile)
    compiled = fp8_kv_write[grid](*args, **constexprs, num_warps=warps)
    if remember is not None and tile is None and plan.device.type == "cuda" and not interpreted():
        _remember(remember, plan, compiled, grid, args, constexprs)


def fused_fp8_set_kv_buffer(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_loc: torch.Tensor,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
    page_size: int = 16,
    use_triton: bool = True,
    *,
    recipe: Recipe | str = DEFAULT_RECIPE,
    checked: bool = False,
    encoder: str | None = None,
    cache_dtype: CacheDtypeArg = None,
    per_token_head: bool | str = False,
    k_scale_cache: torch.Tensor | None = None,
    v_scale_cache: torch.Tensor | None = None,
) -> None:
    """Quantize K and V to fp8 and write token t to cache slot cache_loc[t], in one launch.

    The format is e4m3, or e5m2 for float8_e5m2 caches; uint8 caches hold e4m3 unless cache_dtype says
    otherwise (torch.float8_e5m2 or "fp8_e5m2"; it must agree with a float8 cache's dtype). float8_e4m3fnuz
    caches (or cache_dtype torch.float8_e4m3fnuz / "fp8_e4m3fnuz") are e4m3fnuz, through the software encoder.

    A scale is None (1.0), a float, a float32 tensor of one element, or a [H] float32 tensor of one
    scale per head (head h's values divided by scale[h], as vLLM's per-head scales are).

    Slot s is page s // page_size, offset s % page_size. Negative entries are padding and write
    nothing. Entries >= the number of slots never write: with checked=True they raise ValueError
    first (a host sync, so not under CUDA-graph capture); otherwise they are skipped like padding.
    If two tokens name one slot, which token's byte lands in each position is unspecified.
    use_triton=False runs the reference (`naive_fp8_set_kv_buffer`) instead.
    per_token_head (True or a recipe name), k_scale_cache, v_scale_cache: dynamic per-(token, head)
    scales, stored inline or in the scale caches (kernel/per_token_head.py).
    """
    if per_token_head is not False or k_scale_cache is not None or v_scale_cache is not None:
        from kernel.per_token_head_kernel import fused_per_token_head
        return fused_per_token_head(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, use_triton,
                                    per_token_head=per_token_head, recipe=recipe, checked=checked, encoder=encoder,
                                    k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache,
                                    cache_dtype=cache_dtype)
    if not use_triton:
        naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
                                recipe=recipe, checked=checked, cache_dtype=cache_dtype)
        return
    key = None
    if checked is False:
        key = dispatch.call_key(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe, encoder,
                                cache_dtype)
        if key is not None and dispatch.launch_known(key, k, v, k_cache, v_cache, cache_loc, k_scale, v_scale):
            return
    plan = make_plan(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
                     recipe=recipe, checked=checked, cache_dtype=cache_dtype)
    if key is not None:
        dispatch.remember_scales(k_scale, v_scale, plan)
    launch(plan, encoder, remember=key)
