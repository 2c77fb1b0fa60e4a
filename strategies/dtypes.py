"""Dtypes and ranks: input bf16/fp16 (fp32 sometimes), cache fp8/uint8, cache_loc int32/int64,
inputs [T, H, D] or [T, H*D], caches [P, page_size, H, D] or [S, H, D].

The cache's format (e4m3, e5m2) is drawn only when asked (`cache_formats`): the default draws e4m3
and nothing else, exactly as before e5m2 existed, so no other family's examples change."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from hypothesis import event
from hypothesis import strategies as st

from strategies._cache import sampled
from strategies.case import CACHE_FORMATS, FP8_CACHE_DTYPES, INPUT_DTYPES, LOC_DTYPES

INPUT_RANKS = (3, 2)
CACHE_RANKS = (4, 3)


@dataclass(frozen=True)
class Dtypes:
    """The dtype and rank choices of one call (separate Case fields, so each can be replaced)."""

    input_dtype: str
    cache_dtype: str
    loc_dtype: str
    input_rank: int
    cache_rank: int
    cache_format: str = "fp8_e4m3"


def _choice(allowed: Sequence, default: Sequence, name: str) -> st.SearchStrategy:
    options = tuple(default if allowed is None else allowed)
    bad = [o for o in options if o not in default]
    if not options or bad:
        raise ValueError(f"{name} must be a non-empty subset of {default}, got {allowed!r}")
    return sampled(options)


def input_dtypes(allowed: Sequence[str] | None = None) -> st.SearchStrategy[str]:
    """bfloat16 and float16 mostly, float32 sometimes (the first option is where shrinking goes)."""
    if allowed is None:
        return sampled(("bfloat16", "float16", "bfloat16", "float16", "float32"))
    return _choice(allowed, INPUT_DTYPES, "input_dtypes")


def _format(draw: st.DrawFn, formats: tuple[str, ...]) -> str:
    bad = [f for f in formats if f not in CACHE_FORMATS]
    if not formats or bad:
        raise ValueError(f"cache_formats must be a non-empty subset of {CACHE_FORMATS}, got {formats!r}")
    return formats[0] if len(formats) == 1 else draw(sampled(formats), label="cache_format")


@lru_cache(maxsize=64)
@st.composite
def dtypes(draw: st.DrawFn, *, input_dtypes_: Sequence[str] | None = None,
           cache_dtypes: Sequence[str] | None = None, loc_dtypes: Sequence[str] | None = None,
           input_ranks: Sequence[int] | None = None, cache_ranks: Sequence[int] | None = None,
           cache_formats: Sequence[str] = ("fp8_e4m3",)) -> Dtypes:
    """Every dtype and rank choice, each drawn independently from its (optionally restricted) set.

    cache_formats: the formats to draw (first the format, then the cache dtype: its float8 dtype or
    uint8); a single format draws nothing for it."""
    fmt = _format(draw, tuple(cache_formats))
    own = (FP8_CACHE_DTYPES[fmt], "uint8")
    # A float8 dtype in cache_dtypes means "float8 storage": the drawn format's own dtype.
    allowed = None if cache_dtypes is None else [own[0] if d in FP8_CACHE_DTYPES.values() else d
                                                 for d in cache_dtypes]
    chosen = Dtypes(
        input_dtype=draw(input_dtypes(input_dtypes_), label="input_dtype"),
        cache_dtype=draw(_choice(allowed, own, "cache_dtypes"), label="cache_dtype"),
        loc_dtype=draw(_choice(loc_dtypes, LOC_DTYPES, "loc_dtypes"), label="loc_dtype"),
        input_rank=draw(_choice(input_ranks, INPUT_RANKS, "input_ranks"), label="input_rank"),
        cache_rank=draw(_choice(cache_ranks, CACHE_RANKS, "cache_ranks"), label="cache_rank"),
        cache_format=fmt,
    )
    for field, value in vars(chosen).items():
        if field != "cache_format" or len(cache_formats) > 1:
            event(f"dtypes: {field}={value}")
    return chosen
