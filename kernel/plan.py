"""Argument normalization: the one place that decides what a call means.

`make_plan` validates the user's arguments and turns them into a `Plan`: sizes, strides in elements,
the layout, and the scale kinds. The reference and the fused kernel both start from it, so they cannot
disagree on what a call means, and both raise the same `TypeError`/`ValueError` before anything is
written. Validation never uses `assert` (it must survive `python -O`).
"""

from __future__ import annotations

import functools
import math
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

import torch

from kernel.overlap import Layout, data_address, shares_memory
from kernel.recipe import Recipe, get_recipe

INPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CACHE_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.uint8)
#: The cache's number format, by vLLM's kv_cache_dtype names: what a float8 cache's dtype says, or for a
#: uint8 cache what `cache_dtype=` says (e4m3 when it says nothing). docs/e5m2.md; fnuz (ROCm MI300's
#: e4m3, vLLM's float8_e4m3fnuz caches): docs/e5m2.md's fnuz section.
CacheFormat = Literal["fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz"]
FP8_DTYPES: dict[torch.dtype, CacheFormat] = {torch.float8_e4m3fn: "fp8_e4m3", torch.float8_e5m2: "fp8_e5m2",
                                              torch.float8_e4m3fnuz: "fp8_e4m3fnuz"}
CacheDtypeArg = torch.dtype | str | None
LOC_DTYPES = (torch.int32, torch.int64)

ScaleKind = Literal["none", "float", "tensor", "per-head"]
_F = TypeVar("_F", bound=Callable)


def not_traced(fn: _F) -> _F:
    """`torch.compiler.disable(fn)`, without importing torch._dynamo until something has.

    Importing dynamo takes seconds, most of importing this package (docs/results/h200-2026-12-03-e.md),
    and a process that has not imported it is not compiling anything: until then `fn` is called as is."""
    disabled: Callable | None = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal disabled
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return call  # type: ignore[return-value]


@dataclass(frozen=True)
class ScaleArg:
    """A normalized scale: None and Python floats become fp32 values, tensors stay on the device.

    "per-head" is a float32 tensor of one value per head ([H], any stride): head h's K (or V) is
    scaled by tensor[h], as vLLM's per-attention-head scales are (vllm#30141)."""

    kind: ScaleKind
    value: float  # the fp32-rounded value for "none" (1.0) and "float"; unused for tensors
    tensor: torch.Tensor | None  # float32: one element for "tensor", [H] for "per-head"


@dataclass(frozen=True)
class Plan:
    """Everything a call means, in elements. Caches are described as [pages, page_size, H, D]."""

    num_tokens: int
    num_heads: int
    head_dim: int
    page_size: int
    num_slots: int
    k: torch.Tensor  # [T, H, D] view of the input
    v: torch.Tensor
    k_cache: torch.Tensor  # as given (3-D or 4-D)
    v_cache: torch.Tensor
    cache_loc: torch.Tensor
    k_scale: ScaleArg
    v_scale: ScaleArg
    recipe: Recipe
    cache_format: CacheFormat = "fp8_e4m3"

    @property
    def device(self) -> torch.device:
        return self.k.device

    @staticmethod
    def cache_strides(cache: torch.Tensor, page_size: int) -> tuple[int, int, int, int]:
        """(page, offset, head, dim) strides in elements; a 3-D cache's slot stride is reused."""
        if cache.dim() == 3:
            s_slot, s_head, s_dim = cache.stride()
            return page_size * s_slot, s_slot, s_head, s_dim
        return tuple(cache.stride())  # type: ignore[return-value]


def _fail(kind: type[Exception], message: str) -> Exception:
    return kind(f"fused_fp8_set_kv_buffer: {message}")


def _check_tensor(name: str, x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise _fail(TypeError, f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def _normalize_input(name: str, x: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """Return x as a [T, H, D] view; a [T, H*D] input is split without copying."""
    if x.dtype not in INPUT_DTYPES:
        raise _fail(TypeError, f"{name}.dtype must be bfloat16, float16 or float32, got {x.dtype}")
    if x.dim() == 3:
        if tuple(x.shape[1:]) != (heads, dim):
            raise _fail(ValueError, f"{name} must have shape [T, {heads}, {dim}] to match the cache, "
                        f"got {list(x.shape)}")
        return x
    if x.dim() == 2:
        if x.shape[1] != heads * dim:
            raise _fail(ValueError, f"{name} must have shape [T, {heads * dim}] (H*D of the cache), "
                        f"got {list(x.shape)}")
        return x.unflatten(1, (heads, dim))  # splitting a dim is always a view
    raise _fail(ValueError, f"{name} must be 2-D [T, H*D] or 3-D [T, H, D], got {x.dim()}-D")


def _check_cache(name: str, cache: torch.Tensor, page_size: int) -> None:
    if cache.dtype not in CACHE_DTYPES:
        raise _fail(TypeError, f"{name}.dtype must be float8_e4m3fn, float8_e5m2, float8_e4m3fnuz or uint8, "
                    f"got {cache.dtype}")
    if cache.dim() not in (3, 4):
        raise _fail(ValueError, f"{name} must be 3-D [S, H, D] or 4-D [P, page_size, H, D], "
                    f"got {cache.dim()}-D")
    if cache.dim() == 4 and cache.shape[1] != page_size:
        raise _fail(ValueError, f"{name}.shape[1] must equal page_size={page_size}, got {cache.shape[1]}")
    if any(n == 0 for n in cache.shape[-2:]):
        raise _fail(ValueError, f"{name} must have at least one head and one dim, got {list(cache.shape)}")
    for size, stride in zip(cache.shape, cache.stride()):
        if size > 1 and stride == 0:
            raise _fail(ValueError, f"{name} must not be an expanded view (a zero stride aliases slots)")
    if _self_overlapping(cache):
        raise _fail(ValueError, f"{name} strides {tuple(cache.stride())} overlap: two of its elements share memory")


def _self_overlapping(t: torch.Tensor) -> bool:
    """True unless, in stride order, each dim steps past everything the inner dims span.

    That rule accepts every layout a KV cache uses (permuted, padded, K/V-interleaved pages) and
    rejects views whose elements alias; exotic interleavings it cannot prove disjoint count as overlap.
    """
    span = 0  # elements spanned by the dims seen so far, minus one
    for stride, size in sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1):
        if stride <= span:
            return True
        span += stride * (size - 1)
    return False


def _check_disjoint(k_cache: torch.Tensor, v_cache: torch.Tensor, *others: torch.Tensor | None) -> None:
    """Raise unless each cache's bytes are disjoint from the other cache's and from every argument the
    call reads (k, v, cache_loc, the scale tensors): a write into bytes it also reads, or into the
    other cache, lands in an order that depends on the kernel's programs. k and v may share memory.
    Exact (kernel/overlap.py), so K and V as the disjoint halves of one pool are accepted."""
    names = ("k", "v", "cache_loc", "k_scale", "v_scale")
    views = _judged(zip(names, others))
    caches = _judged((("k_cache", k_cache), ("v_cache", v_cache)))
    for i, (cname, cache, base) in enumerate(caches):
        for name, layout, addr in caches[:i] + views:
            if shares_memory(cache, base, layout, addr):
                why = "V would overwrite K" if name == "k_cache" else f"the write would change {name} while it is read"
                raise _fail(ValueError, f"{cname} must not overlap {name} in memory ({why})")


def _judged(named: object) -> list[tuple[str, Layout, int]]:
    """(name, layout, address) of each tensor given; tensors with no memory to judge (fake tensors
    while tracing) are left out: the real call checks them."""
    out = []
    for name, t in named:  # type: ignore[attr-defined]
        addr = None if t is None else data_address(t)
        if addr is not None:
            out.append((name, Layout.of(t), addr))
    return out


def _normalize_scale(name: str, scale: object, device: torch.device, heads: int) -> ScaleArg:
    if scale is None:
        return ScaleArg("none", 1.0, None)
    if isinstance(scale, bool) or not isinstance(scale, (float, int, torch.Tensor)):
        raise _fail(TypeError, f"{name} must be None, a float or a float32 tensor (one value, or one per head), "
                    f"got {type(scale).__name__}")
    if isinstance(scale, torch.Tensor):
        if scale.dtype != torch.float32:
            raise _fail(TypeError, f"{name} must be a float32 tensor, got {scale.dtype}")
        per_head = scale.dim() == 1 and scale.shape[0] == heads and heads > 1
        if scale.numel() != 1 and not per_head:
            raise _fail(ValueError, f"{name} must be a 0-d or 1-element tensor, or a [{heads}] tensor of one "
                        f"value per head, got shape {list(scale.shape)}")
        if scale.device != device:
            raise _fail(ValueError, f"{name} must be on {device} like k, got {scale.device}")
        return ScaleArg("per-head" if per_head else "tensor", math.nan, scale)
    value = float(scale)
    try:  # RNE double -> float, as the kernel argument will be (and cheaper than a torch op)
        fp32 = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        fp32 = math.inf
    if not (math.isfinite(fp32) and fp32 > 0.0):
        raise _fail(ValueError, f"{name} must be a positive finite float32 value, got {value!r}")
    return ScaleArg("float", fp32, None)


def _cache_format(cache_dtype: object, k_cache: torch.Tensor, v_cache: torch.Tensor) -> CacheFormat:
    """The caches' number format: each float8 cache's dtype, and `cache_dtype` (a float8 dtype, or vLLM's
    "fp8_e4m3" / "fp8_e5m2" / "fp8_e4m3fnuz"), must agree; two uint8 caches and no cache_dtype mean e4m3, as before."""
    said: CacheFormat | None = None
    if cache_dtype is not None:
        if isinstance(cache_dtype, torch.dtype):
            if cache_dtype not in FP8_DTYPES:
                raise _fail(ValueError, f"cache_dtype must be torch.float8_e4m3fn, torch.float8_e5m2 or "
                            f"torch.float8_e4m3fnuz, "
                            f"got {cache_dtype}")
            said = FP8_DTYPES[cache_dtype]
        elif isinstance(cache_dtype, str):
            if cache_dtype not in FP8_DTYPES.values():
                raise _fail(ValueError, f"cache_dtype must be 'fp8_e4m3', 'fp8_e5m2' or 'fp8_e4m3fnuz', "
                            f"got {cache_dtype!r}")
            said = cache_dtype  # type: ignore[assignment]
        else:
            raise _fail(TypeError, f"cache_dtype must be None, a float8 torch.dtype or "
                        f"'fp8_e4m3'/'fp8_e5m2'/'fp8_e4m3fnuz', "
                        f"got {type(cache_dtype).__name__}")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        own = FP8_DTYPES.get(cache.dtype)
        if own is None:
            continue
        if said is not None and own != said:
            what = "cache_dtype" if cache_dtype is not None else "k_cache's dtype"
            raise _fail(ValueError, f"{name}.dtype {cache.dtype} contradicts {what} "
                        f"({cache_dtype if cache_dtype is not None else k_cache.dtype}): one format for both caches")
        said = own
    return said or "fp8_e4m3"


def check_call(k: object, v: object, k_cache: object, v_cache: object, cache_loc: object, page_size: object,
               checked: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The checks every write shares (this module's and kernel/per_token_head.py's): five tensors on one
    device, page_size and checked of their types, caches of a cache dtype, rank and page size."""
    k, v = _check_tensor("k", k), _check_tensor("v", v)
    k_cache, v_cache = _check_tensor("k_cache", k_cache), _check_tensor("v_cache", v_cache)
    cache_loc = _check_tensor("cache_loc", cache_loc)
    if isinstance(page_size, bool) or not isinstance(page_size, int):
        raise _fail(TypeError, f"page_size must be an int, got {type(page_size).__name__}")
    if page_size < 1:
        raise _fail(ValueError, f"page_size must be >= 1, got {page_size}")
    if not isinstance(checked, bool):
        raise _fail(TypeError, f"checked must be a bool, got {type(checked).__name__}")
    device = k.device
    if device.type not in ("cuda", "cpu"):
        raise _fail(ValueError, f"k must be on a CUDA device (or the CPU), got {device}")
    for name, t in (("v", v), ("k_cache", k_cache), ("v_cache", v_cache), ("cache_loc", cache_loc)):
        if t.device != device:
            raise _fail(ValueError, f"{name} must be on {device} like k, got {t.device}")
    _check_cache("k_cache", k_cache, page_size)
    _check_cache("v_cache", v_cache, page_size)
    return k, v, k_cache, v_cache, cache_loc


def check_inputs(k: torch.Tensor, v: torch.Tensor, heads: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V as [T, H, D] views (from [T, H, D] or [T, H*D]) of one dtype and one token count."""
    k3 = _normalize_input("k", k, heads, dim)
    v3 = _normalize_input("v", v, heads, dim)
    if v.dtype != k.dtype:
        raise _fail(TypeError, f"v.dtype must equal k.dtype ({k.dtype}), got {v.dtype}")
    if v3.shape[0] != k3.shape[0]:
        raise _fail(ValueError, f"v has {v3.shape[0]} tokens but k has {k3.shape[0]}")
    return k3, v3


@not_traced  # plain Python validation: nothing for a compiler to trace (and dynamo recurses on it)
def make_plan(
    k: object,
    v: object,
    k_cache: object,
    v_cache: object,
    cache_loc: object,
    k_scale: object = None,
    v_scale: object = None,
    page_size: object = 16,
    *,
    recipe: Recipe | str,
    checked: bool = False,
    cache_dtype: object = None,
) -> Plan:
    """Validate a call and describe it. Raises TypeError/ValueError naming the bad argument."""
    k, v, k_cache, v_cache, cache_loc = check_call(k, v, k_cache, v_cache, cache_loc, page_size, checked)
    recipe = get_recipe(recipe)
    device = k.device
    if k_cache.shape != v_cache.shape:
        raise _fail(ValueError, f"v_cache shape {list(v_cache.shape)} must equal k_cache shape "
                    f"{list(k_cache.shape)}")
    cache_format = _cache_format(cache_dtype, k_cache, v_cache)
    heads, dim = k_cache.shape[-2], k_cache.shape[-1]
    num_slots = k_cache.shape[0] * (page_size if k_cache.dim() == 4 else 1)

    k3, v3 = check_inputs(k, v, heads, dim)

    if cache_loc.dtype not in LOC_DTYPES:
        raise _fail(TypeError, f"cache_loc.dtype must be int32 or int64, got {cache_loc.dtype}")
    if cache_loc.dim() != 1 or cache_loc.shape[0] != k3.shape[0]:
        raise _fail(ValueError, f"cache_loc must have shape [{k3.shape[0]}] (one slot per token), "
                    f"got {list(cache_loc.shape)}")
    if checked and cache_loc.numel() and bool((cache_loc >= num_slots).any()):
        bad = cache_loc[cache_loc >= num_slots][:4].tolist()
        raise _fail(ValueError, f"cache_loc entries must be < {num_slots} (the cache's slots) or "
                    f"negative (padding), got {bad}")

    ks = _normalize_scale("k_scale", k_scale, device, heads)
    vs = _normalize_scale("v_scale", v_scale, device, heads)
    _check_disjoint(k_cache, v_cache, k, v, cache_loc, ks.tensor, vs.tensor)
    return Plan(
        num_tokens=k3.shape[0],
        num_heads=heads,
        head_dim=dim,
        page_size=page_size,
        num_slots=num_slots,
        k=k3,
        v=v3,
        k_cache=k_cache,
        v_cache=v_cache,
        cache_loc=cache_loc,
        k_scale=ks,
        v_scale=vs,
        recipe=recipe,
        cache_format=cache_format,
    )
