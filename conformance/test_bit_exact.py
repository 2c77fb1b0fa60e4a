"""Bit-exact: the implementation's bytes equal the reference's over both whole caches."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from conformance.harness import check_case
from strategies import cases


@given(data=st.data())
def test_bit_exact(data, impl, device, recipes):
    case = data.draw(cases(recipes=recipes), label="case")
    check_case(case, impl, device)
