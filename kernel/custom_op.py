"""The fused write as a PyTorch custom op, `torch.ops.kvfp8.fused_fp8_set_kv_buffer`.

torch.compile cannot trace into a Triton launch that runs Python validation, so the write is one
opaque op that mutates its two caches. Schema (a scale travels in one of two slots):

    kvfp8::fused_fp8_set_kv_buffer(
        Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor cache_loc,
        Tensor? k_scale, Tensor? v_scale,              # a 0-d / 1-element fp32 device tensor, or None
        float? k_scale_value, float? v_scale_value,    # a Python float scale, or None
        SymInt page_size, str recipe, bool checked, str? encoder, bool use_triton,
        str? cache_dtype=None) -> ()                   # "fp8_e4m3" / "fp8_e5m2" / "fp8_e4m3fnuz", or None

At most one of `k_scale` / `k_scale_value` is given (both None means 1.0). `fused_fp8_set_kv_buffer_op`
below has the same Python signature as `kernel.fused_fp8_set_kv_buffer` and splits the scale into
the right slot, so it is a drop-in replacement inside torch.compile(fullgraph=True).

The real implementation is the eager call itself (`kernel.fused_fp8_set_kv_buffer`, its fast path
included), so validation and bytes are exactly the eager call's. The fake implementation runs the same
`make_plan` on fake tensors (shape, dtype and device errors surface while tracing) and returns
nothing. A float scale's own checks (positive, finite in fp32) need no tensor, but they run only in
the real implementation, so a bad float under torch.compile raises when the op runs, still before
anything is written.
"""

from __future__ import annotations

import torch
from torch.autograd.graph import increment_version

from kernel.fused import fused_fp8_set_kv_buffer
from kernel.plan import FP8_DTYPES, CacheDtypeArg, _check_tensor, _normalize_scale, make_plan
from kernel.recipe import DEFAULT_RECIPE, RECIPES, Recipe

OP_NAME = "kvfp8::fused_fp8_set_kv_buffer"


_SCHEMA = ("fused_fp8_set_kv_buffer(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, "
           "Tensor cache_loc, Tensor? k_scale, Tensor? v_scale, float? k_scale_value, float? v_scale_value, "
           "SymInt page_size, str recipe, bool checked, str? encoder, bool use_triton, str? cache_dtype=None) -> ()")

# Defined with torch.library.Library, not torch.library.custom_op: custom_op's Python wrappers (its
# autograd and in-place handling) cost about 14 us a call on the CPU machine, most of the op's
# host time. Here the dispatcher goes straight to the implementation, which bumps the mutated caches'
# version counters itself, as an in-place op must (custom_op did it in one of those wrappers).
_LIB = torch.library.Library("kvfp8", "DEF")
_LIB.define(_SCHEMA)


def _fused_op(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              cache_loc: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
              k_scale_value: float | None, v_scale_value: float | None, page_size: int, recipe: str,
              checked: bool, encoder: str | None, use_triton: bool, cache_dtype: str | None = None) -> None:
    ks = _one_scale("k_scale", k_scale, k_scale_value)
    vs = _one_scale("v_scale", v_scale, v_scale_value)
    fused_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, ks, vs, page_size, use_triton,
                            recipe=recipe, checked=checked, encoder=encoder, cache_dtype=cache_dtype)
    increment_version((k_cache, v_cache))


# One implementation for every backend: the eager call picks the device itself (CUDA, or the Triton
# interpreter on the CPU) and raises its own error for any other.
_LIB.impl("fused_fp8_set_kv_buffer", _fused_op, "CompositeExplicitAutograd")


@torch.library.register_fake(OP_NAME, lib=_LIB)
def _fused_op_fake(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, k_scale_value, v_scale_value,
                   page_size, recipe, checked, encoder, use_triton, cache_dtype=None) -> None:
    # Float scales are left out: their fp32 check builds a tensor from the value (real impl only).
    # checked=False here: the range check reads cache_loc's values, which fake tensors do not have.
    # Under dynamic shapes page_size may arrive as a SymInt; make_plan wants an int (this guards on it).
    _one_scale("k_scale", k_scale, k_scale_value)
    _one_scale("v_scale", v_scale, v_scale_value)
    make_plan(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, int(page_size), recipe=recipe, checked=False,
              cache_dtype=cache_dtype)


def _one_scale(name: str, tensor: torch.Tensor | None, value: float | None) -> torch.Tensor | float | None:
    if tensor is not None and value is not None:
        raise ValueError(f"fused_fp8_set_kv_buffer: give {name} as a tensor or as a float, not both")
    return tensor if tensor is not None else value


def _recipe_name(recipe: Recipe | str) -> str:
    """The op takes a recipe by name; a Recipe object must be one of the named presets."""
    if isinstance(recipe, Recipe):
        if RECIPES.get(recipe.name) != recipe:
            raise ValueError(f"the custom op takes named recipes only ({sorted(RECIPES)}), got {recipe}")
        return recipe.name
    return recipe  # a str; make_plan rejects unknown names


def _cache_dtype_name(cache_dtype: object) -> str | None:
    """The op's schema has no dtype argument that takes float8 dtypes by name here: a float8 dtype
    travels as vLLM's name for it; anything else is passed on for make_plan to refuse (or accept)."""
    if isinstance(cache_dtype, torch.dtype):
        if cache_dtype not in FP8_DTYPES:
            raise ValueError(f"fused_fp8_set_kv_buffer: cache_dtype must be torch.float8_e4m3fn or "
                             f"torch.float8_e5m2 or torch.float8_e4m3fnuz, got {cache_dtype}")
        return FP8_DTYPES[cache_dtype]
    if cache_dtype is not None and not isinstance(cache_dtype, str):
        raise TypeError(f"fused_fp8_set_kv_buffer: cache_dtype must be None, a float8 torch.dtype or "
                        f"'fp8_e4m3'/'fp8_e5m2'/'fp8_e4m3fnuz', got {type(cache_dtype).__name__}")
    return cache_dtype


def _split_scale(name: str, scale: object, device: torch.device) -> tuple[torch.Tensor | None, float | None]:
    if scale is None or isinstance(scale, torch.Tensor):
        return scale, None
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        _normalize_scale(name, scale, device, 1)  # raises the same TypeError as the eager call
    return None, float(scale)


_OP = torch.ops.kvfp8.fused_fp8_set_kv_buffer.default


def fused_fp8_set_kv_buffer_op(
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
) -> None:
    """`kernel.fused_fp8_set_kv_buffer` through the custom op: same arguments, same bytes.

    Traceable by torch.compile(fullgraph=True); the caches are mutated in place. Under torch.compile
    a float scale is a graph constant or input as Dynamo decides; either way the kernel gets its value.
    """
    device = _check_tensor("k", k).device
    kt, kf = _split_scale("k_scale", k_scale, device)
    vt, vf = _split_scale("v_scale", v_scale, device)
    _OP(k, v, k_cache, v_cache, cache_loc, kt, vt, kf, vf, page_size, _recipe_name(recipe), checked, encoder,
        use_triton, _cache_dtype_name(cache_dtype))
