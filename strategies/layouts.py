"""Layouts: the strided views a kernel meets in a server, drawn as `Layout` values.

A Layout (strategies/case.py) places a logical tensor in a bigger buffer: a storage order, padding
per dim (`extra`), an innermost step and a start offset. The kinds drawn here, each tagged:
- "permuted": another storage order, e.g. a head-major input [H, T, D] or an HND cache [P, H, ps, D];
- "padded": spare elements after some dims (padded rows, padded head dims, a pool of pages);
- "fused-qkv" (inputs) / "head-slice" (caches): the view is a slice of a bigger head range, as K is
  a slice of a fused QKV projection;
- "kv-interleaved" (caches): K and V pages alternate in one buffer; this view is one of the halves;
- "per-layer" (caches) / "row-offset" (inputs): the view starts after other layers or rows;
- "inner-step": the innermost stored dim moves more than one element at a time;
- "misaligned": the start offset is not a multiple of 16 elements (no 16-byte vector access).
K and V (and their caches) are drawn independently. Merged dims (a [T, H*D] input, an [S, H, D]
cache) must stay adjacent in storage with no padding between them; `build` raises otherwise.
"""

from __future__ import annotations

from functools import cache, lru_cache

from hypothesis import event
from hypothesis import strategies as st

from strategies._cache import ints, sampled
from strategies.case import CACHE_DIMS, INPUT_DIMS, Layout

INPUT_KINDS = ("contiguous", "permuted", "padded", "fused-qkv", "row-offset", "inner-step", "misaligned")
CACHE_KINDS = ("contiguous", "permuted", "hnd", "padded", "head-slice", "kv-interleaved", "per-layer",
               "inner-step", "misaligned")
HEAD = {"input": 1, "cache": 2}


@cache
def _rarely(p_in_4: int = 1) -> st.SearchStrategy[bool]:
    """True about p_in_4 times in 4; shrinks to False (the plain layout)."""
    return ints(0, 3).map(lambda i: i >= 4 - p_in_4)


_NON_CONTIGUOUS = ints(0, 9).map(lambda i: i >= 3)  # 7 in 10


@cache
def _orders(n: int, merged: tuple[int, int] | None, role: str) -> st.SearchStrategy[tuple[int, ...]]:
    """Storage orders that keep a merged (outer, inner) pair adjacent, outer first."""
    units = [(d,) for d in range(n) if merged is None or d not in merged]
    if merged is not None:
        units.insert(merged[0], merged)
    permuted = st.permutations(units).map(lambda us: tuple(d for u in us for d in u))
    named = [(1, 0, 2)] if role == "input" else [(0, 2, 1, 3), (2, 0, 1, 3)]
    named = [o for o in named if merged is None or _adjacent(o, merged)]
    return st.one_of(sampled(tuple(named)), permuted) if named else permuted


def _adjacent(order: tuple[int, ...], merged: tuple[int, int]) -> bool:
    i = order.index(merged[0])
    return i + 1 < len(order) and order[i + 1] == merged[1]


@st.composite
def tagged_layouts(draw: st.DrawFn, shape: tuple[int, ...], *, role: str, merged: tuple[int, int] | None,
                   contiguous: bool = False) -> tuple[Layout, frozenset[str]]:
    """A Layout for a logical tensor of `shape`, with the set of kinds it was drawn as.

    role is "input" ([T, H, D]) or "cache" ([P, ps, H, D]); merged is the (outer, inner) dim pair
    that the call views as one dim, or None.
    """
    n = len(shape)
    identity = tuple(range(n))
    if contiguous or not draw(_NON_CONTIGUOUS, label="non_contiguous"):
        return Layout.contiguous(n), frozenset({"contiguous"})
    kinds: set[str] = set()
    order = identity
    if draw(_rarely(2), label="permute"):
        order = draw(_orders(n, merged, role), label="order")
        kinds |= {"permuted"} if order != identity else set()
        kinds |= {"hnd"} if order == (0, 2, 1, 3) else set()
    no_pad = {merged[1]} if merged else set()
    extra = [0] * n
    if draw(_rarely(), label="pad"):
        for dim in range(n):
            if dim not in no_pad:
                extra[dim] = draw(sampled((0, 0, 1, 2, 3, 16)), label=f"extra_{dim}")
        kinds |= {"padded"} if any(extra) else set()
    # A slice of a bigger head range: K out of a fused QKV buffer, or one TP rank's cache heads.
    head = HEAD[role]
    slice_extra = 0
    if head not in no_pad and draw(_rarely(), label="head_slice"):
        slice_extra = draw(ints(1, 2 * max(shape[head], 1)), label="extra_heads")
        extra[head] += slice_extra
        kinds.add("fused-qkv" if role == "input" else "head-slice")
    # K/V-interleaved pages: the unit just inside the outermost one has room for the other half.
    interleave = None
    if role == "cache" and draw(_rarely(), label="kv_interleaved"):
        outer_unit = 2 if merged and order[0] == merged[0] else 1
        if outer_unit < n:
            interleave = order[outer_unit]
            extra[interleave] += shape[interleave]
            kinds.add("kv-interleaved")
    step = 1
    if draw(_rarely(), label="inner_step"):
        step = draw(ints(2, 3), label="step")
        kinds.add("inner-step")
    base = Layout(order, tuple(extra), step, 0)
    strides = base.strides(shape)
    offset = 0
    if slice_extra:
        offset += draw(ints(0, slice_extra), label="first_head") * strides[head]
    if interleave is not None:
        offset += draw(ints(0, 1), label="kv_half") * shape[interleave] * strides[interleave]
    if draw(_rarely(), label="layer_offset"):
        offset += draw(ints(1, 3), label="layer") * base.span(shape)
        kinds.add("per-layer" if role == "cache" else "row-offset")
    if draw(_rarely(), label="misalign"):
        offset += draw(ints(1, 15), label="misalignment")
        kinds.add("misaligned")
    layout = Layout(order, tuple(extra), step, offset)
    return layout, frozenset(kinds or {"contiguous"})  # no kind drawn: every choice was the plain one


@lru_cache(maxsize=4096)
def input_layouts(shape: tuple[int, int, int], rank: int, name: str = "k",
                  contiguous: bool = False) -> st.SearchStrategy[Layout]:
    """A Layout for a [T, H, D] input; rank 2 ([T, H*D]) keeps head just outside dim, unpadded."""
    merged = (1, 2) if rank == 2 else None
    return tagged_layouts(shape, role="input", merged=merged, contiguous=contiguous).map(
        lambda t: _emit(name, t))


@lru_cache(maxsize=4096)
def cache_layouts(shape: tuple[int, int, int, int], rank: int, name: str = "k_cache",
                  contiguous: bool = False) -> st.SearchStrategy[Layout]:
    """A Layout for a [P, ps, H, D] cache; rank 3 ([S, H, D]) keeps page just outside offset, unpadded."""
    merged = (0, 1) if rank == 3 else None
    return tagged_layouts(shape, role="cache", merged=merged, contiguous=contiguous).map(
        lambda t: _emit(name, t))


def _emit(name: str, tagged: tuple[Layout, frozenset[str]]) -> Layout:
    for kind in sorted(tagged[1]):
        event(f"layout: {name} {kind}")
    return tagged[0]


@cache
def loc_steps(contiguous: bool = False) -> st.SearchStrategy[int]:
    """cache_loc's element stride: 1 mostly, 2 or 3 for a strided view (e.g. a column of a table)."""
    if contiguous:
        return st.just(1)
    return sampled((1, 1, 2, 3))


__all__ = ["CACHE_DIMS", "CACHE_KINDS", "INPUT_DIMS", "INPUT_KINDS", "cache_layouts", "input_layouts",
           "loc_steps", "tagged_layouts"]


@st.composite
def strided_layouts(draw: st.DrawFn, rank: int, label: str, gaps: bool = False) -> Layout:
    """A padded, permuted, offset, stepped layout (never the contiguous one), any rank.

    With gaps=True there are always unused elements inside the span (a step or some padding).
    """
    order = tuple(draw(st.permutations(range(rank)), label=f"{label}.order"))
    extra = tuple(draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank), label=f"{label}.extra"))
    step = draw(st.integers(1, 3), label=f"{label}.step")
    offset = draw(st.integers(0, 7), label=f"{label}.offset")
    if step == 1 and not any(extra) and (gaps or order == tuple(range(rank))):
        step = 2  # keep it strided: the contiguous layout is the other side of the comparison
    return Layout(order, extra, step, offset)
