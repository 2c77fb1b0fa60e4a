"""examples/vllm_per_token_head.py, vLLM's per-token-head write in plain torch, matches the reference's
per-token-head-vllm recipe byte for byte: whole caches, whole scale caches (guards included), inputs untouched.

Its convention (keyword-only scale caches, 4-D caches, [T, H, D] inputs) is not one of conformance.conventions',
so the call is spelled here; cases come from strategies.per_token_head with every special head kind.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import kernel
from conformance.impls import test_device as _test_device  # not collected as a test
from conformance.test_per_token_head import diff
from examples.vllm_per_token_head import reshape_and_cache
from strategies.cases import cases
from strategies.per_token_head import build_pth, pth_cases

DEVICE = _test_device()


@given(data=st.data())
def test_vllm_per_token_head_example_matches_the_reference(data):
    base = cases(size="small", scale_kinds=("none",), recipes=("single",), allow_out_of_range=True,
                 cache_ranks=(4,), input_ranks=(3,), checked=False)
    pc = data.draw(pth_cases(base, modes=("per-token-head-vllm",), layouts=("separate",)), label="pth_case")
    expected, actual = build_pth(pc, DEVICE), build_pth(pc, DEVICE)
    kernel.naive_fp8_set_kv_buffer(**expected.call())
    b = actual.built
    reshape_and_cache(b.k, b.v, b.k_cache, b.v_cache, b.cache_loc, k_scale_cache=actual.k_scale_cache,
                      v_scale_cache=actual.v_scale_cache)
    report = diff(expected.buffers, actual.buffers)
    assert report is None, f"examples/vllm_per_token_head.py differs from the reference:\n{report}"
