"""kernel/overlap.py against brute force, and strategies/overlap.py against its own promises.

(Not named test_overlap.py: pytest imports test files by basename here, and conformance/test_overlap.py
has that one.)

`shares_memory` decides from strides and sizes whether two views share a byte; here every byte of both
views is enumerated instead (tiny views, so the sets are small) and the two answers must agree, on
Hypothesis-drawn `as_strided` views (element sizes 1, 2 and 4, zero strides, empty dims, any bases) and
on the layouts real pools use. The strategies that the conformance properties rely on are checked the
same way: an overlapping placement shares a byte (exactly one at the extents' ends), a drawn sharing
leaves every cache byte-disjoint from everything else, and the values survive the move.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel import naive_fp8_set_kv_buffer, overlap
from kernel.overlap import Layout, shares_memory
from strategies import cases
from strategies.build import build
from strategies.case import Case, Scale
from strategies.cases import small_cases
from strategies.overlap import (
    INPUT_SHARING,
    PLACEMENT_KINDS,
    POOL_KINDS,
    Arena,
    Pool,
    Sharing,
    build_shared,
    extent,
    overlapping_pair,
    placements,
    pools,
    sharings,
    storage_bytes,
)

INNER = dict(database=None, derandomize=True, deadline=None,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
DTYPES = {1: torch.uint8, 2: torch.bfloat16, 4: torch.float32}


def byte_set(shape: tuple[int, ...], stride: tuple[int, ...], element_size: int, base: int) -> set[int]:
    """Every byte address a strided view covers, by enumerating its elements (the brute force)."""
    if 0 in shape:
        return set()
    offsets = torch.zeros(shape, dtype=torch.int64)
    for d, (n, s) in enumerate(zip(shape, stride)):
        offsets = offsets + (torch.arange(n, dtype=torch.int64) * s).reshape([-1 if i == d else 1
                                                                               for i in range(len(shape))])
    return {base + o * element_size + e for o in offsets.flatten().tolist() for e in range(element_size)}


def tensor_bytes(t: torch.Tensor) -> set[int]:
    return byte_set(tuple(t.shape), t.stride(), t.element_size(), t.data_ptr())


def as_bytes(x: torch.Tensor) -> torch.Tensor:
    """A tensor's values as raw bytes (NaN-safe, any layout)."""
    # A fresh flat copy: contiguous() keeps any stride of a size-1 dim, which view(uint8) refuses.
    return torch.empty(x.numel(), dtype=x.dtype, device=x.device).copy_(x.reshape(-1)).view(torch.uint8)


def decide(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The kernel's answer for two real tensors, as kernel/plan.py asks it."""
    return shares_memory(Layout.of(a), a.data_ptr(), Layout.of(b), b.data_ptr())


# -- shares_memory == brute force ----------------------------------------------------------------

@st.composite
def views(draw: st.DrawFn, label: str) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """(shape, stride, element size): 0 to 3 dims of size 0 to 4, strides 0 to 9 elements. Shrinks to a
    0-d uint8 view."""
    rank = draw(st.integers(0, 3), label=f"{label}.rank")
    size = st.integers(0, 12).map(lambda i: 1 + i % 4 if i else 0)  # 0 (an empty view) about 1 in 13
    shape = tuple(draw(st.lists(size, min_size=rank, max_size=rank), label=f"{label}.shape"))
    stride = tuple(draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank), label=f"{label}.stride"))
    return shape, stride, draw(st.sampled_from(sorted(DTYPES)), label=f"{label}.element_size")


def _meta(shape: tuple[int, ...], stride: tuple[int, ...], element_size: int) -> torch.Tensor:
    """A tensor of that layout without memory: Layout.of reads shape, strides and element size only."""
    return torch.empty_strided(shape, stride, dtype=DTYPES[element_size], device="meta")


def test_shares_memory_equals_the_brute_force_byte_sets():
    seen: Counter[str] = Counter()

    @settings(max_examples=1500, **INNER)
    @given(a=views("a"), b=views("b"), data=st.data())
    def check(a, b, data) -> None:
        span_a, span_b = (0 if 0 in v[0] else (sum(s * (n - 1) for n, s in zip(v[0], v[1])) + 1) * v[2]
                          for v in (a, b))
        base_a = 4096
        # b's base where the extents meet (3 in 4), else from just before a to just past it; then on its
        # own element boundary
        meeting = data.draw(st.integers(0, 3), label="meeting") > 0 and span_a and span_b
        lo, hi = (base_a - span_b + 1, base_a + span_a - 1) if meeting else (base_a - span_b - 2, base_a + span_a + 2)
        base_b = data.draw(st.integers(lo, hi), label="base_b")
        base_b -= base_b % b[2]
        truth = bool(byte_set(*a, base_a) & byte_set(*b, base_b))
        got = shares_memory(Layout.of(_meta(*a)), base_a, Layout.of(_meta(*b)), base_b)
        assert got == truth, f"a={a} at {base_a}, b={b} at {base_b}: shares_memory {got}, brute force {truth}"
        assert got == shares_memory(Layout.of(_meta(*b)), base_b, Layout.of(_meta(*a)), base_a), "not symmetric"
        meet = span_a and span_b and base_a < base_b + span_b and base_b < base_a + span_a
        seen["overlap" if truth else "extents meet, no byte shared" if meet else "extents apart"] += 1

    check()
    # The comparison means something only if all three answers come up often (the middle one is the
    # exact search's: interleaved or strided views whose extents meet).
    low = [k for k in ("overlap", "extents meet, no byte shared", "extents apart") if seen[k] < 75]
    assert not low, f"fewer than 75 of 1500 draws: {low}; counts {dict(seen)}"


def _pool(kind_order: tuple[int, ...], shape: tuple[int, int, int, int] = (3, 4, 2, 8)) -> tuple[torch.Tensor, ...]:
    pool = Pool(kind_order, (0,) * 5)
    buffer = torch.zeros(pool.span(shape) + 2, dtype=torch.uint8)  # a byte either side: room to move a half
    return pool.views(buffer, 1, shape, 4, torch.float8_e4m3fn)


# kv (4) after: nothing (split halves), page (0), offset (1), head (2), dim (3); and an HND pool
NAMED_POOLS = {"[2, P, ps, H, D]": (4, 0, 1, 2, 3), "[P, 2, ps, H, D]": (0, 4, 1, 2, 3),
               "[P, ps, 2, H, D]": (0, 1, 4, 2, 3), "[P, ps, H, 2, D]": (0, 1, 2, 4, 3),
               "[P, ps, H, D, 2]": (0, 1, 2, 3, 4), "[P, 2, H, ps, D]": (0, 4, 2, 1, 3)}


@pytest.mark.parametrize("order", list(NAMED_POOLS.values()), ids=list(NAMED_POOLS))
def test_interleaved_pool_halves_are_disjoint(order):
    k_cache, v_cache = _pool(order)
    assert not tensor_bytes(k_cache) & tensor_bytes(v_cache)  # the layout is what its name says
    assert not decide(k_cache, v_cache) and not decide(v_cache, k_cache)


@pytest.mark.parametrize("shift", [-1, 1])
@pytest.mark.parametrize("order", list(NAMED_POOLS.values()), ids=list(NAMED_POOLS))
def test_a_half_moved_by_one_byte_overlaps(order, shift):
    k_cache, v_cache = _pool(order)
    moved = v_cache.as_strided(v_cache.shape, v_cache.stride(), v_cache.storage_offset() + shift)
    # [2, P, ...] moved up by one byte is disjoint (V moves away from K); everything else meets K
    truth = bool(tensor_bytes(k_cache) & tensor_bytes(moved))
    assert truth or (order == NAMED_POOLS["[2, P, ps, H, D]"] and shift == 1)
    assert decide(k_cache, moved) == truth and decide(moved, k_cache) == truth


def test_one_shared_byte_inside_an_element_is_found():
    """A cache whose first byte is the top byte of k's last bf16 element: one byte in common."""
    buffer = torch.zeros(256, dtype=torch.uint8)
    k = buffer[:64].view(torch.bfloat16).view(4, 8)
    cache = buffer[63:63 + 32].view(torch.float8_e4m3fn).view(2, 16)
    assert len(tensor_bytes(k) & tensor_bytes(cache)) == 1
    assert decide(cache, k) and decide(k, cache)
    assert not decide(buffer[64:96].view(2, 16), k)  # one byte further: touching extents, nothing shared


@pytest.fixture
def search_limit_zero(monkeypatch):
    """SEARCH_LIMIT = 0: the first search node already gives up. _solvable is memoized, so its cache is
    emptied before (no earlier answer is reused) and after (no 'may overlap' leaks into other tests)."""
    overlap._solvable.cache_clear()
    monkeypatch.setattr(overlap, "SEARCH_LIMIT", 0)
    yield
    overlap._solvable.cache_clear()


def test_a_search_that_gives_up_reports_may_overlap(search_limit_zero):
    k_cache, v_cache = _pool(NAMED_POOLS["[P, 2, ps, H, D]"])
    assert not tensor_bytes(k_cache) & tensor_bytes(v_cache)
    assert decide(k_cache, v_cache), "a search past SEARCH_LIMIT must answer True (may overlap), never False"
    far = torch.zeros(64, dtype=torch.uint8)
    assert not decide(k_cache, far[:8]), "disjoint extents are decided before any search"


# -- strategies/overlap.py keeps its promises ----------------------------------------------------

@settings(max_examples=150, **INNER)
@given(data=st.data())
def test_overlapping_pairs_share_the_drawn_byte_and_keep_values(data):
    call = build(data.draw(small_cases(), label="case")).call()
    call["v_scale"] = call["v_scale"].reshape(())  # a 0-d tensor too
    cache = data.draw(st.sampled_from(("k_cache", "v_cache")), label="cache")
    other = data.draw(st.sampled_from(("k_cache", "v_cache", "k", "v", "cache_loc", "v_scale")).filter(
        lambda name: name != cache), label="other")
    a, b = call[cache], call[other]
    placement = data.draw(placements(tuple(a.shape), tuple(b.shape), b.element_size()), label="placement")
    new_a, new_b = overlapping_pair(a, b, placement)
    assert (new_a.shape, new_a.stride(), new_a.dtype) == (a.shape, a.stride(), a.dtype)
    assert (new_b.shape, new_b.stride(), new_b.dtype) == (b.shape, b.stride(), b.dtype)
    common = tensor_bytes(new_a) & tensor_bytes(new_b)
    assert common, placement
    if placement.kind != "shared":
        assert len(common) == 1, f"{placement.kind} shares {len(common)} bytes"
    assert torch.equal(as_bytes(new_b), as_bytes(b)), "the other argument's values changed"


def test_every_placement_and_pool_kind_is_drawn():
    seen: Counter[str] = Counter()

    @settings(max_examples=200, **INNER)
    @given(placements((3, 4, 2, 8), (5, 2, 8), 2), pools((3, 4, 2, 8), 4), pools((3, 4, 2, 8), 3))
    def collect(placement, pool4, pool3) -> None:
        seen.update([placement.kind, pool4.kind, f"rank3 {pool3.kind}"])

    collect()
    # [P, 2, ps, H, D] cannot be passed as [S, H, D] (page and offset do not merge): not drawn at rank 3
    wanted = list(PLACEMENT_KINDS) + list(POOL_KINDS.values()) + [f"rank3 {k}" for k in POOL_KINDS.values()
                                                                   if k != "page-halves"]
    low = [k for k in wanted if seen[k] < 10]
    assert not low, f"drawn fewer than 10 times in 200: {low}; counts {dict(seen)}"


@settings(max_examples=120, **INNER)
@given(data=st.data())
def test_sharings_keep_caches_disjoint_values_intact_and_build_deterministically(data):
    case = data.draw(cases(max_tokens=4, max_heads=3, max_dim=16), label="case")
    sharing = data.draw(sharings(case), label="sharing")
    shared, plain = build_shared(case, sharing), build(case)
    call = shared.call()
    tensors = {n: t for n, t in call.items() if isinstance(t, torch.Tensor)}
    for cache in ("k_cache", "v_cache"):
        for name, t in tensors.items():
            if name != cache and not (cache == "v_cache" and name == "k_cache"):
                assert not tensor_bytes(tensors[cache]) & tensor_bytes(t), f"{cache} meets {name}: {sharing}"
    owners = {buf.data_ptr(): buf for buf in shared.buffers.values()}
    for name, t in tensors.items():  # every tensor lies inside a buffer the property compares
        buf = storage_bytes(t)
        assert buf.data_ptr() in owners and t.data_ptr() + extent(t) <= buf.data_ptr() + buf.numel(), name
    assert torch.equal(as_bytes(call["k"]), as_bytes(plain.k_logical)), "k's values changed"
    want_v = plain.k_logical if sharing.inputs.kind == "same" else plain.v_logical
    assert torch.equal(as_bytes(call["v"]), as_bytes(want_v)), "v's values changed"
    assert call["cache_loc"].tolist() == list(case.cache_loc)
    for name in ("k_scale", "v_scale"):
        value = lambda s: s.item() if isinstance(s, torch.Tensor) else s  # noqa: E731
        assert value(call[name]) == value(plain.call()[name]), name
    again = build_shared(case, sharing)
    assert shared.buffers.keys() == again.buffers.keys()
    assert all(torch.equal(shared.buffers[n], again.buffers[n]) for n in shared.buffers), "not deterministic"
    if isinstance(sharing.caches, Pool):
        assert len({storage_bytes(call["k_cache"]).data_ptr(), storage_bytes(call["v_cache"]).data_ptr()}) == 1


def test_every_sharing_kind_is_drawn():
    seen: Counter[str] = Counter()

    @settings(max_examples=200, **INNER)
    @given(cases(max_tokens=4, max_heads=3, max_dim=16).flatmap(sharings))
    def collect(sharing) -> None:
        seen.update([sharing.caches.kind, f"inputs {sharing.inputs.kind}"])
        if isinstance(sharing.caches, Arena) and len(sharing.caches.members) > 2:
            seen["arena with other tensors"] += 1
        if isinstance(sharing.caches, Arena) and 0 in sharing.caches.gaps:
            seen["arena with touching extents"] += 1

    collect()
    wanted = ["arena", "arena with other tensors", "arena with touching extents", *POOL_KINDS.values(),
              *(f"inputs {k}" for k in INPUT_SHARING)]
    low = [k for k in wanted if seen[k] < 5]
    assert not low, f"drawn fewer than 5 times in 200: {low}; counts {dict(seen)}"


def test_build_shared_gives_the_plain_calls_bytes_under_the_reference():
    """The reference writes the same slot bytes into a shared pool as into separate buffers: the
    sharing changes where the bytes go, not what they are (a case with a few written slots)."""
    case = Case(num_tokens=3, num_heads=2, head_dim=8, page_size=4, num_pages=3, cache_loc=(0, 5, 11),
                k_scale=Scale("float", 0.5), v_scale=Scale("tensor1", 2.0), seed=7)
    plain = build(case)
    naive_fp8_set_kv_buffer(**plain.call())
    for order in NAMED_POOLS.values():
        shared = build_shared(case, Sharing(Pool(order, (0,) * 5)))
        naive_fp8_set_kv_buffer(**shared.call())
        for which in ("k_cache", "v_cache"):
            got = getattr(shared, which).view(torch.uint8).reshape(-1, 2, 8)[list(case.cache_loc)]
            want = getattr(plain, which).view(torch.uint8).reshape(-1, 2, 8)[list(case.cache_loc)]
            assert torch.equal(got, want), (order, which)
