"""The composite strategy: a whole Case, every input dimension drawn with its dependencies.

Draw order (which is also the shrink order): sizes, dtypes and ranks, layouts, scales, recipe,
cache locations, seed, overrides. Each dimension is its own module; the knobs here restrict them
for properties that need a narrower space (e.g. contiguous=True, fixed dtypes, scale kinds).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from strategies._cache import ints, sampled
from strategies.case import Case, Scale
from strategies.dims import LIMITS, Size, dims
from strategies.dtypes import dtypes
from strategies.layouts import cache_layouts, input_layouts, loc_steps
from strategies.locations import cache_locs
from strategies.scales import TIE_DTYPES, scales
from strategies.values import overrides as override_lists


def cases(
    *,
    max_tokens: int | None = None,
    max_heads: int | None = None,
    max_dim: int | None = None,
    recipes: Sequence[str] | None = None,
    allow_out_of_range: bool = False,
    size: Size = "small",
    contiguous: bool = False,
    input_dtypes: Sequence[str] | None = None,
    cache_dtypes: Sequence[str] | None = None,
    loc_dtypes: Sequence[str] | None = None,
    input_ranks: Sequence[int] | None = None,
    cache_ranks: Sequence[int] | None = None,
    scale_kinds: Sequence[str] | None = None,
    padding: bool = True,
    max_overrides: int = 6,
    checked: bool | None = None,
    min_heads: int = 1,
    cache_formats: Sequence[str] = ("fp8_e4m3",),
) -> st.SearchStrategy[Case]:
    """A valid Case: any implementation must match the reference on it byte for byte.

    size: "small" (CPU interpreter: T <= 16, H <= 6, D <= 256, a few pages) or "large" (CUDA).
    max_tokens / max_heads / max_dim override the size's limits.
    recipes: the recipe names to draw from (default: every recipe in kernel.RECIPES).
    allow_out_of_range: also draw cache_loc entries >= num_slots (then checked is False).
    contiguous: every layout contiguous and cache_loc unit-stride.
    input_dtypes, cache_dtypes, loc_dtypes, input_ranks, cache_ranks, scale_kinds: restrict those
    choices (default: all). padding: draw negative (padding) cache_loc entries.
    max_overrides: at most this many special values (0: seeded contents only).
    checked: fix Case.checked (default: drawn, True about one time in four when allowed).
    min_heads: at least this many heads (per-head scales need two); H shrinks toward it.
    cache_formats: the caches' formats to draw ("fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz"; default e4m3 alone, which draws
    exactly what was drawn before e5m2 existed). An e5m2 Case's special values aim at e5m2's edges.
    """
    from kernel import RECIPES  # imported here so that importing the strategies stays light

    _check_arguments(recipes, RECIPES, allow_out_of_range, checked, size, max_overrides,
                     (max_tokens, max_heads, max_dim))
    heads_limit = LIMITS[size][1] if max_heads is None else max_heads
    if isinstance(min_heads, bool) or not isinstance(min_heads, int) or not 1 <= min_heads <= heads_limit:
        raise InvalidArgument(f"cases(min_heads={min_heads!r}): an int from 1 to the most heads ({heads_limit})")
    tup = lambda xs: None if xs is None else tuple(xs)  # hashable, for the cached strategies
    return _cases(max_tokens, max_heads, max_dim, tuple(recipes) if recipes else tuple(RECIPES),
                  allow_out_of_range, size, contiguous, tup(input_dtypes), tup(cache_dtypes), tup(loc_dtypes),
                  tup(input_ranks), tup(cache_ranks), tup(scale_kinds), padding, max_overrides, checked,
                  min_heads, tuple(cache_formats))


def _check_arguments(recipes: Sequence[str] | None, known: object, allow_out_of_range: bool, checked: bool | None,
                     size: str, max_overrides: int, limits: tuple[int | None, ...]) -> None:
    """Reject contradictory or unknown arguments when the strategy is built, as Hypothesis's own do."""
    if checked and allow_out_of_range:
        raise InvalidArgument("cases(checked=True, allow_out_of_range=True): a checked call raises on an "
                              "out-of-range slot, so such a Case is not valid; pass one or the other")
    unknown = [r for r in recipes or () if r not in known]
    if unknown:
        raise InvalidArgument(f"cases(recipes=...): unknown recipes {unknown}; known: {sorted(known)}")
    if recipes is not None and not recipes:
        raise InvalidArgument("cases(recipes=()): give at least one recipe, or None for every recipe")
    if size not in ("small", "large"):
        raise InvalidArgument(f"cases(size={size!r}): must be 'small' or 'large'")
    if max_overrides < 0 or any(n is not None and n < 0 for n in limits):
        raise InvalidArgument(f"cases(): max_overrides={max_overrides} and max_tokens/max_heads/max_dim={limits} "
                              "must be >= 0")


@lru_cache(maxsize=64)
def _rounds_scale(recipes: tuple[str, ...]) -> tuple[bool, bool]:
    """Whether some, and whether every, recipe of `recipes` rounds the scale to the input dtype."""
    from kernel.recipe import get_recipe

    rounds = [get_recipe(r).scale_dtype == "input" for r in recipes]
    return any(rounds), all(rounds)


@lru_cache(maxsize=256)
@st.composite
def _cases(draw: st.DrawFn, max_tokens: int | None, max_heads: int | None, max_dim: int | None,
           recipes: tuple[str, ...], allow_out_of_range: bool, size: Size, contiguous: bool,
           input_dtypes: tuple[str, ...] | None, cache_dtypes: tuple[str, ...] | None,
           loc_dtypes: tuple[str, ...] | None, input_ranks: tuple[int, ...] | None,
           cache_ranks: tuple[int, ...] | None, scale_kinds: tuple[str, ...] | None, padding: bool,
           max_overrides: int, checked: bool | None, min_heads: int = 1,
           cache_formats: tuple[str, ...] = ("fp8_e4m3",)) -> Case:
    n = draw(dims(size=size, max_tokens=max_tokens, max_heads=max_heads, max_dim=max_dim, min_heads=min_heads),
             label="dims")
    dt = draw(dtypes(input_dtypes_=input_dtypes, cache_dtypes=cache_dtypes, loc_dtypes=loc_dtypes,
                     input_ranks=input_ranks, cache_ranks=cache_ranks, cache_formats=cache_formats), label="dtypes")
    in_shape = (n.num_tokens, n.num_heads, n.head_dim)
    cache_shape = (n.num_pages, n.page_size, n.num_heads, n.head_dim)
    k_layout = draw(input_layouts(in_shape, dt.input_rank, "k", contiguous), label="k_layout")
    v_layout = draw(input_layouts(in_shape, dt.input_rank, "v", contiguous), label="v_layout")
    kc_layout = draw(cache_layouts(cache_shape, dt.cache_rank, "k_cache", contiguous), label="k_cache_layout")
    vc_layout = draw(cache_layouts(cache_shape, dt.cache_rank, "v_cache", contiguous), label="v_cache_layout")
    loc_step = draw(loc_steps(contiguous), label="loc_step")
    # The scale is drawn before the recipe (the shrink order): it may meet a bf16/fp16 tie whenever a
    # recipe it can go to rounds the scale to the input dtype.
    some, every = _rounds_scale(recipes)
    rounded_to = dt.input_dtype if dt.input_dtype in TIE_DTYPES and some else None
    k_scale = draw(scales("k_scale", scale_kinds, rounded_to, every and rounded_to is not None), label="k_scale")
    v_scale = draw(scales("v_scale", scale_kinds, rounded_to, every and rounded_to is not None), label="v_scale")
    recipe = draw(sampled(recipes), label="recipe")
    num_slots = n.num_pages * n.page_size
    loc = draw(cache_locs(n.num_tokens, num_slots, n.page_size, dt.loc_dtype, padding=padding,
                          allow_out_of_range=allow_out_of_range), label="cache_loc")
    out_of_range = any(s >= num_slots for s in loc)
    if checked is None:
        checked = not out_of_range and draw(ints(0, 3), label="checked") == 3
    seed = draw(st.integers(0, 2**32 - 1), label="seed")
    extra = draw(override_lists(n.num_tokens, n.num_heads, n.head_dim, dt.input_dtype, k_scale, v_scale,
                                recipe, max_overrides, dt.cache_format), label="overrides")
    event(f"case: recipe {recipe}")
    layouts = (k_layout, v_layout, kc_layout, vc_layout)
    event("case: " + ("all contiguous" if all(lay.is_contiguous() for lay in layouts) and loc_step == 1
                      else "non-contiguous"))
    return Case(
        num_tokens=n.num_tokens, num_heads=n.num_heads, head_dim=n.head_dim, page_size=n.page_size,
        num_pages=n.num_pages, cache_loc=loc, input_dtype=dt.input_dtype, cache_dtype=dt.cache_dtype,
        loc_dtype=dt.loc_dtype, input_rank=dt.input_rank, cache_rank=dt.cache_rank,
        k_layout=k_layout, v_layout=v_layout, k_cache_layout=kc_layout, v_cache_layout=vc_layout,
        loc_step=loc_step, k_scale=k_scale, v_scale=v_scale, seed=seed, overrides=extra, recipe=recipe,
        checked=checked, cache_format=dt.cache_format,
    )


@st.composite
def small_cases(draw: st.DrawFn) -> Case:
    """A small valid Case for argument checks (validation does not depend on size): 1..4 tokens in
    distinct in-range slots, 4-D caches, a float K scale and a 1-element V scale. Shrinks to one token."""
    t = draw(st.integers(1, 4), label="num_tokens")
    ps = draw(st.sampled_from((1, 4)), label="page_size")
    pages = -(-t // ps) + 1
    locs = draw(st.lists(st.integers(0, pages * ps - 1), min_size=t, max_size=t, unique=True), label="cache_loc")
    return Case(num_tokens=t, num_heads=draw(st.integers(1, 3), label="num_heads"),
                head_dim=draw(st.sampled_from((4, 16)), label="head_dim"), page_size=ps, num_pages=pages,
                cache_loc=tuple(locs), input_dtype=draw(st.sampled_from(("bfloat16", "float16")), label="dtype"),
                k_scale=Scale("float", 0.5), v_scale=Scale("tensor1", 2.0),
                seed=draw(st.integers(0, 2**16), label="seed"))
