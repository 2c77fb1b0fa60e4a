"""How often the strategies the properties use draw each exact rounding tie, measured, not assumed.

Every rounding step of kernel/recipe.py must meet its exact ties: random data and random scales
almost never land exactly halfway between two representable values, and a wrong tie rule shows
nowhere else. A "tie in format F" is decided here by strategies.fp.is_tie (the value is an odd
multiple of half F's quantum in its binade), and RNE's choice by the parity of the lower neighbour
(strategies.fp.tie_lower_bits: even rounds down, odd up), so each class below is (format, parity):

- the scale rounded to the input dtype (recipes with scale_dtype == "input"): scales that are bf16
  and fp16 ties, and their fp32 neighbours, in conformance/test_bit_exact.py's draws (every scale
  kind, K and V) and in conformance/test_ties.py::test_scale_ties's;
- the quotient rounded to the input dtype: conformance/test_ties.py::test_input_dtype_ties's inputs;
- the e4m3 rounding: conformance/test_ties.py::test_e4m3_ties's fp32 inputs, and the bf16/fp16 data
  that test_bit_exact builds (its pre-e4m3 values, through the reference's own steps).

(1/s and x / s in fp32 have no exact ties that change a byte: docs/strategies.md says why.)
Rates are collected by inner derandomized @given runs, so they never flake; the minimums are a half
or less of what was measured, because derandomized draws still move with the literals of the modules
a process imports (meta_tests/test_strategies.py says more).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel.plan import ScaleArg
from kernel.recipe import Recipe, get_recipe
from kernel.reference import INPUT_FORMATS, round_to_input_dtype, scaled
from strategies import cases
from strategies.build import build
from strategies.case import Case, Scale
from strategies.fp import E4M3_MAX, FORMATS, fp32_step, from_bits, is_tie, round_to, tie_lower_bits
from strategies.scales import TIE_DTYPES, scale_tie_values
from strategies.ties import (
    E4M3,
    e4m3_tie_overrides,
    input_tie_overrides,
    input_tie_recipes,
    non_dyadic_scales,
    pre_intermediate,
    scale_rounding_pair,
    scale_tie_overrides,
    scale_tie_recipes,
    tie_scales,
)
from strategies.values import scaled_value

INNER = dict(database=None, derandomize=True, deadline=None,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])


def _parity(x: float, dtype: str) -> str:
    return "odd" if tie_lower_bits(x, dtype) & 1 else "even"


def scale_class(value: float, dtype: str) -> str | None:
    """"{dtype} tie even|odd" for a tie of dtype, "{dtype} ulp" one fp32 ulp from one, else None."""
    fmt = FORMATS[dtype]
    if is_tie(value, fmt):
        return f"{dtype} tie {_parity(value, dtype)}"
    if any(is_tie(fp32_step(value, k), fmt) for k in (-1, 1)):
        return f"{dtype} ulp"
    return None


def _low(seen: Counter[str], n: int, wanted: dict[str, float]) -> dict[str, str]:
    return {k: f"{seen[k]}/{n} < {rate}" for k, rate in wanted.items() if seen[k] < rate * n}


# -- the scale's rounding to the input dtype ------------------------------------------------------
@pytest.mark.parametrize("recipe_name", scale_tie_recipes())
def test_bit_exact_draws_scale_ties_of_every_class_kind_and_tensor(recipe_name: str):
    """What test_bit_exact draws for a recipe that rounds the scale: bf16 and fp16 ties with even and
    odd lower neighbours and their fp32 neighbours (share of Cases), as float / 0-d / 1-element
    scales of K and V."""
    seen: Counter[str] = Counter()
    n = 500

    @settings(max_examples=n, **INNER)
    @given(cases(recipes=(recipe_name,), allow_out_of_range=True))
    def collect(case: Case) -> None:
        drawn = set()
        for tensor, scale in (("k", case.k_scale), ("v", case.v_scale)):
            if scale.kind == "none" or case.input_dtype not in TIE_DTYPES:
                continue
            cls = scale_class(scale.value, case.input_dtype)
            if cls:
                drawn |= {cls, f"{tensor} {cls.split()[1]}", f"{scale.kind} {cls.split()[1]}"}
        seen.update(drawn)

    collect()
    wanted = {f"{d} {c}": 0.015 for d in TIE_DTYPES for c in ("tie even", "tie odd")}
    wanted |= {f"{d} ulp": 0.03 for d in TIE_DTYPES} | {f"{t} tie": 0.05 for t in ("k", "v")}
    wanted |= {f"{kind} tie": 0.03 for kind in ("float", "tensor0d", "tensor1")}
    low = _low(seen, n, wanted)
    assert not low, f"{recipe_name}: scale tie classes drawn too rarely in {n} cases: {low}\nall: {dict(seen)}"


def test_scale_tie_property_draws_every_class():
    """test_scale_ties's scales (scale_tie_values): ties rounded down and up, fp32 neighbours below and
    above, and the edges; the reference rounds each to one of its two dtype neighbours, by RNE."""
    seen: Counter[str] = Counter()
    n = 400

    @settings(max_examples=n, **INNER)
    @given(st.sampled_from(TIE_DTYPES).flatmap(lambda d: st.tuples(st.just(d), scale_tie_values(d))))
    def collect(drawn: tuple[str, float]) -> None:
        dtype, s = drawn
        cls = scale_class(s, dtype)
        assert cls, f"{s!r} is neither a {dtype} tie nor one fp32 ulp from one"
        lower, upper = scale_rounding_pair(s, dtype)
        seen[cls] += 1
        if "ulp" in cls:
            seen[f"{dtype} {'below' if s < (lower + upper) / 2 else 'above'}"] += 1
        if lower == 0:
            seen[f"{dtype} zero-tie"] += 1
        elif math.isinf(upper):
            seen[f"{dtype} overflow-tie"] += 1
        elif lower < 2.0 ** FORMATS[dtype].min_normal_exp:
            seen[f"{dtype} subnormal"] += 1
        rounded = round_to_input_dtype(torch.tensor([s]), INPUT_FORMATS[getattr(torch, dtype)]).item()
        assert rounded == round_to(s, FORMATS[dtype]) and rounded in (lower, upper), (s, rounded, lower, upper)

    collect()
    wanted = {f"{d} {c}": 0.08 for d in TIE_DTYPES for c in ("tie even", "tie odd")}
    wanted |= {f"{d} {c}": 0.02 for d in TIE_DTYPES for c in ("below", "above")}
    wanted |= {f"{d} subnormal": 0.015 for d in TIE_DTYPES}
    # Each of these two edges is one value (and its two fp32 neighbours) per dtype, reached by 5 or 6
    # choice sequences, and Hypothesis runs a sequence once: 5 or 6 in 400 is all there can be here.
    wanted |= {f"{d} {c}": 3 / n for d in TIE_DTYPES for c in ("zero-tie", "overflow-tie")}
    low = _low(seen, n, wanted)
    assert not low, f"scale tie classes drawn too rarely in {n} draws: {low}\nall: {dict(seen)}"


@settings(max_examples=30, **INNER)
@given(st.data())
def test_scale_tie_overrides_tell_the_two_roundings_apart(data: st.DataObject):
    """test_scale_ties's inputs: each one's byte differs between the two roundings of its scale,
    re-derived in pure Python (strategies.values.scaled_value and an e4m3 rounding) rather than with
    the reference's torch steps that found them."""
    recipe = get_recipe(data.draw(st.sampled_from(scale_tie_recipes()), label="recipe"))
    dtype = data.draw(st.sampled_from(TIE_DTYPES), label="dtype")
    ks = data.draw(scale_tie_values(dtype), label="k_scale")
    vs = data.draw(scale_tie_values(dtype), label="v_scale")
    for o in data.draw(scale_tie_overrides(2, dtype, ks, vs, recipe), label="ties"):
        x = from_bits(o.bits, dtype)
        pair = scale_rounding_pair(ks if o.tensor == "k" else vs, dtype)
        lo, hi = (_e4m3(scaled_value(x, Scale("float", s), _fp32_scale(recipe), dtype), recipe) for s in pair)
        assert lo != hi, f"{o} ({x!r}) gives {lo} at both roundings {pair} of its scale ({recipe.name})"


def _fp32_scale(recipe: Recipe) -> Recipe:
    return dataclasses.replace(recipe, scale_dtype="fp32")


def _e4m3(y: float, recipe: Recipe) -> tuple[float, bool] | str:
    """What decides an e4m3 byte, in pure Python: the rounded value after the overflow rule, and the sign."""
    if math.isnan(y):
        return "nan"
    q = round_to(y, E4M3)
    if abs(q) > E4M3_MAX:
        return "nan" if recipe.overflow == "nan" else (E4M3_MAX, q < 0)
    return abs(q), math.copysign(1.0, q) < 0


# -- the quotient's rounding to the input dtype ----------------------------------------------------
def test_input_dtype_tie_property_draws_both_parities():
    """test_input_dtype_ties's inputs: for each recipe and dtype, ties rounded down and up by RNE."""
    seen: Counter[str] = Counter()
    n = 120

    @settings(max_examples=n, **INNER)
    @given(st.data())
    def collect(data: st.DataObject) -> None:
        recipe = data.draw(st.sampled_from(input_tie_recipes()), label="recipe")
        dtype = data.draw(st.sampled_from(TIE_DTYPES), label="dtype")
        ks = data.draw(st.sampled_from(tie_scales(recipe, dtype)), label="k_scale")
        vs = data.draw(st.sampled_from(tie_scales(recipe, dtype)), label="v_scale")
        for o in data.draw(input_tie_overrides(2, dtype, ks, vs, recipe), label="ties"):
            y = pre_intermediate(from_bits(o.bits, dtype), ks if o.tensor == "k" else vs, get_recipe(recipe),
                                 FORMATS[dtype])
            assert is_tie(y, FORMATS[dtype]), f"{o}: {y!r} is no {dtype} tie"
            seen[f"{recipe} {dtype} {_parity(y, dtype)}"] += 1

    collect()
    total = sum(seen.values())
    wanted = {f"{r} {d} {p}": 0.02 for r in input_tie_recipes() for d in TIE_DTYPES for p in ("even", "odd")}
    low = _low(seen, total, wanted)
    assert not low, f"input-dtype tie classes too rare among {total} tie inputs: {low}\nall: {dict(seen)}"


# -- the e4m3 rounding ----------------------------------------------------------------------------
def test_e4m3_tie_property_draws_both_parities_and_op_sensitive_inputs():
    """test_e4m3_ties's inputs: e4m3 midpoints rounded down and up, and inputs where x * (1/s) and
    x / s round to different bytes, for every recipe."""
    seen: Counter[str] = Counter()
    n = 60

    @settings(max_examples=n, **INNER)
    @given(st.data())
    def collect(data: st.DataObject) -> None:
        recipe = data.draw(st.sampled_from(sorted(scale_tie_recipes() + input_tie_recipes() + ("single", "divide"))),
                           label="recipe")
        ks, vs = data.draw(non_dyadic_scales(), label="k_scale"), data.draw(non_dyadic_scales(), label="v_scale")
        for o in data.draw(e4m3_tie_overrides(2, ks, vs, recipe), label="ties"):
            y = pre_intermediate(from_bits(o.bits, "float32"), ks if o.tensor == "k" else vs, get_recipe(recipe),
                                 FORMATS["float32"])
            assert is_tie(y, E4M3), f"{o}: {y!r} is no e4m3 tie"
            seen[f"e4m3 {'odd' if _e4m3_lower_odd(y) else 'even'}"] += 1
            seen[o.label] += 1

    collect()
    total = seen["e4m3 odd"] + seen["e4m3 even"]
    low = _low(seen, total, {"e4m3 even": 0.3, "e4m3 odd": 0.3, "e4m3-tie-op-sensitive": 0.08})
    assert not low, f"e4m3 tie classes too rare among {total} tie inputs: {low}\nall: {dict(seen)}"


def _e4m3_lower_odd(y: float) -> bool:
    """The e4m3 value below |y| has an odd mantissa (its byte's last bit): RNE rounds the tie up."""
    q = 2.0 ** max(math.frexp(abs(y))[1] - 1 - E4M3.mantissa_bits, E4M3.min_normal_exp - E4M3.mantissa_bits)
    return int(math.floor(abs(y) / q)) % 2 == 1


def test_bit_exact_data_meets_e4m3_ties_in_bf16_and_fp16():
    """Cases like test_bit_exact's (bf16/fp16, every recipe; smaller, to build fast): the share of
    elements of K and V whose pre-e4m3 value (the reference's own steps, the intermediate rounding
    included) is an e4m3 tie, of each parity, among those in e4m3's normal range below 448. The
    seeded data is 2**E * (1 + f) scaled by s: at a power-of-two scale, 1 in 16 bf16 values (the 4
    mantissa bits e4m3 drops are 1000) and 1 in 128 fp16 values (7 bits) sit on a midpoint."""
    seen: Counter[str] = Counter()
    n = 80

    @settings(max_examples=n, **INNER)
    @given(cases(input_dtypes=TIE_DTYPES, max_tokens=4, max_heads=2, max_dim=64, allow_out_of_range=True))
    def collect(case: Case) -> None:
        built = build(case, "cpu")
        for tensor, s in (("k", case.k_scale), ("v", case.v_scale)):
            scale = ScaleArg("float", 1.0 if s.kind == "none" else s.value, None)
            y = scaled(getattr(built, f"{tensor}_logical").flatten(), scale, get_recipe(case.recipe)).double().abs()
            y = y[(y >= 2.0**E4M3.min_normal_exp) & (y < E4M3_MAX)]  # subnormal ties: test_e4m3_ties
            _, e = torch.frexp(y)
            k = y / torch.pow(2.0, e - 2 - E4M3.mantissa_bits)  # y / half the e4m3 quantum: odd at a tie
            ties = k[k % 2 == 1]
            seen[case.input_dtype] += y.numel()
            seen.update(f"{case.input_dtype} {'odd' if int(t) // 2 % 2 else 'even'}" for t in ties.tolist())

    collect()
    low = {f"{d} {p}": f"{seen[f'{d} {p}']}/{seen[d]} < {rate}" for d, rate in (("bfloat16", 0.01), ("float16", 0.002))
           for p in ("even", "odd") if seen[f"{d} {p}"] < rate * seen[d]}
    assert not low, f"e4m3 ties too rare among the in-range elements of {n} cases: {low}\nall: {dict(seen)}"
