"""Exact ties: every element of K and V scales to a rounding tie, and the bytes must still match.

Random data almost never lands exactly halfway between two representable values, so the general
properties rarely see the cases where the tie rule, x * (1/s) versus x / s, or the intermediate
rounding decide the byte. Here every input element is chosen (strategies.ties) to hit one:

- test_e4m3_ties: fp32 inputs (their intermediate rounding is the identity, so every recipe is
  reached) whose scaled value is exactly an e4m3 midpoint, at a non-dyadic scale, preferring
  inputs where the other scale operation would round to the other side.
- test_input_dtype_ties: bf16/fp16 inputs whose fp32 scaled value is exactly halfway between two
  bf16/fp16 values whose e4m3 bytes differ, so the intermediate rounding's tie rule is visible.
- test_scale_ties: for recipes that round the scale to the input dtype (unfused-tensor0d), a scale
  that is itself exactly halfway between two bf16/fp16 values (or one fp32 ulp from such a tie), and
  inputs whose byte differs between the scale's two possible roundings, so the scale's tie rule
  decides every byte. The random scales of the other properties meet such ties only sometimes.
- test_empty_batch_flat_input: T = 0 with [T, H*D] inputs is a no-op (the split of an empty
  [0, H*D] tensor into [0, H, D] must not infer T from the element count).

Cases are kept tiny (T <= 2, H <= 2, D <= 8): the interpreter's cost is per program instance.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.harness import check_case
from strategies import Scale
from strategies._cache import sampled
from strategies.case import Case, Override
from strategies.scales import TIE_DTYPES, scale_tie_values
from strategies.ties import (
    e4m3_tie_overrides,
    input_tie_overrides,
    input_tie_recipes,
    non_dyadic_scales,
    scale_tie_overrides,
    scale_tie_recipes,
    tie_scales,
)

TINY = dict(max_tokens=2, max_heads=2, max_dim=8, max_overrides=0)
TENSOR_OR_FLOAT = ("float", "tensor0d", "tensor1")


def _check_at_ties(data: st.DataObject, case: Case, ks: float, vs: float,
                  ties: Callable[[int], st.SearchStrategy[tuple[Override, ...]]], impl, device) -> None:
    """The Case with its scales' values set to ks and vs (their kinds kept) and every element one of
    the drawn ties (`ties(elements)`), through check_case."""
    overrides = data.draw(ties(math.prod(case.input_shape)), label="ties")
    check_case(dataclasses.replace(case, k_scale=Scale(case.k_scale.kind, ks), v_scale=Scale(case.v_scale.kind, vs),
                                   overrides=overrides), impl, device)


@given(data=st.data())
def test_e4m3_ties(data, impl, device, recipes):
    recipe = data.draw(sampled(recipes), label="recipe")
    case = data.draw(impl.cases(recipes=(recipe,), input_dtypes=("float32",), scale_kinds=TENSOR_OR_FLOAT, **TINY),
                     label="base_case")
    ks = data.draw(non_dyadic_scales(), label="k_scale_value")
    vs = data.draw(non_dyadic_scales(), label="v_scale_value")
    _check_at_ties(data, case, ks, vs, lambda n: e4m3_tie_overrides(n, ks, vs, recipe), impl, device)


@given(data=st.data())
def test_input_dtype_ties(data, impl, device, recipes):
    held = tuple(r for r in input_tie_recipes() if r in recipes)
    if not held:
        pytest.skip(f"recipe {'/'.join(recipes)} rounds to e4m3 only: no bf16/fp16 tie decides its byte")
    recipe = data.draw(sampled(held), label="recipe")
    dtype = data.draw(sampled(("bfloat16", "float16")), label="input_dtype")
    case = data.draw(impl.cases(recipes=(recipe,), input_dtypes=(dtype,), scale_kinds=TENSOR_OR_FLOAT, **TINY),
                     label="base_case")
    ks = data.draw(sampled(tie_scales(recipe, dtype)), label="k_scale_value")
    vs = data.draw(sampled(tie_scales(recipe, dtype)), label="v_scale_value")
    _check_at_ties(data, case, ks, vs, lambda n: input_tie_overrides(n, dtype, ks, vs, recipe), impl, device)


@given(data=st.data())
def test_scale_ties(data, impl, device, recipes):
    held = tuple(r for r in scale_tie_recipes() if r in recipes)
    if not held:
        pytest.skip(f"recipe {'/'.join(recipes)} reads the scale as fp32: no bf16/fp16 tie of the scale exists")
    recipe = data.draw(sampled(held), label="recipe")
    dtype = data.draw(sampled(TIE_DTYPES), label="input_dtype")
    case = data.draw(impl.cases(recipes=(recipe,), input_dtypes=(dtype,), scale_kinds=TENSOR_OR_FLOAT, **TINY),
                     label="base_case")
    ks = data.draw(scale_tie_values(dtype), label="k_scale_value")
    vs = data.draw(scale_tie_values(dtype), label="v_scale_value")
    _check_at_ties(data, case, ks, vs, lambda n: scale_tie_overrides(n, dtype, ks, vs, recipe), impl, device)


@given(data=st.data())
def test_empty_batch_flat_input(data, impl, device):
    case = data.draw(impl.cases(max_tokens=0, input_ranks=(2,), allow_out_of_range=True), label="case")
    assert case.num_tokens == 0 and case.input_rank == 2, f"the strategy drew {case}"
    check_case(case, impl, device)
