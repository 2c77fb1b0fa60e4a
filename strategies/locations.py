"""cache_loc: which slot each token writes.

Slots are unique (which token wins a shared slot is unspecified, so a bit-exact property cannot
hold there) and come in the shapes servers produce: a run of consecutive slots (prefill, crossing
page boundaries), one slot per page, or slots spread anywhere; sorted or shuffled; often touching
the first and last slot and both sides of a page boundary. On top: padding entries (-1, sometimes
other negatives; between a run's slots, or holding a place in it) and, only when asked, out-of-range entries
(>= num_slots) that must write nothing.
"""

from __future__ import annotations

from functools import cache, lru_cache

from hypothesis import event
from hypothesis import strategies as st

from strategies._cache import ints, sampled

PATTERNS = ("run", "per-page", "spread")
INT_MIN = {"int32": -2**31, "int64": -2**63}
INT_MAX = {"int32": 2**31 - 1, "int64": 2**63 - 1}


def _special_slots(num_slots: int, page_size: int) -> tuple[int, ...]:
    """The first and last slot and both sides of every page boundary."""
    specials = {0, num_slots - 1}
    for boundary in range(page_size, num_slots, page_size):
        specials |= {boundary - 1, boundary}
    return tuple(sorted(specials))


@lru_cache(maxsize=4096)
def _spread(n: int, num_slots: int, page_size: int) -> st.SearchStrategy[list[int]]:
    """n distinct slots anywhere, often the special ones."""
    near = sampled(_special_slots(num_slots, page_size))
    return st.lists(st.one_of(near, ints(0, num_slots - 1)), min_size=n, max_size=n, unique=True)


@lru_cache(maxsize=4096)
def _token_subsets(num_tokens: int, max_size: int) -> st.SearchStrategy[list[int]]:
    return st.lists(ints(0, num_tokens - 1), min_size=1, max_size=max_size, unique=True)


@st.composite
def _slots(draw: st.DrawFn, n: int, num_slots: int, page_size: int) -> list[int]:
    """n distinct slots in [0, num_slots), in one of the PATTERNS (sorted)."""
    pattern = draw(sampled(PATTERNS), label="slot_pattern")
    pages = num_slots // page_size
    if pattern == "per-page" and 1 < n <= pages:
        offset = draw(ints(0, page_size - 1), label="offset_in_page")
        first = draw(ints(0, pages - n), label="first_page")
        event("loc: one slot per page")
        return [(first + i) * page_size + offset for i in range(n)]
    if pattern == "spread" and 2 * n <= num_slots:
        picked = draw(_spread(n, num_slots, page_size), label="spread_slots")
        event("loc: spread")
        return sorted(picked)
    start = draw(ints(0, num_slots - n), label="run_start")  # also the fallback
    event("loc: run")
    return list(range(start, start + n))


@cache
def _negatives(loc_dtype: str) -> st.SearchStrategy[int]:
    """-1 mostly (the usual padding value), sometimes other negatives down to the dtype's minimum."""
    return st.one_of(st.just(-1), st.just(-1), sampled((-2, -7, -1000, INT_MIN[loc_dtype])))


@lru_cache(maxsize=4096)
def _out_of_range(num_slots: int, page_size: int, loc_dtype: str) -> st.SearchStrategy[int]:
    """Entries past the cache: just past the end, a page past it, or the dtype's maximum."""
    return sampled((num_slots, num_slots + 1, num_slots + page_size, INT_MAX[loc_dtype]))


@lru_cache(maxsize=4096)
@st.composite
def cache_locs(draw: st.DrawFn, num_tokens: int, num_slots: int, page_size: int, loc_dtype: str = "int64",
               *, padding: bool = True, allow_out_of_range: bool = False) -> tuple[int, ...]:
    """cache_loc entries for num_tokens tokens: unique slots, padding, out-of-range entries if asked.

    Needs num_slots >= num_tokens. Padded and out-of-range tokens keep their positions in the batch,
    anywhere (first, last, between real tokens), as in a padded batch; with padding, the real tokens' slots
    are sometimes one run over the whole batch with the padded tokens' slots left out ((4, -1, 6)).
    Shrinks to no padding, no out-of-range entries, a run in batch order.
    """
    if num_slots < num_tokens:
        raise ValueError(f"cache_locs needs num_slots >= num_tokens, got {num_slots} < {num_tokens}")
    if num_tokens == 0:
        return ()
    kinds = ["slot"] * num_tokens
    if padding and draw(ints(0, 3), label="padded_batch") == 3:
        pads = draw(_token_subsets(num_tokens, num_tokens), label="padded_tokens")
        for t in pads:
            kinds[t] = "pad"
    if allow_out_of_range and draw(ints(0, 2), label="out_of_range_batch") == 2:
        bad = draw(_token_subsets(num_tokens, max(1, num_tokens // 2)), label="out_of_range_tokens")
        for t in bad:
            kinds[t] = "oob"
    n_real = kinds.count("slot")
    if "pad" in kinds and n_real and draw(st.booleans(), label="run_with_holes"):
        # One run over the whole batch, each padded token's slot left out (a request's slots kept, a dropped
        # token's not written): (4, -1, 6). A kernel that takes the batch for one run from its endpoints
        # writes the padded token to slot 5.
        start = draw(ints(0, num_slots - num_tokens), label="run_start")
        slots = [start + t for t, kind in enumerate(kinds) if kind == "slot"]
        event("loc: run with holes")
    else:
        slots = draw(_slots(n_real, num_slots, page_size), label="slots") if n_real else []
    if n_real > 1 and draw(st.booleans(), label="shuffle"):
        slots = list(draw(st.permutations(slots), label="slot_order"))
        event("loc: shuffled")
    it, taken = iter(slots), set(slots)
    out = []
    for kind in kinds:
        if kind == "slot":
            out.append(next(it))
        elif kind == "pad":
            out.append(draw(_negatives(loc_dtype), label="padding_value"))
        else:
            out.append(draw(_out_of_range(num_slots, page_size, loc_dtype), label="out_of_range_value"))
    for name, hit in (("padding", "pad" in kinds), ("out-of-range", "oob" in kinds),
                      ("first slot", 0 in slots), ("last slot", num_slots - 1 in slots),
                      ("page boundary", any(s % page_size == 0 and s - 1 in taken for s in slots))):
        if hit:
            event(f"loc: {name}")
    return tuple(out)


def padded_rows() -> st.SearchStrategy[int]:
    """Rows of K and V past cache_loc's last entry (Case.padded_rows: vLLM's CUDA-graph padding, vllm#13922), 1 to
    8; shrinks toward 1."""
    return st.integers(1, 8)
