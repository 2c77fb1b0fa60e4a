"""The fused FP8 KV-cache write: validate once, launch one Triton kernel.

The wrapper stays thin on purpose: after `make_plan` it only reads strides and pointers and
launches; it creates no tensors and runs no torch ops, so the call is CUDA-graph capturable with
every kind of scale (a Python float goes to the kernel as an fp32 argument, 1/scale is computed
in the kernel).
"""

from __future__ import annotations

import torch
import triton

from kernel.backend import fma_is_exact, interpreted, resolve_encoder
from kernel.plan import Plan, ScaleArg, make_plan
from kernel.recipe import DEFAULT_RECIPE, Recipe
from kernel.reference import naive_fp8_set_kv_buffer
from kernel.triton_kernel import fp8_kv_write


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def choose_tile(num_tokens: int, heads: int, dim: int) -> tuple[int, int, int, int]:
    """(BLOCK_T, BLOCK_H, BLOCK_D, num_warps): a pure function of the sizes, from a few buckets.

    Compiled (tiles from sweeps on the H200, 2026-12-02, docs/results/README.md):
    - BLOCK_D is D's next power of two (16 to 128), masked: 16-wide blocks that divide D = 80
      measured 17% of the copy roofline at T = 32768, against 62% for one 128-wide masked block;
    - decode (T <= 64) takes 1024-element tiles (4 warps, 8 elements a thread): the call is
      latency-bound, and more, smaller programs start sooner (2.5-3.0 us against 2.8-3.2 us for 2048);
    - prefill takes 4096-element tiles on both encoders: with recipe-specialized code that was
      the best of 2048-16384 elements and 2-8 warps over the six recipes (94-96% of the copy roofline
      at 8x128 on the hardware encoder; 8192 lost up to 8 points on the division recipes).
    Interpreted: each program costs tens of milliseconds, so tiles are larger, but still small
    enough that CI's cases span several programs on every axis (T > 8, H > 4 or D > 128).
    """
    if interpreted():
        return min(_pow2_at_least(num_tokens), 8), min(_pow2_at_least(heads), 4), \
            min(_pow2_at_least(dim), 128), 1
    return tile_for(heads, dim, 1024 if num_tokens <= 64 else 4096)


def tile_for(heads: int, dim: int, elements: int, warps: int = 4) -> tuple[int, int, int, int]:
    """(BLOCK_T, BLOCK_H, BLOCK_D, num_warps) for a compiled tile of about `elements` elements:
    BLOCK_D is D's next power of two (16 to 128), up to 1024 // BLOCK_D heads, then whole tokens."""
    block_d = min(max(_pow2_at_least(dim), 16), 128)
    block_h = min(_pow2_at_least(heads), max(1, 1024 // block_d))
    return max(1, elements // (block_h * block_d)), block_h, block_d, warps


def _vectorizable(plan: Plan, kc: tuple[int, ...], vc: tuple[int, ...]) -> bool:
    """True when every row of K, V and both caches starts 16-byte aligned and dims are unit-stride:
    16-byte-aligned bases, row offsets that are multiples of 16 elements, D a multiple of 16."""
    k, v = plan.k.stride(), plan.v.stride()
    return (plan.head_dim % 16 == 0 and k[2] == v[2] == kc[3] == vc[3] == 1
            and all(s % 16 == 0 for s in (*k[:2], *v[:2], *kc[:3], *vc[:3]))
            and all(t.data_ptr() % 16 == 0 for t in (plan.k, plan.v, plan.k_cache, plan.v_cache)))


def _scale_args(scale: ScaleArg, dummy: torch.Tensor) -> tuple[torch.Tensor, float, int]:
    """(pointer, value, from_pointer) for the kernel; a float travels by value."""
    if scale.tensor is not None:
        return scale.tensor, 0.0, 1
    return dummy, scale.value, 0


def launch(plan: Plan, encoder: str | None = None, *, tile: tuple[int, int, int, int] | None = None) -> None:
    """Run the kernel for a validated plan (nothing to do for T == 0).

    `tile` (BLOCK_T, BLOCK_H, BLOCK_D, num_warps) replaces choose_tile's choice: for tuning sweeps.
    """
    if plan.num_tokens == 0:
        return
    if plan.device.type != "cuda" and not interpreted():
        raise ValueError(f"fused_fp8_set_kv_buffer: tensors must be on a CUDA device (or run with "
                         f"TRITON_INTERPRET=1), got {plan.device}")
    software = resolve_encoder(encoder, plan.device) == "software"
    r = plan.recipe
    block_t, block_h, block_d, warps = tile or choose_tile(plan.num_tokens, plan.num_heads, plan.head_dim)
    grid = (triton.cdiv(plan.num_tokens, block_t), triton.cdiv(plan.num_heads, block_h),
            triton.cdiv(plan.head_dim, block_d))
    ks_ptr, ks_value, ks_from_ptr = _scale_args(plan.k_scale, plan.cache_loc)
    vs_ptr, vs_value, vs_from_ptr = _scale_args(plan.v_scale, plan.cache_loc)
    kc_strides = Plan.cache_strides(plan.k_cache, plan.page_size)
    vc_strides = Plan.cache_strides(plan.v_cache, plan.page_size)
    # Caches go to the kernel as bytes: one compiled variant serves fp8 and uint8 storage.
    k_bytes = plan.k_cache if plan.k_cache.dtype == torch.uint8 else plan.k_cache.view(torch.uint8)
    v_bytes = plan.v_cache if plan.v_cache.dtype == torch.uint8 else plan.v_cache.view(torch.uint8)
    fp8_kv_write[grid](
        plan.k, plan.v, k_bytes, v_bytes, plan.cache_loc, ks_ptr, vs_ptr,
        ks_value, vs_value, ks_from_ptr, vs_from_ptr,
        plan.num_tokens, plan.num_heads, plan.head_dim, plan.page_size, plan.num_slots,
        plan.cache_loc.stride(0),
        *plan.k.stride(), *plan.v.stride(),
        *kc_strides, *vc_strides,
        MUL_RECIPROCAL=r.scale_op == "mul_reciprocal", SCALE_IN_INPUT=r.scale_dtype == "input",
        INTERMEDIATE=r.intermediate == "input", SATURATE=r.overflow == "saturate",
        SOFTWARE=software, EXACT_FMA=fma_is_exact(), VEC=_vectorizable(plan, kc_strides, vc_strides),
        BLOCK_T=block_t, BLOCK_H=block_h, BLOCK_D=block_d, num_warps=warps,
    )


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
) -> None:
    """Quantize K and V to e4m3 and write token t to cache slot cache_loc[t], in one launch.

    Slot s is page s // page_size, offset s % page_size. Negative entries are padding and write
    nothing. Entries >= the number of slots never write: with checked=True they raise ValueError
    first (a host sync, so not under CUDA-graph capture); otherwise they are skipped like padding.
    If two tokens name one slot, which token's byte lands in each position is unspecified.
    use_triton=False runs the reference (`naive_fp8_set_kv_buffer`) instead.
    """
    if not use_triton:
        naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
                                recipe=recipe, checked=checked)
        return
    plan = make_plan(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
                     recipe=recipe, checked=checked)
    launch(plan, encoder)
