"""Tests of the strategies themselves: what they draw is valid, buildable, and covers the space.

Rates are collected inside one test (an inner @given run), so they hold under pytest-xdist too;
the inner runs are derandomized so the rates never flake.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from kernel import RECIPES
from kernel.plan import ScaleArg
from kernel.recipe import get_recipe
from kernel.reference import INPUT_FORMATS, encode_e4m3, round_to_input_dtype, scaled
from strategies import cases
from strategies.build import BITS_DTYPES, DTYPES, build
from strategies.case import CACHE_DTYPES, LOC_DTYPES, SCALE_KINDS, Case, Layout, Scale
from strategies.fp import e4m3_value, f32, from_bits
from strategies.layouts import CACHE_KINDS, INPUT_KINDS, tagged_layouts
from strategies.scales import per_head_values, scale_values
from strategies.ties import (
    decisive_input_ties,
    e4m3_tie_overrides,
    input_tie_overrides,
    input_tie_recipes,
    non_dyadic_scales,
    tie_scales,
)
from strategies.values import LABELS, TARGET_LABELS, scaled_value

INNER = dict(database=None, derandomize=True, deadline=None,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LAYOUT_NAMES = ("k_layout", "v_layout", "k_cache_layout", "v_cache_layout")


def _features(case: Case) -> set[str]:
    """What a Case exercises, read off the Case itself (not from the strategies' events)."""
    f = {f"input_dtype={case.input_dtype}", f"cache_dtype={case.cache_dtype}", f"loc_dtype={case.loc_dtype}",
         f"input_rank={case.input_rank}", f"cache_rank={case.cache_rank}", f"recipe={case.recipe}"}
    f |= {f"scale={s.kind}" for s in (case.k_scale, case.v_scale)}
    f |= {f"override={o.label.rstrip('~')}" for o in case.overrides}
    f |= {f"exact-target={o.label}" for o in case.overrides if o.label in TARGET_LABELS}
    layouts = [getattr(case, n) for n in LAYOUT_NAMES]
    if any(not lay.is_contiguous() for lay in layouts) or case.loc_step > 1:
        f.add("non-contiguous")
    for lay in layouts:
        f |= {"permuted"} if lay.order != tuple(range(len(lay.order))) else set()
        f |= {"padded"} if any(lay.extra) else set()
        f |= {"inner-step"} if lay.step > 1 else set()
        f |= {"misaligned"} if lay.offset % 16 else set()
    f |= {"loc_step>1"} if case.loc_step > 1 else set()
    f |= {"padding"} if any(s < 0 for s in case.cache_loc) else set()
    real = [(t, s) for t, s in enumerate(case.cache_loc) if 0 <= s < case.num_slots]
    # real slots one run over the batch, a padded token holding its place in it: (4, -1, 6)
    f |= {"run-with-holes"} if len(real) > 1 and len(real) < case.num_tokens and all(
        s - t == real[0][1] - real[0][0] for t, s in real) and real[-1][0] - real[0][0] >= len(real) else set()
    f |= {"out-of-range"} if any(s >= case.num_slots for s in case.cache_loc) else set()
    f |= {"T=0"} if case.num_tokens == 0 else set()
    f |= {"checked"} if case.checked else set()
    return f


def test_padded_batches_are_sometimes_one_run_with_holes():
    """(4, -1, 6): the real tokens' slots one run over the batch, a padded token's slot left out inside it. In
    whole Cases it is rare (about 8 in 2000: a padded batch, a run, unshuffled, a hole inside), so it is
    checked on batches of six tokens, where about 1 in 12 is (83 in 1000 random draws)."""
    from strategies.locations import cache_locs
    seen = 0

    @settings(max_examples=200, **INNER)
    @given(cache_locs(6, 32, 4))
    def collect(loc: tuple[int, ...]) -> None:
        nonlocal seen
        seen += "run-with-holes" in _features(Case(num_tokens=6, num_heads=1, head_dim=16, page_size=4,
                                                   num_pages=8, cache_loc=loc))

    collect()
    assert seen >= 4, f"one run with holes drawn {seen} times in 200 batches of six tokens"


def test_cases_cover_the_space_at_useful_rates():
    seen: Counter[str] = Counter()
    n = 400  # rates below are a third or less of what the strategies aim at: robust across versions
    # Derandomized draws still move with the literals of the project modules imported in the process
    # (Hypothesis mixes them into generation: hypothesis/internal/constants_ast.py), so they differ by
    # xdist worker and as the code grows. T=0 is aimed at 1 in 16; 10 in 400 was seen on an H200 worker.

    @settings(max_examples=n, **INNER)
    @given(cases(allow_out_of_range=True))
    def collect(case: Case) -> None:
        seen.update(_features(case))

    collect()
    wanted = {"input_dtype=bfloat16": 0.1, "input_dtype=float16": 0.1, "input_dtype=float32": 0.03}
    wanted |= {f"cache_dtype={d}": 0.2 for d in CACHE_DTYPES}
    wanted |= {f"loc_dtype={d}": 0.2 for d in LOC_DTYPES} | {"input_rank=2": 0.2, "input_rank=3": 0.2}
    wanted |= {"cache_rank=3": 0.2, "cache_rank=4": 0.2} | {f"scale={k}": 0.15 for k in SCALE_KINDS}
    wanted |= {f"override={label}": 0.01 for label in LABELS}
    # Exact e4m3 ties are rare here (an exact input exists only for some scales) and their count moved
    # between 4 and 10 in 400 with the xdist worker a test landed on; conformance/test_ties.py puts an
    # exact tie at every element, so this only checks that the general strategy reaches them at all.
    wanted |= {"exact-target=e4m3-tie": 0.005, "exact-target=e4m3-grid": 0.02}
    wanted |= {"non-contiguous": 0.6, "permuted": 0.2, "padded": 0.2, "inner-step": 0.1, "misaligned": 0.1,
               "loc_step>1": 0.1, "padding": 0.05, "out-of-range": 0.1, "checked": 0.03}
    # T=0 moved from 10 in 400 (an H200 worker) to 3 (a CPU worker, once the e5m2 and per-token-head
    # modules brought their literals): the general strategy must reach it; empty batches have their own
    # property (conformance/test_ties.py::test_empty_batch_flat_input).
    wanted |= {"T=0": 0.005}
    low = {k: f"{seen[k] / n:.3f} < {rate}" for k, rate in wanted.items() if seen[k] < rate * n}
    assert not low, f"features drawn too rarely in {n} cases: {low}\nall counts: {dict(seen)}"


def test_every_layout_kind_is_drawn():
    seen: Counter[str] = Counter()
    shapes = st.sampled_from([("input", (5, 3, 8), None), ("input", (5, 3, 8), (1, 2)),
                              ("cache", (3, 4, 3, 8), None), ("cache", (3, 4, 3, 8), (0, 1))])

    @settings(max_examples=300, **INNER)
    @given(shapes.flatmap(lambda s: st.tuples(st.just(s), tagged_layouts(s[1], role=s[0], merged=s[2]))))
    def collect(drawn) -> None:
        (role, _, _), (_, kinds) = drawn
        seen.update(f"{role}:{k}" for k in kinds)

    collect()
    missing = [f"input:{k}" for k in INPUT_KINDS if seen[f"input:{k}"] < 5]
    missing += [f"cache:{k}" for k in CACHE_KINDS if seen[f"cache:{k}"] < 5]
    assert not missing, f"layout kinds drawn fewer than 5 times in 300: {missing}; counts {dict(seen)}"


def _offsets(layout: Layout, shape: tuple[int, ...]) -> torch.Tensor:
    offsets = torch.zeros(shape, dtype=torch.int64) + layout.offset
    for dim, stride in enumerate(layout.strides(shape)):
        index = torch.arange(shape[dim], dtype=torch.int64) * stride
        offsets = offsets + index.reshape([-1 if d == dim else 1 for d in range(len(shape))])
    return offsets.flatten()


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(BITS_DTYPES[str(x.dtype).removeprefix("torch.")])


@settings(max_examples=60, **INNER)
@given(cases(allow_out_of_range=True))
def test_every_case_is_valid_builds_and_round_trips(case: Case):
    assert Case.from_json(case.to_json()) == case, case.to_json()
    assert Case.from_json(case.to_json()).to_json() == case.to_json()
    # Layouts never overlap elements and stay inside their buffers' spans.
    for name in LAYOUT_NAMES:
        lay = getattr(case, name)
        shape = case.input_shape if name in ("k_layout", "v_layout") else case.cache_shape
        offs = _offsets(lay, shape)
        assert offs.unique().numel() == offs.numel(), f"{name} {lay} overlaps for shape {shape}"
        assert offs.numel() == 0 or int(offs.max()) < lay.span(shape), f"{name} {lay} exceeds its span"
    # Locations: unique apart from padding, and only out-of-range where asked for (here allowed).
    real = [s for s in case.cache_loc if 0 <= s < case.num_slots]
    assert len(set(real)) == len(real), f"duplicate slots in {case.cache_loc}"
    info = torch.iinfo(DTYPES[case.loc_dtype])
    assert all(info.min <= s <= info.max for s in case.cache_loc), case.cache_loc
    for scale in (case.k_scale, case.v_scale):
        assert scale.kind in SCALE_KINDS and math.isfinite(scale.value) and scale.value > 0, scale
        assert torch.tensor(scale.value, dtype=torch.float32).item() == scale.value, f"{scale} is not fp32"
        assert scale.kind != "none" or scale.value == 1.0, scale
    built = build(case, "cpu")
    assert tuple(built.k.shape[:1]) == (case.num_tokens,) and built.k.dim() == case.input_rank
    assert built.k_cache.dim() == case.cache_rank and built.cache_loc.tolist() == list(case.cache_loc)
    assert built.cache_loc.stride() == (case.loc_step,)
    # Overrides land where they say, in the logical values and in the strided views passed to a kernel.
    last = {(o.tensor, o.index): o for o in case.overrides}
    for tensor in ("k", "v"):
        logical = getattr(built, f"{tensor}_logical")
        view = getattr(built, tensor).reshape(case.input_shape)
        assert torch.equal(_bits(view), _bits(logical)), f"{tensor} view differs from its logical values"
        flat = _bits(logical).flatten()
        for (name, index), o in last.items():
            if name == tensor:
                got = int(flat[index]) & ((1 << (8 * logical.element_size())) - 1)
                assert got == o.bits, f"override {o} landed as 0x{got:X}"


@settings(max_examples=40, **INNER)
@given(cases(allow_out_of_range=True), st.integers(1, 8))
def test_padded_rows_follow_the_tokens_and_change_none_of_them(case: Case, rows: int):
    """Keys padded past cache_loc (Case.padded_rows): the T-row view is the padded view's first rows, with the
    values it holds unpadded; the padded rows hold seeded values, not the poison."""
    plain, padded = build(case, "cpu"), build(case.replace(padded_rows=rows), "cpu")
    assert plain.k_padded is None and padded.k_padded is not None
    for tensor in ("k", "v"):
        full, view = getattr(padded, f"{tensor}_padded"), getattr(padded, tensor)
        assert full.shape[0] == case.num_tokens + rows and full.shape[1:] == view.shape[1:]
        # the same storage from the same element (an empty view's data_ptr() is 0, whatever its storage)
        assert full.stride() == view.stride() and full.storage_offset() == view.storage_offset()
        assert full.untyped_storage().data_ptr() == view.untyped_storage().data_ptr()
        assert torch.equal(_bits(getattr(padded, f"{tensor}_logical")), _bits(getattr(plain, f"{tensor}_logical")))
        assert not full[case.num_tokens:].float().isnan().any()
    assert padded.implementation_call()["k"] is padded.k_padded and padded.call()["k"] is padded.k


def _reference_scaled(bits: int, dtype: str, case_scale, recipe_name: str) -> float:
    """The reference's own steps (kernel.reference.quantize before the e4m3 rounding), in torch."""
    recipe, torch_dtype = get_recipe(recipe_name), DTYPES[dtype]
    width = 8 * torch.empty((), dtype=torch_dtype).element_size()
    signed = bits - (1 << width) if bits >= 1 << (width - 1) else bits
    x = torch.tensor([signed], dtype=BITS_DTYPES[dtype])
    x = x.view(torch_dtype)
    s = 1.0 if case_scale.kind == "none" else case_scale.value
    return scaled(x, ScaleArg("float", s, None), recipe).item()


@settings(max_examples=80, **INNER)
@given(cases(max_overrides=6), st.data())
def test_targeted_overrides_hit_their_targets_under_the_reference(case: Case, data):
    """An exact target label means the reference's scaled value equals the drawn target: the
    pure-Python arithmetic of strategies.values agrees with the reference's torch steps."""
    for o in case.overrides:
        scale = case.k_scale if o.tensor == "k" else case.v_scale
        ref = _reference_scaled(o.bits, case.input_dtype, scale, case.recipe)
        ours = scaled_value(from_bits(o.bits, case.input_dtype), scale, get_recipe(case.recipe), case.input_dtype)
        assert ref == ours or (math.isnan(ref) and math.isnan(ours)), \
            f"{o}: reference scales to {ref!r}, strategies.values computed {ours!r} ({case.recipe}, {scale})"


@settings(max_examples=40, **INNER)
@given(cases(allow_out_of_range=False))
def test_no_out_of_range_entries_unless_asked(case: Case):
    assert all(s < case.num_slots for s in case.cache_loc), case.cache_loc


@settings(max_examples=40, **INNER)
@given(cases(contiguous=True, input_dtypes=["float16"], cache_ranks=[3], scale_kinds=["tensor1"], max_overrides=0,
             padding=False))
def test_restriction_knobs_restrict(case: Case):
    assert all(getattr(case, n).is_contiguous() for n in LAYOUT_NAMES) and case.loc_step == 1
    assert case.input_dtype == "float16" and case.cache_rank == 3 and not case.overrides
    assert case.k_scale.kind == case.v_scale.kind == "tensor1"
    assert all(s >= 0 for s in case.cache_loc)


# -- strategies.ties: the inputs land exactly on the ties they claim, under the reference's torch steps
def _pre_intermediate(bits: int, dtype: str, scale: float, recipe_name: str) -> torch.Tensor:
    """The reference's fp32 scaled value before any rounding to the input dtype."""
    recipe = get_recipe(recipe_name)
    return torch.tensor(_reference_scaled(bits, dtype, Scale("float", scale),
                                          dataclasses.replace(recipe, intermediate="none")))


E4M3_MIDPOINTS = {(e4m3_value(b) + e4m3_value(b + 1)) / 2 for b in range(0x7E)}


@settings(max_examples=30, **INNER)
@given(st.data())
def test_e4m3_tie_overrides_hit_e4m3_midpoints(data):
    recipe = data.draw(st.sampled_from(sorted(RECIPES)), label="recipe")
    ks, vs = data.draw(non_dyadic_scales(), label="k_scale"), data.draw(non_dyadic_scales(), label="v_scale")
    n = data.draw(st.integers(1, 8), label="n")
    ties = data.draw(e4m3_tie_overrides(n, ks, vs, recipe), label="ties")
    assert len(ties) >= n, f"only {len(ties)} of {2 * n} positions got a tie ({recipe}, {ks}, {vs})"
    for o in ties:
        s = ks if o.tensor == "k" else vs
        y = _pre_intermediate(o.bits, "float32", s, recipe)
        assert abs(y.item()) in E4M3_MIDPOINTS, f"{o} scales to {y.item()!r}, not an e4m3 midpoint ({recipe}, {s})"
        if o.label == "e4m3-tie-op-sensitive":
            other = "divide" if get_recipe(recipe).scale_op == "mul_reciprocal" else "mul_reciprocal"
            flipped = dataclasses.replace(get_recipe(recipe), scale_op=other)
            y2 = torch.tensor(_reference_scaled(o.bits, "float32", Scale("float", s), flipped))
            b1, b2 = encode_e4m3(y.view(1), get_recipe(recipe)), encode_e4m3(y2.view(1), get_recipe(recipe))
            assert not torch.equal(b1, b2), f"{o}: x*(1/s) and x/s give the same byte {b1.item():#x} at s={s}"


@settings(max_examples=30, **INNER)
@given(st.data())
def test_input_tie_overrides_are_decisive_ties(data):
    recipe = data.draw(st.sampled_from(input_tie_recipes()), label="recipe")
    dtype = data.draw(st.sampled_from(("bfloat16", "float16")), label="dtype")
    ks = data.draw(st.sampled_from(tie_scales(recipe, dtype)), label="k_scale")
    vs = data.draw(st.sampled_from(tie_scales(recipe, dtype)), label="v_scale")
    ties = data.draw(input_tie_overrides(4, dtype, ks, vs, recipe), label="ties")
    fmt = INPUT_FORMATS[DTYPES[dtype]]
    assert len(ties) == 8
    for o in ties:
        s = ks if o.tensor == "k" else vs
        y = _pre_intermediate(o.bits, dtype, s, recipe).view(1)
        rne = round_to_input_dtype(y, fmt)
        other = 2 * y.double() - rne.double()  # the tie's other neighbour, if y is exactly halfway
        exact = other.float().double() == other and torch.equal(round_to_input_dtype(other.float(), fmt), other.float())
        assert exact and not torch.equal(other.float(), rne), f"{o}: {y.item()!r} is no {dtype} tie (s={s}, {recipe})"
        b1, b2 = encode_e4m3(rne, get_recipe(recipe)), encode_e4m3(other.float(), get_recipe(recipe))
        assert not torch.equal(b1, b2), f"{o}: both neighbours of the {dtype} tie {y.item()!r} give {b1.item():#x}"


def test_tie_scales_exist_for_the_intermediate_recipes():
    assert "unfused" in input_tie_recipes(), input_tie_recipes()
    assert 0x3C0B in decisive_input_ties("unfused", "bfloat16", f32(2 / 3))  # the catalogue's bf16-ties-away hint


@settings(max_examples=30, deadline=None)
@given(case=cases(min_heads=2, max_heads=3))
def test_min_heads_is_a_floor(case) -> None:
    assert 2 <= case.num_heads <= 3, case.num_heads


def test_per_head_scales_hold_a_zero_head_at_a_useful_rate() -> None:
    """A head calibration saw only as zeros (scale 0) is drawn, never as head 0 (the shrink target)."""
    seen: Counter[str] = Counter()

    @settings(max_examples=200, **INNER)
    @given(per_head_values(4))
    def collect(values: tuple[float, ...]) -> None:
        assert values[0] > 0.0, values
        assert all(v >= 0.0 and math.isfinite(v) for v in values), values
        seen["zero head"] += 0.0 in values

    collect()
    assert seen["zero head"] >= 20, f"a zero head in {seen['zero head']} of 200 draws of four heads"


def test_scales_hold_a_value_near_one_at_a_useful_rate() -> None:
    """A scale within 2**-8 of 1 but not 1 (a fast path that skips the division for "a bf16-rounded 1.0" writes
    such a scale's values unscaled; held-out batch 51's went unseen)."""
    seen = Counter()

    @settings(max_examples=300, **INNER)
    @given(scale_values())
    def collect(value: float) -> None:
        seen["near one"] += value != 1.0 and abs(value - 1.0) <= 2.0**-8

    collect()
    assert seen["near one"] >= 5, f"a scale near 1 in {seen['near one']} of 300 draws"


def test_min_heads_is_checked_when_the_strategy_is_built() -> None:
    for bad in (dict(min_heads=0), dict(min_heads=4, max_heads=3), dict(min_heads=True)):
        with pytest.raises(InvalidArgument, match="min_heads"):
            cases(**bad)
    with pytest.raises(InvalidArgument, match="per_head_values"):
        per_head_values(1)
