"""Bit-exact: the implementation's bytes equal the reference's over both whole caches.

One test per recipe (or just --recipe), so pytest-xdist spreads the recipes over workers.
On CUDA the cases are drawn larger (more tokens, heads and pages) than under the interpreter.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conformance.harness import check_case
from kernel import RECIPES
from strategies import cases


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "recipe" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("recipe")
        metafunc.parametrize("recipe", [chosen] if chosen else list(RECIPES))


@given(data=st.data())
def test_bit_exact(data, impl, device, recipe):
    size = "large" if device.type == "cuda" else "small"
    case = data.draw(cases(recipes=(recipe,), size=size, allow_out_of_range=True), label="case")
    check_case(case, impl, device)
