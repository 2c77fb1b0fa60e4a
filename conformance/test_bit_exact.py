"""Bit-exact: the implementation's bytes equal the reference's over both whole caches.

One test per recipe held (every recipe for an implementation told `recipe=`, else the one it is held
to: --recipe, or identified), so pytest-xdist spreads the recipes over workers.
On CUDA the cases are drawn larger (more tokens, heads and pages) than under the interpreter.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from conformance.harness import check_case


@given(data=st.data())
def test_bit_exact(data, impl, device, recipe):
    size = "large" if device.type == "cuda" else "small"
    case = data.draw(impl.cases(recipes=(recipe,), size=size, allow_out_of_range=True), label="case")
    check_case(case, impl, device)
