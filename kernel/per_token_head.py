"""Dynamic per-(token, head) FP8 writes: each written head computes its own scale, stored with its bytes.

For each written token t and head h, over the head's D values x widened to fp32 (exact):

    amax = max |x| over D                            exact (a maximum rounds nothing)
    per-token-head-vllm (vLLM's _reshape_cache_per_token_head_kernel, vllm#38378,
    vllm/v1/attention/ops/triton_quant_kv/int8_fp8_per_token_head.py):
        s = amax / 448                               IEEE fp32 division (Triton's `/` is div.full.f32,
                                                     an approximation: we hold the IEEE quotient)
        s = s if s >= FLOOR_VLLM else FLOOR_VLLM     tl.maximum(., 1e-6), 1e-6 rounded to fp32
        y = x * (1 / s)                              IEEE fp32 reciprocal, then IEEE fp32 multiply
        y = clamp(y, -448, 448)                      tl.clamp (NaN passes)
    per-token-head-flashinfer (FlashInfer's test quantizer, not read from its source: see
    docs/per-token-head.md):
        s = max(amax, FLOOR_FLASHINFER) / 448        1e-12 rounded to fp32; IEEE fp32 division
        y = x / s                                    IEEE fp32 division
    byte = e4m3(y)                                   RNE onto the e4m3 grid, saturating (cvt.rn.satfinite)

Edge cases, decided here (the real kernels leave them to the hardware's min/max NaN rules):
- a head holding a NaN is NaN throughout: s = NaN (stored as 0x7FC00000), every byte 0x7F. Torch's
  amax and clamp propagate NaN, which is what FlashInfer's torch sequence does; vLLM's compiled tl.max
  would drop it, the interpreter's would not, so one definition is fixed for both recipes.
- a head holding ±inf (and no NaN): amax = inf, s = inf (stored), 1/s = 0: finite values give ±0, ±inf
  gives inf * 0 = NaN (0x7F) in vLLM's recipe; x / inf = ±0 and inf / inf = NaN in FlashInfer's.
- an all-zero head: s = the floor, every byte ±0 (0x00 / 0x80: the sign of zero is kept).
- a subnormal amax: the floor decides s (vLLM: amax / 448 < 1e-6; FlashInfer: amax < 1e-12).

Where the scale goes:
- inline: the caches' last dim is D + 4; a head's slot holds its D bytes, then the 4 bytes of fp32 s,
  little-endian, at positions D..D+3 of that dim (whatever its stride);
- separate: float32 `k_scale_cache` / `v_scale_cache` shaped like the cache minus its last dim
  ([P, page_size, H], or [S, H] for a 3-D cache), any strides: s at [page, offset, h].

`make_pth_plan` validates a call (TypeError/ValueError naming the argument, before anything is
written); `write_per_token_head` is the specification, in plain torch with the same exact operations
as kernel/reference.py; `kernel/per_token_head_kernel.py` is the one-launch Triton kernel.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernel.overlap import shares_memory
from kernel.plan import (
    LOC_DTYPES,
    _cache_format,
    _check_tensor,
    _fail,
    _judged,
    _self_overlapping,
    check_call,
    check_inputs,
    not_traced,
)
from kernel.recipe import DEFAULT_PTH_RECIPE, DEFAULT_RECIPE, PTH_RECIPES, RECIPES, PerTokenHeadRecipe, Recipe
from kernel.reference import E4M3, encode_e4m3

#: Bytes of the fp32 scale after a head's D bytes in the inline layout.
SCALE_BYTES = 4
#: The fp32 bits of a NaN scale: the positive quiet NaN, whatever made it.
NAN_SCALE_BITS = 0x7FC00000


def _fp32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def fp32_bits(value: float) -> int:
    return struct.unpack("I", struct.pack("f", value))[0]


FLOOR_VLLM = _fp32(1e-6)  # 0x358637BD: tl.maximum(amax / QUANT_MAX, 1e-6), the literal an fp32 constant
FLOOR_FLASHINFER = _fp32(1e-12)  # 0x2B8CBCCC: max(amax, 1e-12) on an fp32 tensor


_SATURATE: Recipe = RECIPES["single"]  # only its overflow rule is read: saturate to ±448


def get_pth_recipe(per_token_head: object) -> PerTokenHeadRecipe:
    """per_token_head=True means vLLM's recipe; a string names one of PTH_RECIPES."""
    if per_token_head is True:
        return PTH_RECIPES[DEFAULT_PTH_RECIPE]
    if isinstance(per_token_head, str):
        if per_token_head in PTH_RECIPES:
            return PTH_RECIPES[per_token_head]
        raise _fail(ValueError, f"per_token_head must be True or one of {sorted(PTH_RECIPES)}, "
                    f"got {per_token_head!r}")
    raise _fail(TypeError, f"per_token_head must be a bool or a recipe name, got {type(per_token_head).__name__}")


@dataclass(frozen=True)
class PTHPlan:
    """A validated per-token-head call. Caches as given; D is the input's head_dim."""

    num_tokens: int
    num_heads: int
    head_dim: int
    page_size: int
    num_slots: int
    k: torch.Tensor  # [T, H, D]
    v: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_loc: torch.Tensor
    k_scale_cache: torch.Tensor | None  # None: inline
    v_scale_cache: torch.Tensor | None
    recipe: PerTokenHeadRecipe

    @property
    def inline(self) -> bool:
        return self.k_scale_cache is None


def _input_head_dim(name: str, x: torch.Tensor, heads: int) -> int:
    """D as the input says it ([T, H, D], or [T, H*D] with H from the cache); shapes are checked later."""
    if x.dim() == 3:
        return x.shape[2]
    if x.dim() == 2 and heads and x.shape[1] % heads == 0:
        return x.shape[1] // heads
    if x.dim() == 2:
        raise _fail(ValueError, f"{name} must have shape [T, H*D] with H = {heads} (the cache's heads), "
                    f"got {list(x.shape)}")
    raise _fail(ValueError, f"{name} must be 2-D [T, H*D] or 3-D [T, H, D], got {x.dim()}-D")


def _check_scale_cache(name: str, sc: object, cache: torch.Tensor, device: torch.device) -> torch.Tensor:
    sc = _check_tensor(name, sc)
    if sc.dtype != torch.float32:
        raise _fail(TypeError, f"{name}.dtype must be float32, got {sc.dtype}")
    want = list(cache.shape[:-1])
    if list(sc.shape) != want:
        raise _fail(ValueError, f"{name} must have shape {want} (the cache's shape without head_dim), "
                    f"got {list(sc.shape)}")
    if sc.device != device:
        raise _fail(ValueError, f"{name} must be on {device} like k, got {sc.device}")
    if any(n > 1 and s == 0 for n, s in zip(sc.shape, sc.stride())) or _self_overlapping(sc):
        raise _fail(ValueError, f"{name} strides {tuple(sc.stride())} overlap: two of its elements share memory")
    return sc


def _check_disjoint(written: list[tuple[str, torch.Tensor]], read: list[tuple[str, torch.Tensor]]) -> None:
    """Every tensor written shares no byte with another written one nor with anything read (exact)."""
    outs, ins = _judged(written), _judged(read)
    for i, (name, layout, addr) in enumerate(outs):
        for other, o_layout, o_addr in outs[:i] + ins:
            if shares_memory(layout, addr, o_layout, o_addr):
                raise _fail(ValueError, f"{name} must not overlap {other} in memory (the write would "
                            f"change {other}, or land in an order that depends on the kernel's programs)")


@not_traced  # plain Python validation, as make_plan: nothing for a compiler to trace
def make_pth_plan(k: object, v: object, k_cache: object, v_cache: object, cache_loc: object,
                  k_scale: object = None, v_scale: object = None, page_size: object = 16, *,
                  per_token_head: object = True, recipe: object = DEFAULT_RECIPE, checked: object = False,
                  k_scale_cache: object = None, v_scale_cache: object = None,
                  cache_dtype: object = None) -> PTHPlan:
    """Validate a per-token-head call. Raises TypeError/ValueError naming the bad argument."""
    if per_token_head is False:
        given = "k_scale_cache" if k_scale_cache is not None else "v_scale_cache"
        raise _fail(ValueError, f"{given} is for per_token_head writes: pass per_token_head=True (or a recipe name)")
    pth = get_pth_recipe(per_token_head)
    if not (recipe is DEFAULT_RECIPE or recipe == DEFAULT_RECIPE.name):
        raise _fail(ValueError, f"recipe does not apply with per_token_head (its recipe is {pth.name}), "
                    f"got {recipe!r}")
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is not None:
            raise _fail(ValueError, f"{name} must be None with per_token_head: each head's scale is computed "
                        f"from its values")
    k, v, k_cache, v_cache, cache_loc = check_call(k, v, k_cache, v_cache, cache_loc, page_size, checked)
    device = k.device
    if _cache_format(cache_dtype, k_cache, v_cache) != "fp8_e4m3":  # vLLM's fp8_per_token_head is e4m3
        raise _fail(ValueError, "per_token_head writes e4m3 (vLLM's fp8_per_token_head): the caches must be "
                    f"float8_e4m3fn or uint8 and cache_dtype None or e4m3, got {k_cache.dtype}, {cache_dtype!r}")
    if k_cache.shape != v_cache.shape:
        raise _fail(ValueError, f"v_cache shape {list(v_cache.shape)} must equal k_cache shape {list(k_cache.shape)}")
    heads, width = k_cache.shape[-2], k_cache.shape[-1]
    dim = _input_head_dim("k", k, heads)
    if dim < 1:
        raise _fail(ValueError, f"k must have a head_dim of at least 1, got {list(k.shape)}")
    if (k_scale_cache is None) != (v_scale_cache is None):
        missing = "v_scale_cache" if v_scale_cache is None else "k_scale_cache"
        raise _fail(ValueError, f"{missing} must be given too: both scale caches (separate layout) or neither "
                    f"(inline: the caches' last dim is head_dim + {SCALE_BYTES})")
    inline = k_scale_cache is None
    want = dim + SCALE_BYTES if inline else dim
    if width != want:
        why = (f"widened to head_dim + {SCALE_BYTES} = {want} (D fp8 bytes, then the fp32 scale) for the inline "
               f"layout" if inline else f"head_dim = {want} (the scales go to k_scale_cache/v_scale_cache)")
        raise _fail(ValueError, f"k_cache's last dim must be {why}, got {width}")
    k3, v3 = check_inputs(k, v, heads, dim)
    num_slots = k_cache.shape[0] * (page_size if k_cache.dim() == 4 else 1)
    if cache_loc.dtype not in LOC_DTYPES:
        raise _fail(TypeError, f"cache_loc.dtype must be int32 or int64, got {cache_loc.dtype}")
    if cache_loc.dim() != 1 or cache_loc.shape[0] != k3.shape[0]:
        raise _fail(ValueError, f"cache_loc must have shape [{k3.shape[0]}] (one slot per token), "
                    f"got {list(cache_loc.shape)}")
    written = [("k_cache", k_cache), ("v_cache", v_cache)]
    if not inline:
        k_scale_cache = _check_scale_cache("k_scale_cache", k_scale_cache, k_cache, device)
        v_scale_cache = _check_scale_cache("v_scale_cache", v_scale_cache, v_cache, device)
        written += [("k_scale_cache", k_scale_cache), ("v_scale_cache", v_scale_cache)]
    _check_disjoint(written, [("k", k), ("v", v), ("cache_loc", cache_loc)])
    if checked and cache_loc.numel() and bool((cache_loc >= num_slots).any()):  # a host sync, last
        bad = cache_loc[cache_loc >= num_slots][:4].tolist()
        raise _fail(ValueError, f"cache_loc entries must be < {num_slots} (the cache's slots) or "
                    f"negative (padding), got {bad}")
    return PTHPlan(k3.shape[0], heads, dim, page_size, num_slots, k3, v3, k_cache, v_cache, cache_loc,
                   k_scale_cache, v_scale_cache, pth)  # type: ignore[arg-type]


#: Where each rule floors: the scale after the division (vLLM), or amax before it (FlashInfer).
FLOOR_ON = {"vllm": "scale", "flashinfer": "amax"}


def head_scales(x32: torch.Tensor, recipe: PerTokenHeadRecipe, floor_on: str | None = None,
                by_reciprocal: bool = False, floor: float | None = None) -> torch.Tensor:
    """Each head's fp32 scale s, [..., H], from its values x32 [..., H, D] (see the module docstring).
    `floor_on` ("amax", "scale" or "none") moves the recipe's floor, `floor` changes its value, and
    `by_reciprocal` multiplies by the fp32 1/448 instead of dividing by 448: the wrong rules the diagnosis tries
    (conformance/diagnosis/pth_causes.py); the defaults are the recipe's own (FLOOR_ON, its floor, a correctly
    rounded division)."""
    nan = torch.isnan(x32)
    amax = torch.where(nan, 0.0, x32.abs()).amax(-1)  # NaN kept out of the max: its rule is below
    # Tensor / tensor: ATen's CUDA division by a Python scalar multiplies by its reciprocal.
    q_max = torch.full_like(amax, E4M3.max_finite)
    floor = (FLOOR_VLLM if recipe.rule == "vllm" else FLOOR_FLASHINFER) if floor is None else floor
    where = floor_on or FLOOR_ON[recipe.rule]

    def per_max(a: torch.Tensor) -> torch.Tensor:
        return a * (torch.ones_like(q_max) / q_max) if by_reciprocal else a / q_max
    if where == "amax":
        s = per_max(torch.where(amax < floor, floor, amax))
    else:
        s = per_max(amax)
        if where == "scale":
            s = torch.where(s < floor, floor, s)  # an explicit compare: no min/max NaN rule involved
    return torch.where(nan.any(-1), torch.nan, s)


def quantize_heads(x: torch.Tensor, recipe: PerTokenHeadRecipe,
                   scales: Callable[[torch.Tensor, PerTokenHeadRecipe], torch.Tensor] = head_scales,
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The definition: values [..., H, D] -> (e4m3 bytes [..., H, D], fp32 scales [..., H]). `scales` is
    `head_scales` (the diagnosis passes the wrong scale rules real kernels follow, to name one)."""
    x32 = x.to(torch.float32)  # exact widening
    s = scales(x32, recipe)
    if recipe.rule == "vllm":
        y = x32 * (torch.ones_like(s) / s)[..., None]
        y = torch.where(y > E4M3.max_finite, E4M3.max_finite, torch.where(y < -E4M3.max_finite, -E4M3.max_finite, y))
    else:
        y = x32 / s[..., None]
    return encode_e4m3(y, _SATURATE), s


def scale_bits(s: torch.Tensor) -> torch.Tensor:
    """The fp32 bits of each scale as int64 in [0, 2**32), every NaN as NAN_SCALE_BITS."""
    bits = s.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return torch.where(torch.isnan(s), NAN_SCALE_BITS, bits)


def scale_bytes(s: torch.Tensor) -> torch.Tensor:
    """[..., 4] little-endian bytes (uint8) of each fp32 scale, as the inline layout stores them."""
    shifts = torch.arange(0, 8 * SCALE_BYTES, 8, device=s.device)
    return ((scale_bits(s)[..., None] >> shifts) & 0xFF).to(torch.uint8)


def _as_bytes(cache: torch.Tensor) -> torch.Tensor:
    return cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)


def written_slots(plan: PTHPlan) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """(the tokens that write, the index of their slots in a cache's leading dims: (slot,) or (page, offset)).
    Negative and out-of-range slots write nothing."""
    loc = plan.cache_loc.to(torch.int64)
    tokens = ((loc >= 0) & (loc < plan.num_slots)).nonzero().flatten()
    slots = loc[tokens]
    return tokens, (slots,) if plan.k_cache.dim() == 3 else (slots // plan.page_size, slots % plan.page_size)


def write_per_token_head(plan: PTHPlan, quantize: Callable[..., tuple[torch.Tensor, torch.Tensor]] = quantize_heads,
                         ) -> None:
    """The specification: quantize each written token's heads and store bytes and scales at slot
    cache_loc[t]. Negative and out-of-range slots write nothing (nor their scales)."""
    tokens, index = written_slots(plan)
    if tokens.numel() == 0:
        return
    data, s = quantize(torch.stack((plan.k, plan.v))[:, tokens], plan.recipe)
    for i, (cache, sc) in enumerate(((plan.k_cache, plan.k_scale_cache), (plan.v_cache, plan.v_scale_cache))):
        if plan.inline:
            _as_bytes(cache)[index] = torch.cat((data[i], scale_bytes(s[i])), dim=-1)
        else:
            _as_bytes(cache)[index] = data[i]
            sc.view(torch.int32)[index] = scale_bits(s[i]).to(torch.int32)  # bits: a NaN's too


def naive_per_token_head(k: object, v: object, k_cache: object, v_cache: object, cache_loc: object,
                         k_scale: object = None, v_scale: object = None, page_size: object = 16, *,
                         per_token_head: object = True, recipe: object = DEFAULT_RECIPE, checked: object = False,
                         k_scale_cache: object = None, v_scale_cache: object = None,
                         cache_dtype: object = None) -> None:
    """The reference per-token-head write (what `naive_fp8_set_kv_buffer(per_token_head=...)` runs)."""
    plan = make_pth_plan(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
                         per_token_head=per_token_head, recipe=recipe, checked=checked,
                         k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache, cache_dtype=cache_dtype)
    if plan.num_tokens:
        write_per_token_head(plan)

