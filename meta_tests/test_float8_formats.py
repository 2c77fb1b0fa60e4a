"""Which implementations with no format argument are held to e5m2 and e4m3fnuz bytes (conformance/fp8_formats.py).

SGLang's signature has no format argument: a float8_e5m2 or float8_e4m3fnuz cache tensor says the format.
- One that writes some format beyond e4m3 right on a plain call reads the dtype: every format it accepts is
  held to that format's bytes (a kernel that writes e4m3fnuz caches with e4m3fn's table is found there).
- One that writes none of them right (written for e4m3 alone, taking any float8 cache) is not held to their
  bytes: accepting such a cache is one argument-contract finding naming the cache, and the format's
  properties skip, saying why.
- One that raises on a plain call declines the format: its properties skip with the error; but not one whose
  call raises in e4m3 too (the plain call is asked with a scale kind its e4m3 twin takes).
"""

from __future__ import annotations

import pytest
import torch

from conformance.conventions import detect
from conformance.diagnosis.classify import ALONE_MUTATIONS, ALONE_TEST, classify_failure
from conformance.fp8_formats import E5M2, FNUZ, check_edges, check_float8_cache_alone, held
from conformance.harness import ConformanceFailure
from conformance.impls import Implementation
from conformance.test_e5m2 import EDGES as E5M2_EDGES
from conformance.test_fnuz import EDGES as FNUZ_EDGES
from kernel import naive_fp8_set_kv_buffer

CPU = torch.device("cpu")
FORMAT_OF = {torch.float8_e5m2: "fp8_e5m2", torch.float8_e4m3fnuz: "fp8_e4m3fnuz"}


def e4m3_only(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True):
    """Writes e4m3 bytes into any cache, whatever its dtype (a bit copy through an e4m3 view)."""
    e4m3 = [c.view(torch.float8_e4m3fn) for c in (k_cache, v_cache)]
    naive_fp8_set_kv_buffer(k, v, *e4m3, cache_loc, k_scale, v_scale, page_size, recipe="single")


def fnuz_as_fn(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True):
    """Reads the cache's dtype, but its table sends e4m3fnuz caches to e4m3fn's encoding."""
    fmt = FORMAT_OF.get(k_cache.dtype) if k_cache.dtype != torch.float8_e4m3fnuz else None
    caches = (k_cache, v_cache) if fmt else [c.view(torch.float8_e4m3fn) for c in (k_cache, v_cache)]
    naive_fp8_set_kv_buffer(k, v, *caches, cache_loc, k_scale, v_scale, page_size, recipe="single",
                            cache_dtype=fmt)


def e4m3_checked(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True):
    """Refuses every cache but e4m3's."""
    if k_cache.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise TypeError(f"k_cache must be float8_e4m3fn or uint8, got {k_cache.dtype}")
    e4m3_only(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size)


def fnuz_as_fn_needs_scales(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                            use_triton=True):
    """fnuz_as_fn, and a second defect: a None scale raises (in every format)."""
    float(k_scale), float(v_scale)
    fnuz_as_fn(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size)


def swapped_reads_dtype(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                        use_triton=True):
    """Reads every cache's dtype right, but writes K into v_cache and V into k_cache (wrong in every format)."""
    naive_fp8_set_kv_buffer(v, k, k_cache, v_cache, cache_loc, v_scale, k_scale, page_size, recipe="single",
                            cache_dtype=FORMAT_OF.get(k_cache.dtype))


def _impl(fn) -> Implementation:
    return Implementation(f"meta-{fn.__name__}", fn, convention=detect(fn), recipe="single")


@pytest.fixture(autouse=True)
def _failures_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path / "failures"))


@pytest.mark.parametrize("fmt, module", [(E5M2, "test_e5m2"), (FNUZ, "test_fnuz")])
def test_a_kernel_that_ignores_the_dtype_is_one_argument_contract_finding(fmt, module):
    impl = _impl(e4m3_only)
    with pytest.raises(ConformanceFailure, match="does not validate") as info:
        check_float8_cache_alone(impl, CPU, fmt)
    [finding] = classify_failure(info.value, ALONE_TEST, module, {}, impl, CPU)
    assert (finding.key, finding.cls) == ("validation:accepted", "validation"), finding
    assert finding.facts["mutation"] == ALONE_MUTATIONS[module] and "into e4m3 caches" in finding.title, finding
    with pytest.raises(pytest.skip.Exception, match=ALONE_TEST):  # its bytes are not held to the format
        held(impl, fmt, CPU)


def test_a_kernel_that_reads_the_dtype_is_held_to_each_format_it_accepts():
    impl = _impl(fnuz_as_fn)
    assert held(impl, E5M2, CPU) is impl and held(impl, FNUZ, CPU) is impl
    check_float8_cache_alone(impl, CPU, E5M2)  # written as e5m2: nothing to refuse
    check_edges(E5M2_EDGES, "float8_e5m2", impl, CPU, "single", E5M2)
    with pytest.raises(pytest.skip.Exception, match="held to e4m3fnuz's bytes by the properties"):
        check_float8_cache_alone(impl, CPU, FNUZ)
    with pytest.raises(ConformanceFailure, match="differs from the reference at e4m3fnuz's edges"):
        check_edges(FNUZ_EDGES, "float8_e4m3fnuz", impl, CPU, "single", FNUZ)
    with pytest.raises(pytest.skip.Exception, match="takes no format argument: a uint8 cache holds"):
        check_edges(FNUZ_EDGES, "uint8", impl, CPU, "single", FNUZ)


@pytest.mark.parametrize("fmt", [E5M2, FNUZ], ids=["e5m2", "fnuz"])
def test_a_kernel_that_refuses_the_format_declines_it(fmt):
    impl = _impl(e4m3_checked)
    for check in (lambda: held(impl, fmt, CPU), lambda: check_float8_cache_alone(impl, CPU, fmt)):
        with pytest.raises(pytest.skip.Exception, match=f"declines {fmt.dtype} caches: .*TypeError"):
            check()


def test_a_call_that_raises_in_e4m3_too_does_not_decline_the_format():
    """The plain call is asked with a scale kind its e4m3 twin takes: a kernel that refuses None scales in
    every format (another defect) still reads the dtype, and is held to e4m3fnuz's bytes."""
    impl = _impl(fnuz_as_fn_needs_scales)
    assert held(impl, FNUZ, CPU) is impl
    with pytest.raises(pytest.skip.Exception, match="held to e4m3fnuz's bytes by the properties"):
        check_float8_cache_alone(impl, CPU, FNUZ)


def test_a_kernel_wrong_in_every_format_still_reads_the_dtype():
    """Its e5m2 bytes are neither e5m2's nor its own e4m3 call's (nor those cast): it reads the dtype, and is
    held to e5m2's bytes (where its defect shows too), not reported as accepting a format it ignores."""
    impl = _impl(swapped_reads_dtype)
    assert held(impl, E5M2, CPU) is impl
    with pytest.raises(pytest.skip.Exception, match="held to e5m2's bytes by the properties"):
        check_float8_cache_alone(impl, CPU, E5M2)
