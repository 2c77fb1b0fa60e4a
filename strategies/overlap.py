"""Overlap: arguments that share memory, drawn as plain data, then placed in one buffer.

A KV write must not write where it reads, or where the other cache is, and it must accept the
layouts real pools use, where K and V share one buffer without sharing a byte. Both sides are drawn
here as frozen dataclasses (printable in a report, no tensors) and turned into views of one buffer by
plain functions:

- overlapping (invalid, conformance/test_errors.py): a `Placement` names one byte that a cache and
  another argument (the other cache, k or v, cache_loc, a scale tensor) both cover. `overlapping_pair`
  copies both views, each keeping its shape, strides, dtype and values, into one fresh buffer with that
  byte in common. Kinds: "shared" (drawn elements coincide anywhere, e.g. `buf[1:5]` against `buf[0:4]`),
  "cache-last-is-first" and "cache-first-is-last" (exactly one byte in common, at the ends of the
  extents; with a 2- or 4-byte `other` the shared byte is inside one of its elements: a dtype view).
- disjoint (valid, conformance/test_overlap.py): a `Sharing` of a Case's tensors: the caches as a
  `Pool` (K and V as the two halves of one `[P, ps, H, D] x 2` buffer, the kv axis anywhere in storage
  order: `[2, P, ...]`, `[P, 2, ps, H, D]`, per slot, per head, per byte) or an `Arena` (the caches, and
  some of k, v, cache_loc and the scale tensors, carved back to back from one flat byte buffer, gaps of
  0 bytes included), and the inputs as `InputSharing` (own buffers, the halves of one fused buffer, or
  v is k: they are only read). `build_shared(case, sharing, device)` makes its tensors.

Every strategy validates its arguments when built (InvalidArgument), labels its draws and emits a
`hypothesis.event`; each shrinks toward the plainest member of its family (noted per strategy).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from strategies._cache import ints, sampled
from strategies.build import DTYPES, GUARD_BYTES, PATTERN_LEN, Built, build, seeded_bits
from strategies.case import Case

PLACEMENT_KINDS = ("shared", "cache-last-is-first", "cache-first-is-last")
ELEMENT_SIZES = (1, 2, 4, 8)
MARGIN = 64  # bytes before and after an overlapping pair: a multiple of every element size

#: Pool dims: the cache's logical (page, offset, head, dim), and kv (K's half, V's half).
POOL_DIMS = ("page", "offset", "head", "dim", "kv")
PAGE, OFFSET, HEAD, DIM, KV = range(5)
#: A pool's kind, by the dim just outside kv in storage order (None: kv is outermost).
POOL_KINDS = {None: "split-halves", PAGE: "page-halves", OFFSET: "per-slot", HEAD: "per-head", DIM: "per-byte"}
ARENA_OPTIONAL = ("k", "v", "cache_loc", "k_scale", "v_scale")
INPUT_SHARING = ("separate", "fused", "same")


# -- raw views ------------------------------------------------------------------------------------

def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def extent(t: torch.Tensor) -> int:
    """Bytes from a view's first byte to one past its last (0 for an empty view)."""
    if t.numel() == 0:
        return 0
    return (sum(s * (n - 1) for s, n in zip(t.stride(), t.shape)) + 1) * t.element_size()


def byte_offset(t: torch.Tensor, index: tuple[int, ...]) -> int:
    """Bytes from t's first byte to the first byte of its element `index`."""
    if len(index) != t.dim() or any(not 0 <= i < n for i, n in zip(index, t.shape)):
        raise ValueError(f"index {index} is outside shape {tuple(t.shape)}")
    return sum(i * s for i, s in zip(index, t.stride())) * t.element_size()


def strided_view(buffer: torch.Tensor, offset: int, dtype: torch.dtype, shape: tuple[int, ...],
                 stride: tuple[int, ...]) -> torch.Tensor:
    """A `dtype` view of a uint8 buffer starting `offset` bytes in (a multiple of dtype's size)."""
    es = element_size(dtype)
    if buffer.dtype != torch.uint8 or buffer.dim() != 1:
        raise ValueError(f"buffer must be a 1-D uint8 tensor, got {buffer.dtype} {tuple(buffer.shape)}")
    start = buffer.storage_offset() + offset
    if start % es:
        raise ValueError(f"a {dtype} view cannot start at byte {start}: not a multiple of {es}")
    span = (sum(s * (n - 1) for s, n in zip(stride, shape)) + 1) * es if math.prod(shape) else 0
    if offset < 0 or offset + span > buffer.numel():
        raise ValueError(f"a view of {span} bytes at {offset} does not fit a buffer of {buffer.numel()}")
    return torch.empty(0, dtype=dtype, device=buffer.device).set_(
        buffer.untyped_storage(), start // es, tuple(shape), tuple(stride))


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The whole storage behind t as a 1-D uint8 tensor (the bytes every view of it lives in)."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, 0, (storage.nbytes(),), (1,))


def seeded_buffer(seed: int, stream: str, n: int, device: torch.device) -> torch.Tensor:
    """n seeded bytes (as strategies.build fills caches): every byte has a known previous value."""
    pattern = (seeded_bits(seed, stream, PATTERN_LEN, device) & 0xFF).to(torch.uint8)
    return pattern.repeat(n // PATTERN_LEN + 1)[:n].contiguous()


# -- overlapping: one byte in common ----------------------------------------------------------------

@dataclass(frozen=True)
class Placement:
    """The first byte of the cache's element `cache_index` is byte `byte` of the other's element
    `other_index`: `overlapping_pair` puts the two views there, so they share at least that byte."""

    kind: str  # one of PLACEMENT_KINDS (for events and reports)
    cache_index: tuple[int, ...]
    other_index: tuple[int, ...]
    byte: int


def _check_shape(name: str, shape: tuple[int, ...]) -> None:
    if not isinstance(shape, tuple) or any(not isinstance(n, int) or n < 1 for n in shape):
        raise InvalidArgument(f"placements({name}={shape!r}): a tuple of sizes >= 1 (a view with a byte to share)")


@lru_cache(maxsize=1024)
def placements(cache_shape: tuple[int, ...], other_shape: tuple[int, ...],
               other_element_size: int) -> st.SearchStrategy[Placement]:
    """Where a cache (1-byte elements) and another view share a byte.

    Draws a kind, then for "shared" an element of each (every coordinate) and a byte of the other's
    element. Shrinks to "shared" at both first elements, byte 0: both views start at one address.
    """
    _check_shape("cache_shape", cache_shape)
    _check_shape("other_shape", other_shape)
    if other_element_size not in ELEMENT_SIZES:
        raise InvalidArgument(f"placements(other_element_size={other_element_size!r}): one of {ELEMENT_SIZES}")
    return _placements(cache_shape, other_shape, other_element_size)


@st.composite
def _placements(draw: st.DrawFn, cache_shape: tuple[int, ...], other_shape: tuple[int, ...], es: int) -> Placement:
    kind = draw(sampled(PLACEMENT_KINDS), label="placement")
    event(f"overlap: placement {kind}")
    first_c, first_o = (0,) * len(cache_shape), (0,) * len(other_shape)
    if kind == "cache-last-is-first":  # the cache's last byte is the other's first
        return Placement(kind, tuple(n - 1 for n in cache_shape), first_o, 0)
    if kind == "cache-first-is-last":  # the other's last byte (the top byte of its last element) is the cache's first
        return Placement(kind, first_c, tuple(n - 1 for n in other_shape), es - 1)
    cache_index = tuple(draw(ints(0, n - 1), label=f"cache_index_{i}") for i, n in enumerate(cache_shape))
    other_index = tuple(draw(ints(0, n - 1), label=f"other_index_{i}") for i, n in enumerate(other_shape))
    return Placement(kind, cache_index, other_index, draw(ints(0, es - 1), label="byte"))


def overlapping_pair(cache: torch.Tensor, other: torch.Tensor,
                     placement: Placement) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of `cache` and `other` (shapes, strides, dtypes and values kept) in one new buffer, placed
    as `placement` says. `other`'s values are copied last, so they are intact where the two overlap
    (a cache_loc or scale in there still reads as it did); the cache's bytes there are `other`'s."""
    shared = byte_offset(cache, placement.cache_index)
    if not 0 <= placement.byte < other.element_size():
        raise ValueError(f"byte {placement.byte} is outside a {other.element_size()}-byte element")
    delta = shared - byte_offset(other, placement.other_index) - placement.byte  # other's base - cache's base
    es_c, es_o = cache.element_size(), other.element_size()
    step = es_c * es_o // math.gcd(es_c, es_o)
    # The cache's base: aligned for both dtypes, and far enough in that other's base is too.
    first = MARGIN + max(0, -delta)
    first += -first % es_c
    base = next((b for b in range(first, first + step * es_c, es_c) if (b + delta) % es_o == 0), None)
    if base is None:
        raise ValueError(f"no aligned placement of a {cache.dtype} and a {other.dtype} view for {placement}")
    size = max(base + extent(cache), base + delta + extent(other)) + MARGIN
    buffer = torch.full((size,), 0xA5, dtype=torch.uint8, device=cache.device)
    new_cache = strided_view(buffer, base, cache.dtype, tuple(cache.shape), cache.stride())
    new_other = strided_view(buffer, base + delta, other.dtype, tuple(other.shape), other.stride())
    new_cache.copy_(cache)
    new_other.copy_(other)
    return new_cache, new_other


# -- disjoint: K and V halves of one pool -----------------------------------------------------------

@dataclass(frozen=True)
class Pool:
    """K and V caches as the two halves of one buffer: a logical [P, ps, H, D, 2] pool stored in
    `order` (outermost first), `extra[d]` spare elements after dim d (extra[KV] > 0: room for a third
    half), K at half `k_half` and V at the other, starting `offset` bytes after the guard band."""

    order: tuple[int, ...]
    extra: tuple[int, ...]
    k_half: int = 0
    offset: int = 0

    @property
    def kind(self) -> str:
        i = self.order.index(KV)
        return POOL_KINDS[self.order[i - 1] if i else None]

    def strides(self, cache_shape: tuple[int, int, int, int]) -> tuple[int, ...]:
        """Element (= byte) strides of the five pool dims."""
        sizes = (*cache_shape, 2)
        strides = [0] * 5
        running = 1
        for d in reversed(self.order):
            strides[d] = running
            running *= sizes[d] + self.extra[d]
        return tuple(strides)

    def span(self, cache_shape: tuple[int, int, int, int]) -> int:
        outer = self.order[0]
        return self.strides(cache_shape)[outer] * ((*cache_shape, 2)[outer] + self.extra[outer])

    def views(self, buffer: torch.Tensor, start: int, cache_shape: tuple[int, int, int, int], rank: int,
              dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(k_cache, v_cache): the two halves, as [P, ps, H, D] views (rank 4) or [S, H, D] (rank 3)."""
        st_ = self.strides(cache_shape)
        shape, stride = tuple(cache_shape), st_[:4]
        if rank == 3:
            if stride[PAGE] != cache_shape[OFFSET] * stride[OFFSET]:
                raise ValueError(f"{self} cannot be viewed as [S, H, D]: page and offset do not merge")
            shape, stride = (cache_shape[0] * cache_shape[1], *cache_shape[2:]), stride[1:]
        base = start + self.offset
        halves = [strided_view(buffer, base + h * st_[KV], dtype, shape, stride) for h in (0, 1)]
        return halves[self.k_half], halves[1 - self.k_half]


def _pool_orders(rank: int) -> tuple[tuple[int, ...], ...]:
    """Storage orders of (page, offset, head, dim) that a rank-3 cache can merge (page right outside offset)."""
    orders = itertools.permutations((PAGE, OFFSET, HEAD, DIM))
    if rank == 3:
        orders = (o for o in orders if o.index(OFFSET) == o.index(PAGE) + 1)
    identity = (PAGE, OFFSET, HEAD, DIM)
    return (identity,) + tuple(o for o in orders if o != identity)  # identity first: the shrink target


@lru_cache(maxsize=256)
def pools(cache_shape: tuple[int, int, int, int], rank: int) -> st.SearchStrategy[Pool]:
    """A Pool for caches of logical shape [P, ps, H, D] passed at `rank` (3: [S, H, D], 4: [P, ps, H, D]).

    Draws the storage order of the cache dims (identity, or HND and every other permutation a rank-3
    cache can merge), where the kv axis sits in it, spare elements per dim, which half is K and a start
    offset. Shrinks to [P, 2, ps, H, D] (the page halves), unpadded, K first, offset 0.
    """
    if len(cache_shape) != 4 or any(not isinstance(n, int) or n < 1 for n in cache_shape):
        raise InvalidArgument(f"pools(cache_shape={cache_shape!r}): four sizes >= 1, [P, ps, H, D]")
    if rank not in (3, 4):
        raise InvalidArgument(f"pools(rank={rank!r}): 3 ([S, H, D]) or 4 ([P, ps, H, D])")
    return _pools(cache_shape, rank)


@st.composite
def _pools(draw: st.DrawFn, cache_shape: tuple[int, int, int, int], rank: int) -> Pool:
    orders = _pool_orders(rank)
    base = orders[0] if draw(ints(0, 3), label="permute_pool") < 3 else draw(sampled(orders), label="pool_order")
    # kv at position 1 first: with the identity order that is [P, 2, ps, H, D].
    positions = tuple(p for p in (1, 0, 2, 3, 4)
                      if rank == 4 or not (0 < p < 4 and base[p - 1] == PAGE and base[p] == OFFSET))
    position = draw(sampled(positions), label="kv_position")
    order = base[:position] + (KV,) + base[position:]
    extra = [0] * 5
    if draw(ints(0, 3), label="pad_pool") == 3:
        for d in range(5):
            if not (rank == 3 and d == OFFSET):  # a rank-3 cache merges page and offset: no spare slots
                extra[d] = draw(sampled((0, 0, 1, 2)), label=f"pool_extra_{POOL_DIMS[d]}")
    pool = Pool(order, tuple(extra), draw(ints(0, 1), label="k_half"), draw(sampled((0, 0, 1, 3, 16)),
                                                                                label="pool_offset"))
    event(f"overlap: pool {pool.kind}")
    return pool


# -- disjoint: one flat arena --------------------------------------------------------------------

@dataclass(frozen=True)
class Arena:
    """The call's tensors carved from one flat byte buffer, back to back: `members` in address order,
    member i starting `gaps[i]` bytes after the previous one's last byte (then rounded up to its
    element size): a gap of 0 puts two extents right against each other."""

    members: tuple[str, ...]
    gaps: tuple[int, ...]

    @property
    def kind(self) -> str:
        return "arena"


@lru_cache(maxsize=256)
def arenas(available: tuple[str, ...]) -> st.SearchStrategy[Arena]:
    """An Arena of both caches and any of `available` (names from ARENA_OPTIONAL: the tensors of the call).

    Draws which optional tensors join, the address order and the gaps. Shrinks to the two caches in
    the order k_cache, v_cache with no gap.
    """
    bad = [n for n in available if n not in ARENA_OPTIONAL]
    if bad:
        raise InvalidArgument(f"arenas(available={available!r}): unknown {bad}; choose from {ARENA_OPTIONAL}")
    return _arenas(available)


@st.composite
def _arenas(draw: st.DrawFn, available: tuple[str, ...]) -> Arena:
    joined = tuple(n for n in available if draw(ints(0, 1), label=f"arena_has_{n}"))
    members = tuple(draw(st.permutations(("k_cache", "v_cache") + joined), label="arena_order"))
    gaps = tuple(draw(sampled((0, 0, 1, 5, 64)), label=f"arena_gap_{n}") for n in members)
    event(f"overlap: arena of {len(members)}")
    return Arena(members, gaps)


# -- k and v --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class InputSharing:
    """How k and v share memory (both are only read, so any sharing is valid): "separate" (their own
    buffers, as strategies.build makes them), "fused" (the halves of one [T, H, D] x 2 buffer, the kv
    axis at position `axis` of the storage order token, head, dim: 0 outermost, 3 innermost), or
    "same" (v is k: one tensor passed twice)."""

    kind: str = "separate"
    axis: int = 1


@lru_cache(maxsize=16)
def input_sharings(rank: int) -> st.SearchStrategy[InputSharing]:
    """InputSharing for inputs passed at `rank` (2: [T, H*D], where kv cannot sit between head and dim).
    Shrinks to "separate"."""
    if rank not in (2, 3):
        raise InvalidArgument(f"input_sharings(rank={rank!r}): 2 ([T, H*D]) or 3 ([T, H, D])")
    return _input_sharings(rank)


@st.composite
def _input_sharings(draw: st.DrawFn, rank: int) -> InputSharing:
    kind = draw(sampled(INPUT_SHARING), label="input_sharing")
    axes = (1, 0, 3) if rank == 2 else (1, 0, 2, 3)
    axis = draw(sampled(axes), label="fused_kv_axis") if kind == "fused" else 1
    event(f"overlap: inputs {kind}")
    return InputSharing(kind, axis)


# -- a whole valid call ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Sharing:
    """How one valid call's tensors share memory without a cache sharing a byte with anything."""

    caches: Pool | Arena
    inputs: InputSharing = InputSharing()

    def describe(self) -> str:
        return f"caches {self.caches.kind} {self.caches}, inputs {self.inputs.kind} {self.inputs}"


def _tensor_args(case: Case) -> tuple[str, ...]:
    """The optional arena members this Case has as tensors (a float or None scale is not one)."""
    scales = tuple(n for n in ("k_scale", "v_scale") if getattr(case, n).kind.startswith("tensor"))
    return ("k", "v", "cache_loc") + scales


def sharings(case: Case) -> st.SearchStrategy[Sharing]:
    """A Sharing for `case`: the inputs' (input_sharings), then the caches' (a Pool, or an Arena of the
    caches and some of the call's tensors; inputs that share a buffer stay out of it). Shrinks to
    separate inputs and the page-halves pool."""
    if not isinstance(case, Case):
        raise InvalidArgument(f"sharings(case=...): a strategies.Case, got {type(case).__name__}")
    return _sharings(case)


@st.composite
def _sharings(draw: st.DrawFn, case: Case) -> Sharing:
    inputs = draw(input_sharings(case.input_rank), label="inputs")
    if draw(ints(0, 2), label="arena") < 2:
        caches: Pool | Arena = draw(pools(case.cache_shape, case.cache_rank), label="pool")
    else:
        available = tuple(n for n in _tensor_args(case) if inputs.kind == "separate" or n not in ("k", "v"))
        caches = draw(arenas(available), label="arena_layout")
    return Sharing(caches, inputs)


def _fused_inputs(built: Built, sharing: InputSharing) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k, v, v_logical) as the inputs' sharing says; k and v values as built (v's are k's for "same")."""
    if sharing.kind == "separate":
        return built.k, built.v, built.v_logical
    case = built.case
    k_logical = built.k_logical
    if sharing.kind == "same":
        k = built.k
        return k, k, k_logical
    t, h, d = case.input_shape
    order = [0, 1, 2]
    order.insert(sharing.axis, 3)  # the kv axis among (token, head, dim)
    sizes = (t, h, d, 2)
    strides = [0] * 4
    running = 1
    for dim in reversed(order):
        strides[dim] = running
        running *= max(sizes[dim], 1)  # T = 0 still gets room for one token: the halves start inside
    es = k_logical.element_size()
    buffer = torch.zeros(running * es, dtype=torch.uint8, device=k_logical.device)
    halves = [strided_view(buffer, i * strides[3] * es, k_logical.dtype, (t, h, d), tuple(strides[:3]))
              for i in (0, 1)]
    halves[0].copy_(k_logical)
    halves[1].copy_(built.v_logical)
    if case.input_rank == 2:  # [T, H*D]: head and dim are adjacent (input_sharings keeps kv out from between)
        if h > 1 and strides[1] != d * strides[2]:
            raise ValueError(f"{sharing} cannot be passed as [T, H*D]: head and dim do not merge")
        # as_strided, not flatten: flatten copies when it cannot view, and the copy would share nothing
        halves = [x.as_strided((t, h * d), (strides[0], strides[2]), x.storage_offset()) for x in halves]
    return halves[0], halves[1], built.v_logical


def _relocate(arena: Arena, tensors: dict[str, torch.Tensor], case: Case,
              device: torch.device) -> dict[str, torch.Tensor]:
    """The arena's members as views of one seeded buffer, each with its bytes copied from where it was."""
    starts: dict[str, int] = {}
    at = GUARD_BYTES
    for name, gap in zip(arena.members, arena.gaps):
        t = tensors[name]
        at += gap
        at += -at % t.element_size()
        starts[name] = at
        at += extent(t)
    buffer = seeded_buffer(case.seed, "arena", at + GUARD_BYTES, device)
    out = {}
    for name, start in starts.items():
        t = tensors[name]
        source = storage_bytes(t)[t.storage_offset() * t.element_size():][:extent(t)]
        buffer[start:start + extent(t)] = source  # the view's span, gaps and poison inside it included
        out[name] = strided_view(buffer, start, t.dtype, tuple(t.shape), t.stride())
    return out


def build_shared(case: Case, sharing: Sharing, device: torch.device | str = "cpu") -> Built:
    """The Case's tensors (strategies.build), then shared as `sharing` says. Deterministic: the same
    (case, sharing) gives the same bytes. `buffers` holds every whole buffer a tensor of the call lives
    in, once, named by the arguments in it joined with '+' (e.g. "k_cache+v_cache")."""
    device = torch.device(device)
    built = build(case, device)
    k, v, v_logical = _fused_inputs(built, sharing.inputs)
    tensors = {"k": k, "v": v, "k_cache": built.k_cache, "v_cache": built.v_cache, "cache_loc": built.cache_loc}
    for name in ("k_scale", "v_scale"):
        if isinstance(getattr(built, name), torch.Tensor):
            tensors[name] = getattr(built, name)
    caches = sharing.caches
    if isinstance(caches, Pool):
        n = GUARD_BYTES + caches.offset + caches.span(case.cache_shape) + GUARD_BYTES
        buffer = seeded_buffer(case.seed, "pool", n, device)
        tensors["k_cache"], tensors["v_cache"] = caches.views(buffer, GUARD_BYTES, case.cache_shape,
                                                              case.cache_rank, DTYPES[case.cache_dtype])
    else:
        tensors.update(_relocate(caches, tensors, case, device))
    buffers: dict[int, tuple[list[str], torch.Tensor]] = {}
    for name, t in tensors.items():
        key = t.untyped_storage().data_ptr()
        buffers.setdefault(key, ([], storage_bytes(t)))[0].append(name)
    k_scale, v_scale = (tensors.get(n, getattr(built, n)) for n in ("k_scale", "v_scale"))  # floats stay as built
    return Built(case, tensors["k"], tensors["v"], tensors["k_cache"], tensors["v_cache"], tensors["cache_loc"],
                 k_scale, v_scale, built.k_logical, v_logical,
                 {"+".join(names): buf for names, buf in buffers.values()})


def owner_of(built: Built, buffer: torch.Tensor, index: int) -> str:
    """Which argument's element byte `index` of `buffer` is, e.g. "v_cache[1, 0, 2, 3] byte 0", or
    "no argument's byte" (padding, a gap, the guard bands)."""
    address = buffer.data_ptr() + index
    for name, t in built.call().items():
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        rel = address - t.data_ptr()
        if not 0 <= rel < extent(t):
            continue
        es = t.element_size()
        offsets = torch.arange(extent(t) // es + 1).as_strided(t.shape, t.stride()) * es
        hit = ((offsets <= rel) & (rel < offsets + es)).nonzero()
        if hit.numel():
            where = hit[0].tolist()
            return f"{name}{where} byte {rel - int(offsets[tuple(where)])}"
    return "no argument's byte"


__all__ = ["Arena", "InputSharing", "Placement", "Pool", "Sharing", "arenas", "build_shared", "input_sharings",
           "overlapping_pair", "owner_of", "placements", "pools", "sharings", "strided_view"]
