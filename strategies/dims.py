"""Sizes: tokens, heads, head dim, page size and the number of pages.

`size="small"` keeps every case cheap under Triton's interpreter (each program instance costs tens
of milliseconds on the CPU); `size="large"` is for CUDA, where big shapes cost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from hypothesis import event
from hypothesis import strategies as st

from strategies._cache import ints, sampled

Size = Literal["small", "large"]

#: Head dims of real models; the rest of the draws are odd sizes that exercise the masks.
COMMON_HEAD_DIMS = (64, 80, 96, 128, 192, 256)
ODD_HEAD_DIMS = (1, 2, 3, 5, 7, 8, 15, 17, 31, 33, 48, 72, 100, 129, 160, 255)
COMMON_PAGE_SIZES = (1, 16, 32, 64)
ODD_PAGE_SIZES = (2, 3, 5, 7, 13, 17, 24, 48)

LIMITS = {  # (max tokens, max heads, max head dim, max spare pages)
    "small": (16, 6, 256, 3),
    "large": (512, 32, 512, 8),
}


@dataclass(frozen=True)
class Dims:
    """The sizes of one call; num_pages * page_size >= num_tokens, so every token can get a slot."""

    num_tokens: int
    num_heads: int
    head_dim: int
    page_size: int
    num_pages: int


@st.composite
def num_tokens(draw: st.DrawFn, max_tokens: int) -> int:
    """T from 0 upwards: an empty batch about one time in 16, else mostly small (decode-like),
    sometimes up to max_tokens."""
    if max_tokens == 0 or draw(ints(0, 15), label="empty_batch") == 15:
        return 0
    return draw(st.one_of(ints(1, min(4, max_tokens)), ints(1, max_tokens)), label="tokens")


def num_heads(max_heads: int, min_heads: int = 1) -> st.SearchStrategy[int]:
    """H from min_heads, mostly small: each head block is an interpreter program on the CPU."""
    return st.one_of(ints(min_heads, max(min_heads, min(2, max_heads))), ints(min_heads, max_heads))


def head_dims(max_dim: int) -> st.SearchStrategy[int]:
    """D from 1, weighted towards real models' head dims, with odd sizes mixed in."""
    common = tuple(d for d in COMMON_HEAD_DIMS if d <= max_dim) or (max_dim,)
    odd = tuple(d for d in ODD_HEAD_DIMS if d <= max_dim) or (1,)
    return st.one_of(sampled(common), sampled(common), sampled(odd),
                     ints(1, max_dim))


def page_sizes() -> st.SearchStrategy[int]:
    """1 (a flat slot cache), the usual 16/32/64, and odd sizes that no power-of-two trick fits."""
    return st.one_of(sampled(COMMON_PAGE_SIZES), sampled(ODD_PAGE_SIZES))


@lru_cache(maxsize=64)
@st.composite
def dims(draw: st.DrawFn, *, size: Size = "small", max_tokens: int | None = None,
         max_heads: int | None = None, max_dim: int | None = None, min_heads: int = 1) -> Dims:
    """Sizes of one call: enough pages for every token, plus a few spare ones (capped by size, so
    that a CPU cache stays a few pages long); one time in eight T is set to H (a flag that shrinks off).
    """
    lim_t, lim_h, lim_d, spare = LIMITS[size]
    max_t = lim_t if max_tokens is None else max_tokens
    t = draw(num_tokens(max_t), label="num_tokens")
    h = draw(num_heads(lim_h if max_heads is None else max_heads, min_heads), label="num_heads")
    if t > 0 and 2 <= h <= max_t and draw(ints(0, 7), label="tokens_equal_heads") == 7:
        # One time in eight, T = H: code that tells the axes apart by their lengths (a scale put on "the
        # axis of length H", a layout guessed from a shape) goes wrong only then. Off when shrunk.
        t = h
        event("dims: T == H")
    d = draw(head_dims(lim_d if max_dim is None else max_dim), label="head_dim")
    ps = draw(page_sizes(), label="page_size")
    needed = -(-max(t, 1) // ps)
    pages = needed + draw(ints(0, spare), label="spare_pages")
    event(f"dims: T={'0' if t == 0 else '1' if t == 1 else '>1'}")
    event(f"dims: page_size {'odd' if ps not in COMMON_PAGE_SIZES else ps}")
    event(f"dims: head_dim {'common' if d in COMMON_HEAD_DIMS else 'odd'}")
    return Dims(t, h, d, ps, pages)
