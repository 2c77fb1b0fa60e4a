"""Cached strategy constructors: building and validating a fresh strategy on every draw costs more
than the draw itself, and these are called once or more per Case."""

from __future__ import annotations

from functools import lru_cache

from hypothesis import strategies as st


@lru_cache(maxsize=8192)
def ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


@lru_cache(maxsize=1024)
def sampled(options: tuple) -> st.SearchStrategy:
    return st.sampled_from(options)
