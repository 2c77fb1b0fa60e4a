"""Ablations: pure functions Case -> Case that move one input dimension back to the plain call.

A failure's trigger is found by experiment (conformance.diagnosis.diagnose): each ablation is applied
in turn to the failing Case and kept when the failure survives it, which leaves a minimal failing
variant; the trigger is then the set of dimensions whose ablation of that variant makes the failure
vanish. Every ablation keeps everything else of the Case, so a variant replays bit for bit like any
Case.

The plain call is the capability table's baseline: contiguous [T, H, D] bf16 input, a contiguous 4-D
fp8 cache, int64 cache_loc, H and D powers of two, page size 16, no padding, no out-of-range or shared
slots, both scales 1.0 of the convention's usual kind, ordinary values.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from strategies.build import _hash32_int
from strategies.case import FP8_CACHE_DTYPES, Case, Layout, Override, Scale
from strategies.fp import FORMATS, from_bits, round_to, to_bits

#: Values an ordinary input takes (times its scale) when the Case's own values are ablated: e4m3
#: numbers far from its subnormals, its overflow and its rounding ties.
ORDINARY = (1.0, -2.5, 0.375, 96.0, -0.03125, 3.0, -40.0, 0.5625)
PLAIN_PAGE = 16
BIG_CACHE_BYTES = 2**31
#: Ablations that may rebuild the values of every input (not with a fill: the exhaustive patterns).
MAX_ORDINARY = 1 << 14


@dataclass(frozen=True)
class Ablation:
    """One input dimension: its trigger name, the words a report uses, and the move to the plain call.

    `variants(case, plain_kind)` yields the Case with this dimension (or one half of it, K or V)
    moved to the plain call; nothing when the Case is plain there already. `value`: a dimension of
    the values (not of shape, layout or types), which a value effect (flush to zero, NaN sign) always
    needs; it is said in the report's words but is not part of a value defect's identity.
    `keeps_shape`: the ablation keeps T, H, D and the values' positions (usable with a pattern fill).
    """

    name: str
    words: str
    variants: Callable[[Case, str], Iterator[Case]]
    value: bool = False
    keeps_shape: bool = True


# -- helpers ----------------------------------------------------------------------------------------

def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _reshaped(case: Case, heads: int, dim: int) -> Case:
    """The Case with H and D cut to (heads, dim); overrides keep their (token, head, dim) place."""
    kept = []
    for o in case.overrides:
        t, rest = divmod(o.index, case.num_heads * case.head_dim)
        h, d = divmod(rest, case.head_dim)
        if h < heads and d < dim:
            kept.append(Override(o.tensor, (t * heads + h) * dim + d, o.bits, o.label))
    return case.replace(num_heads=heads, head_dim=dim, overrides=tuple(kept))


def _still_out(s: int, old: int, new: int) -> int:
    """Slot s of a cache of `old` slots, in one of `new`: out of range by as much (or more, where that
    would not fit its dtype), in range unchanged."""
    return s if s < old or s >= new else new + (s - old)


def _with_slots(case: Case, locs: list[int], page_size: int | None = None) -> Case:
    """The Case with these slots, enough pages for the in-range ones (keeping the old cache size), and
    every out-of-range slot still out of range by the same amount."""
    page = page_size or case.page_size
    old = case.num_slots
    needed = max([s + 1 for s in locs if 0 <= s < old] + [old if page == case.page_size else 1, 1])
    pages = -(-needed // page)
    new = pages * page
    remapped = tuple(_still_out(s, old, new) for s in locs)
    return case.replace(cache_loc=remapped, page_size=page, num_pages=pages)


def _fresh(case: Case, pick: Callable[[int], bool]) -> Case | None:
    """The Case with each slot that `pick` picks moved to a free in-range slot of its own (pages are
    added when none is left); other out-of-range slots stay out of range by the same amount."""
    picked = sum(pick(s) for s in case.cache_loc)
    if not picked:
        return None
    old = case.num_slots
    used = {s for s in case.cache_loc if 0 <= s < old and not pick(s)}
    free = (s for s in range(old + picked) if s not in used)
    slots = [next(free) for _ in range(picked)]
    pages = max(case.num_pages, -(-(max(slots) + 1) // case.page_size))
    new = pages * case.page_size
    order = iter(slots)
    locs = tuple(next(order) if pick(s) else _still_out(s, old, new) for s in case.cache_loc)
    return case.replace(cache_loc=locs, num_pages=pages)


def _convert_overrides(case: Case, dtype: str) -> tuple[Override, ...]:
    out = []
    for o in case.overrides:
        value = from_bits(o.bits, case.input_dtype)
        out.append(Override(o.tensor, o.index, to_bits(round_to(value, FORMATS[dtype]), dtype), o.label))
    return tuple(out)


def cache_bytes(case: Case) -> int:
    return case.num_slots * case.num_heads * case.head_dim


# -- the ablations ----------------------------------------------------------------------------------

def _big_cache(case: Case, plain: str) -> Iterator[Case]:
    if cache_bytes(case) >= BIG_CACHE_BYTES:
        distinct = sorted({s for s in case.cache_loc if 0 <= s < case.num_slots})
        rank = {s: i for i, s in enumerate(distinct)}
        pages = max(-(-len(distinct) // case.page_size), 1)
        locs = tuple(rank.get(s, s if s < 0 else pages * case.page_size + 1) for s in case.cache_loc)
        yield case.replace(cache_loc=locs, num_pages=pages)


def _empty(case: Case, plain: str) -> Iterator[Case]:
    if case.num_tokens == 0:
        yield case.replace(num_tokens=1, cache_loc=(0,), num_pages=max(case.num_pages, 1), overrides=())


def _ordinary_values(case: Case, plain: str) -> Iterator[Case]:
    """Every input value not given by an override: an ordinary e4m3 number times its tensor's scale, so
    that x / s lands near a grid value, far from subnormals, overflow and ties (no recipe, encoder or
    rounding rule tells them apart). A scale so small or large that the product leaves the input dtype's
    normal range goes to 1.0 with the values."""
    n = case.num_tokens * case.num_heads * case.head_dim
    if n == 0 or n > MAX_ORDINARY or any(o.label == "ordinary" for o in case.overrides):
        return
    fmt = FORMATS[case.input_dtype]
    scales = {"k": case.k_scale, "v": case.v_scale}
    changed = {}
    for t, s in scales.items():
        if s.kind != "none" and not 2.0**-20 <= s.value <= 2.0**20:
            scales[t] = changed[f"{t}_scale"] = Scale(s.kind, 1.0)
    bits = {t: [to_bits(round_to(x * (s.value if s.kind != "none" else 1.0), fmt), case.input_dtype)
                for x in ORDINARY] for t, s in scales.items()}
    taken = {(o.tensor, o.index) for o in case.overrides}
    # Picked by a hash of the position, so that no two tokens' rows are alike by construction.
    extra = tuple(Override(t, i, bits[t][_hash32_int(2 * i + (t == "v")) % len(ORDINARY)], "ordinary")
                  for t in ("k", "v") for i in range(n) if (t, i) not in taken)
    yield case.replace(overrides=extra + case.overrides, **changed)


def _special_values(case: Case, plain: str) -> Iterator[Case]:
    if any(o.label != "ordinary" for o in case.overrides):
        yield case.replace(overrides=tuple(o for o in case.overrides if o.label == "ordinary"))


def _scales_differ(case: Case, plain: str) -> Iterator[Case]:
    """Both scales of one value, each of its own kind: the value that is not 1.0 (V's when both are not),
    so that a cache written with its own scale ignored still fails, and one written with the other's passes."""
    k, v = case.k_scale, case.v_scale
    if "none" in (k.kind, v.kind) or k.value == v.value:
        return
    value = v.value if v.value != 1.0 else k.value
    yield case.replace(k_scale=Scale(k.kind, value), v_scale=Scale(v.kind, value))


def _scale_value(case: Case, plain: str) -> Iterator[Case]:
    """Each scale at 1.0; two equal scales together, so that the minimal variant keeps them equal (one at
    1.0 had undone `scales-differ`, and a defect of the slots read beside one of the scales: an H100 pair)."""
    k, v = case.k_scale, case.v_scale
    if k.kind != "none" and v.kind != "none" and k.value == v.value != 1.0:
        yield case.replace(k_scale=Scale(k.kind, 1.0), v_scale=Scale(v.kind, 1.0))
        return
    for which in ("k_scale", "v_scale"):
        s = getattr(case, which)
        if s.kind != "none" and s.value != 1.0:
            yield case.replace(**{which: Scale(s.kind, 1.0)})


def _scale_kind(kind: str) -> Callable[[Case, str], Iterator[Case]]:
    def variants(case: Case, plain: str) -> Iterator[Case]:
        if kind == plain:
            return
        for which in ("k_scale", "v_scale"):
            s = getattr(case, which)
            if s.kind == kind:
                yield case.replace(**{which: Scale(plain, 1.0 if plain == "none" else s.value)})
    return variants


def _layouts_differ(case: Case, plain: str) -> Iterator[Case]:
    if case.v_cache_layout != case.k_cache_layout:
        yield case.replace(v_cache_layout=case.k_cache_layout)


def _input_layouts_differ(case: Case, plain: str) -> Iterator[Case]:
    if case.v_layout != case.k_layout:
        yield case.replace(v_layout=case.k_layout)


def _contiguous(names: tuple[str, ...], rank: int) -> Callable[[Case, str], Iterator[Case]]:
    def variants(case: Case, plain: str) -> Iterator[Case]:
        for name in names:
            if getattr(case, name) != Layout.contiguous(rank):
                yield case.replace(**{name: Layout.contiguous(rank)})
    return variants


def _loc_stride(case: Case, plain: str) -> Iterator[Case]:
    if case.loc_step != 1:
        yield case.replace(loc_step=1)


def _set(attr: str, current: object, plain: object) -> Callable[[Case, str], Iterator[Case]]:
    def variants(case: Case, kind: str) -> Iterator[Case]:
        if getattr(case, attr) == current:
            yield case.replace(**{attr: plain})
    return variants


def _cache_uint8(case: Case, plain: str) -> Iterator[Case]:
    if case.cache_dtype == "uint8":  # the float8 dtype of the same format
        yield case.replace(cache_dtype=FP8_CACHE_DTYPES[case.cache_format])


def _cache_format(fmt: str) -> Callable[[Case, str], Iterator[Case]]:
    def variants(case: Case, plain: str) -> Iterator[Case]:
        if case.cache_format == fmt:  # e4m3, in the same storage (uint8 stays uint8)
            dtype = "uint8" if case.cache_dtype == "uint8" else FP8_CACHE_DTYPES["fp8_e4m3"]
            yield case.replace(cache_format="fp8_e4m3", cache_dtype=dtype)
    return variants


def _input_dtype(dtype: str) -> Callable[[Case, str], Iterator[Case]]:
    def variants(case: Case, plain: str) -> Iterator[Case]:
        if case.input_dtype == dtype:
            yield case.replace(input_dtype="bfloat16", overrides=_convert_overrides(case, "bfloat16"))
    return variants


def _heads(case: Case, plain: str) -> Iterator[Case]:
    if case.num_heads != _pow2_floor(case.num_heads):
        yield _reshaped(case, _pow2_floor(case.num_heads), case.head_dim)


def _dim(case: Case, plain: str) -> Iterator[Case]:
    if case.head_dim != _pow2_floor(case.head_dim):
        yield _reshaped(case, case.num_heads, _pow2_floor(case.head_dim))


def _page_size(case: Case, plain: str) -> Iterator[Case]:
    """The plain page size. Growing, each in-range token keeps its page and offset (so a Case whose tokens
    span pages still does: a page-stride defect is not hidden by every token landing in page 0)."""
    if case.page_size == PLAIN_PAGE or case.cache_rank != 4:
        return
    if PLAIN_PAGE < case.page_size:
        yield _with_slots(case, list(case.cache_loc), PLAIN_PAGE)
        return
    n, grown = case.num_slots, case.replace(page_size=PLAIN_PAGE)
    yield grown.replace(cache_loc=tuple(s // case.page_size * PLAIN_PAGE + s % case.page_size if 0 <= s < n
                                        else _still_out(s, n, grown.num_slots) for s in case.cache_loc))


def _padding(case: Case, plain: str) -> Iterator[Case]:
    variant = _fresh(case, lambda s: s < 0)
    if variant is not None:
        yield variant


def _out_of_range(case: Case, plain: str) -> Iterator[Case]:
    n = case.num_slots
    variant = _fresh(case, lambda s: s >= n)
    if variant is not None:
        yield variant


def _duplicates(case: Case, plain: str) -> Iterator[Case]:
    seen: set[int] = set()
    if any(s in seen or seen.add(s) for s in case.cache_loc if 0 <= s < case.num_slots):
        from conformance.diagnosis.classify import unique_slots
        yield unique_slots(case)


def _edge_slot(first: bool) -> Callable[[Case, str], Iterator[Case]]:
    """The tokens naming the cache's first (or last) slot moved to free slots between the two ends (a page
    added where none is left): a bound off by one at either end (`> 0` for `>= 0`, SGLang's slot 0 taken
    for the padding slot; `< n - 1` for `< n`) leaves that slot alone unwritten."""
    def variants(case: Case, plain: str) -> Iterator[Case]:
        n = case.num_slots
        edge = 0 if first else n - 1
        picked = sum(s == edge for s in case.cache_loc)
        if not picked:
            return
        if n == 1:  # the one slot is both ends: the other end kept, on a cache of three slots or more
            pages = -(-3 // case.page_size)
            total = pages * case.page_size
            yield case.replace(cache_loc=tuple((total - 1 if first else 0) if s == 0 else _still_out(s, n, total)
                                               for s in case.cache_loc), num_pages=pages)
            return
        used = {s for s in case.cache_loc if 0 <= s < n}
        pages = case.num_pages
        while len(free := [s for s in range(1, pages * case.page_size - 1) if s not in used]) < picked:
            pages += 1
        order = iter(free)
        new = pages * case.page_size
        yield case.replace(cache_loc=tuple(next(order) if s == edge else _still_out(s, n, new)
                                           for s in case.cache_loc), num_pages=pages)
    return variants


def _own_pages(case: Case, plain: str) -> Iterator[Case]:
    """Each token that shares its page with another moved to a page of its own, at the same offset (pages
    added): a kernel that stages a whole page per token and writes it back loses the other tokens' rows."""
    n, size = case.num_slots, case.page_size
    slots = sorted({s for s in case.cache_loc if 0 <= s < n})  # tokens sharing a slot move together: that
    pages = [s // size for s in slots]  # sharing is duplicate-slots'
    if case.cache_rank != 4 or size < 2 or len(pages) == len(set(pages)):
        return
    total = (case.num_pages + len(pages) - len(set(pages))) * size
    seen: set[int] = set()
    moved, extra = {}, case.num_pages
    for s in (s for s in dict.fromkeys(case.cache_loc) if 0 <= s < n):  # in the tokens' order
        if s // size in seen:
            moved[s] = extra * size + s % size
            extra += 1
        seen.add(s // size)
    yield case.replace(cache_loc=tuple(moved.get(s, _still_out(s, n, total)) for s in case.cache_loc),
                       num_pages=extra)


def _tokens(case: Case, plain: str) -> Iterator[Case]:
    """One token alone (each of the first four in turn), with the overrides of that token."""
    if case.num_tokens < 2:
        return
    per = case.num_heads * case.head_dim
    for t in range(min(case.num_tokens, 4)):
        overrides = tuple(Override(o.tensor, o.index - t * per, o.bits, o.label) for o in case.overrides
                          if t * per <= o.index < (t + 1) * per)
        yield case.replace(num_tokens=1, cache_loc=(case.cache_loc[t],), overrides=overrides)


#: The largest cache (bytes a cache) _more_pages grows to: a few reference calls on it stay cheap on the CPU.
MAX_GROWN = 1 << 24


def _more_pages(case: Case, plain: str) -> Iterator[Case]:
    """The cache grown by T pages (every slot kept, out-of-range ones still out): code that sizes its token grid
    or loop by the cache's first dimension (`key_cache.shape[0]`, the pages) writes no token past that count."""
    pages = case.num_pages + case.num_tokens
    if case.num_tokens > case.num_pages and pages * case.page_size * case.num_heads * case.head_dim <= MAX_GROWN:
        old = case.num_slots
        grown = case.replace(num_pages=pages)
        yield grown.replace(cache_loc=tuple(_still_out(s, old, grown.num_slots) for s in case.cache_loc))


def _tokens_off_heads(case: Case, plain: str) -> Iterator[Case]:
    """T moved off H both ways, a token added after the Case's and its last one dropped: code that tells the
    token axis from the head axis by their lengths (a [H] scale put on "the axis of length H") fails only
    where T = H. Both must pass, so that a bound on T alone is not read as the coincidence."""
    t = case.num_tokens
    if t >= 2 and t == case.num_heads:
        yield _with_tokens(case, t + 1)
        yield _with_tokens(case, t - 1)


def _padded_keys(case: Case, plain: str) -> Iterator[Case]:
    if case.padded_rows:
        yield case.replace(padded_rows=0)


#: In the order they are tried: the values first (so that a structural defect's minimal variant holds
#: ordinary values, which no value defect touches; the scales before them, as the ordinary values are
#: made for the scales), then shape and layout, then types and slots.
ABLATIONS: tuple[Ablation, ...] = (
    Ablation("big-cache", "only on caches above 2**31 bytes", _big_cache, keeps_shape=False),
    Ablation("empty-batch", "only for an empty batch (T = 0)", _empty, keeps_shape=False),
    Ablation("many-tokens", "only with more than one token", _tokens, keeps_shape=False),
    Ablation("tokens-equal-heads", "only when T equals H (as many tokens as heads)", _tokens_off_heads,
             keeps_shape=False),
    Ablation("special-values", "only with special input values (±0, ±inf, NaN, ties, past the range)",
             _special_values, value=True, keeps_shape=False),
    Ablation("scales-differ", "only when k_scale and v_scale differ", _scales_differ),
    Ablation("scale-value", "only for a scale other than 1.0", _scale_value, value=True),
    Ablation("values", "only for some input values", _ordinary_values, value=True, keeps_shape=False),
    *(Ablation(f"scale-kind:{kind}", f"only for a scale given as {words}", _scale_kind(kind))
      for kind, words in (("none", "None"), ("float", "a Python float"), ("tensor0d", "a 0-d tensor"),
                          ("tensor1", "a 1-element tensor"))),
    Ablation("cache-layouts-differ", "only when V's cache layout differs from K's", _layouts_differ),
    Ablation("strided-cache", "only for a strided or padded cache", _contiguous(("k_cache_layout", "v_cache_layout"),
                                                                                4)),
    Ablation("input-layouts-differ", "only when V's input layout differs from K's", _input_layouts_differ),
    Ablation("strided-input", "only for strided inputs", _contiguous(("k_layout", "v_layout"), 3)),
    Ablation("strided-loc", "only for a strided cache_loc", _loc_stride),
    Ablation("cache-uint8", "only for a uint8 cache", _cache_uint8),
    Ablation("cache-e5m2", "only for e5m2 caches", _cache_format("fp8_e5m2")),
    Ablation("cache-fnuz", "only for e4m3fnuz caches", _cache_format("fp8_e4m3fnuz")),
    Ablation("format-alias", "only when the cache format is spelled by its other name (vLLM's \"fp8_e4m3\")",
             _set("format_alias", True, False)),
    Ablation("cache-3d", "only for a 3-D cache [slots, H, D]", _set("cache_rank", 3, 4)),
    Ablation("input-2d", "only for a 2-D input [T, H*D]", _set("input_rank", 2, 3)),
    Ablation("input-float16", "only for float16 input", _input_dtype("float16")),
    Ablation("input-float32", "only for float32 input", _input_dtype("float32")),
    Ablation("loc-int32", "only for an int32 cache_loc", _set("loc_dtype", "int32", "int64")),
    Ablation("heads-not-pow2", "only when H is not a power of two", _heads, keeps_shape=False),
    Ablation("dim-not-pow2", "only when D is not a power of two", _dim, keeps_shape=False),
    Ablation("page-size", "only for some page sizes", _page_size),
    Ablation("padding", "only with padding (negative cache_loc entries)", _padding),
    Ablation("padded-keys", "only with keys padded past cache_loc's end (CUDA-graph padding: T is cache_loc's "
             "length, vllm#13922)", _padded_keys, keeps_shape=False),
    Ablation("out-of-range", "only with out-of-range slots (cache_loc >= number of slots)", _out_of_range),
    Ablation("duplicate-slots", "only when several tokens name one slot", _duplicates),
    Ablation("tokens-above-pages", "only when T exceeds the cache's number of pages (a grid or loop sized by "
             "the cache's first dimension)", _more_pages),
    Ablation("shared-page", "only when several tokens write one page", _own_pages),
    Ablation("first-slot", "only when a token names the cache's first slot (slot 0)", _edge_slot(True)),
    Ablation("last-slot", "only when a token names the cache's last slot", _edge_slot(False)),
)
def _slots_sorted(case: Case, plain: str) -> Iterator[Case]:
    """The tokens in the order of their slots (padding first), each with its own slot and overrides."""
    order = sorted(range(case.num_tokens), key=lambda t: case.cache_loc[t])
    if order == list(range(case.num_tokens)):
        return
    per = case.num_heads * case.head_dim
    place = {t: i for i, t in enumerate(order)}
    overrides = tuple(Override(o.tensor, place[o.index // per] * per + o.index % per, o.bits, o.label)
                      for o in case.overrides)
    yield case.replace(cache_loc=tuple(case.cache_loc[t] for t in order), overrides=overrides)


#: Not a step of the minimization (the plain call's slots need not be sorted; sorting would move every
#: Case): tried on a Case whose effect is whole tokens at other slots (Diagnoser._order_trigger).
SLOTS_UNSORTED = Ablation("slots-unsorted", "only when the tokens' slots are not in increasing order", _slots_sorted)
def _no_zero_head(case: Case, plain: str) -> Iterator[Case]:
    yield from ()  # a per-head Case holds one scale a cache: per_head.raise_trigger moves the [H] values itself


#: Not a step of the minimization either: a per-head call's [H] scales travel beside its Case
#: (conformance/diagnosis/per_head.py raise_trigger sets each zero head to its tensor's first nonzero scale).
HEAD_SCALE_ZERO = Ablation("head-scale-zero", "only when a per-head scale is 0 (a head calibration saw only as "
                           "zeros: amax / 448 = 0)", _no_zero_head, value=True)
BY_NAME = {a.name: a for a in (*ABLATIONS, SLOTS_UNSORTED, HEAD_SCALE_ZERO)}


# -- sizes: what a failure needs of H or D, named by probing other sizes (Diagnoser._sized) -------------

#: The sizes a minimal Case's H or D is replayed at.
SIZE_PROBES = {"heads": (1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
               "dim": (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256),  # 3: odd D, beside D = 1
               "tokens": (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)}
#: Probed besides, below a Case's own T: the tiles and chunks of a many-token Case.
LARGE_TOKEN_PROBES = (128, 256, 512)
_LETTER = {"heads": "H", "dim": "D", "tokens": "T"}


@dataclass(frozen=True)
class SizeRule:
    """A rule on H or D that a failure follows: fails(n) says whether a Case of that size fails."""

    name: str  # the trigger: "dim-not-pow2", "dim-not-multiple:8", "heads-below:4", ...
    attr: str  # "heads" or "dim"
    words: str
    fails: Callable[[int], bool]

    def holds(self, case: Case) -> bool:
        return self.fails(size_of(case, self.attr))


def size_of(case: Case, attr: str) -> int:
    """The Case's H (attr "heads"), D ("dim") or T ("tokens")."""
    return {"heads": case.num_heads, "dim": case.head_dim, "tokens": case.num_tokens}[attr]


def _size_rules(attr: str) -> list[SizeRule]:
    """In the order preferred where several fit the sizes probed: powers of two (the commonest requirement,
    a Triton arange), then multiples (a vector width), then lower and upper bounds."""
    n = _LETTER[attr]
    return [SizeRule(f"{attr}-not-pow2", attr, f"only when {n} is not a power of two", lambda x: x & (x - 1) != 0),
            *(SizeRule(f"{attr}-not-multiple:{m}", attr, f"only when {n} is not a multiple of {m}",
                       lambda x, m=m: x % m != 0) for m in (32, 16, 8, 4, 2)),
            *(SizeRule(f"{attr}-multiple:{m}", attr, f"only when {n} is a multiple of {m}" if m > 2 else
                       f"only when {n} is even", lambda x, m=m: x % m == 0)
              # 2: a grid axis interleaving K and V with heads, decomposed as pid % H (held-out batch 62)
              for m in (16, 8, 4, 2)),
            *(SizeRule(f"{attr}-below:{m}", attr, f"only when {n} is below {m}", lambda x, m=m: x < m)
              for m in (64, 32, 16, 8, 4, 2)),
            *(SizeRule(f"{attr}-above:{m}", attr, f"only when {n} is above {m}", lambda x, m=m: x > m)
              # above 1 last: only H probes 1 (heads in the wrong order)
              for m in (4, 8, 16, 32, 64, 128, 256, 512, 1))]


SIZE_RULES = {r.name: r for attr in SIZE_PROBES for r in _size_rules(attr)}


def _with_tokens(case: Case, n: int, last: bool = False) -> Case:
    """The Case's first n tokens (last: its last n), their slots and overrides; or all of them and more, each
    added token at the first slot of a page of its own past the cache's (so that no page fills up, which a
    defect of partly written pages would need), after the Case's tokens (last: before them)."""
    per = case.num_heads * case.head_dim
    start = max(case.num_tokens - n, 0) if last else 0
    kept = list(case.cache_loc[start:start + n])
    added = max(n - case.num_tokens, 0)
    pages = case.num_pages + added
    old, new = case.num_slots, pages * case.page_size
    extra = [(case.num_pages + i) * case.page_size for i in range(added)]
    locs = [_still_out(s, old, new) for s in kept]
    shift = added * per if last else 0  # the Case's tokens after the added ones
    overrides = tuple(Override(o.tensor, o.index - start * per + shift, o.bits, o.label) for o in case.overrides
                      if start * per <= o.index < (start + n) * per)
    out = case.replace(num_tokens=n, num_pages=pages, cache_loc=tuple(extra + locs if last else locs + extra),
                       overrides=overrides)
    return with_ordinary_values(case, out) if added else out


def with_ordinary_values(case: Case, variant: Case) -> Case:
    """The variant (the Case with tokens added) with ordinary values for every token, where the Case's own are
    ordinary: a random value in an added token could show another defect (a value rule), which is not what
    the tokens are added for."""
    if not any(o.label == "ordinary" for o in case.overrides):
        return variant
    others = tuple(o for o in variant.overrides if o.label != "ordinary")
    return next(_ordinary_values(variant.replace(overrides=others), ""), variant)


def resized(case: Case, attr: str, n: int, from_end: bool = False) -> Case:
    """The Case with H (attr "heads"), D ("dim") or T ("tokens") set to n; overrides keep their place where it
    is left. Fewer tokens are the first n, or with from_end the last n; more are added after the Case's (with
    from_end, before them)."""
    if attr == "tokens":
        return _with_tokens(case, n, from_end)
    return _reshaped(case, n, case.head_dim) if attr == "heads" else _reshaped(case, case.num_heads, n)


def fitting_rule(attr: str, outcomes: dict[int, bool]) -> SizeRule | None:
    """The first rule that gives every probed size's outcome (size -> failed), when some failed and some did not;
    where none does, the first that gives every outcome but size 1's (one token, one head: often a path of its
    own, a decode call's or a single KV head's, right where the general one is wrong)."""
    for sizes in (outcomes, {n: failed for n, failed in outcomes.items() if n != 1}):
        if len(set(sizes.values())) < 2:
            return None
        rule = next((r for r in _size_rules(attr) if all(r.fails(n) == failed for n, failed in sizes.items())), None)
        if rule is not None:
            return rule
    return None


def probed_rule(case: Case, attr: str, fails_at: Callable[[int], bool]) -> SizeRule | None:
    """The rule on H, D or T a failure of the Case follows where its own size fails: fails_at(n) at every other
    probed size (SIZE_PROBES), the first rule every outcome follows, where it holds for the Case; None else.
    For failures that are replayed outside the Diagnoser (per-head and per-token-head calls). A size whose Case
    loses one of the failing Case's overrides (a NaN at a lane past the new D, say) is no evidence: its passing
    would be the value's absence, not the size's."""
    own = size_of(case, attr)
    kept = [n for n in SIZE_PROBES[attr] if n != own and len(resized(case, attr, n).overrides) == len(case.overrides)]
    outcomes = {own: True, **{n: fails_at(n) for n in kept}}
    rule = fitting_rule(attr, outcomes)
    return rule if rule is not None and rule.holds(case) else None


#: A bound on a token's row in bytes (H x D x the input's element size), which the report reads off bounds on H,
#: on D and a wider input dtype that one row size parts (conformance/diagnosis/report.py, _merge_row_bytes).
ROW_BYTES = "row-bytes-above:"


def row_bytes_words(bound: int) -> str:
    return f"only when a token's row of H x D inputs is above {bound} bytes"


#: A trigger no ablation names (the plain call's scale is a tensor where the convention has one): a raise that a
#: Python float of the same value does not make (Diagnoser._trigger).
SCALE_TENSOR = "scale-tensor"
SCALE_TENSOR_WORDS = "only for a scale given as a tensor (the same value as a Python float passes)"


def as_float_scales(case: Case) -> Case | None:
    """The Case with its tensor scales given as Python floats of the same values; None where it has none."""
    tensors = {w: Scale("float", s.value) for w in ("k_scale", "v_scale")
               if (s := getattr(case, w)).kind in ("tensor0d", "tensor1")}
    return case.replace(**tensors) if tensors else None


def words(trigger: list[str]) -> str:
    """The trigger in words: 'only for a uint8 cache and only ...', or 'on the plain call'."""
    if not trigger:
        return "on the plain call"
    return "; ".join(BY_NAME[t].words if t in BY_NAME else SIZE_RULES[t].words if t in SIZE_RULES
                     else SCALE_TENSOR_WORDS if t == SCALE_TENSOR
                     else row_bytes_words(int(t[len(ROW_BYTES):])) if t.startswith(ROW_BYTES) else t
                     for t in trigger)
