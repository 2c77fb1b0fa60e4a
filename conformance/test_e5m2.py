"""e5m2 caches: vLLM's kv_cache_dtype="fp8_e5m2" (issue 26), held byte for byte like e4m3.

A float8_e5m2 cache says its format itself; a uint8 cache holds e5m2 when the call says so
(`cache_dtype="fp8_e5m2"` or `torch.float8_e5m2`), and e4m3 when it says nothing. The spec is every
recipe with its last step onto the e5m2 grid (kernel/recipe.py, docs/e5m2.md): saturating recipes
write ±57344 past the range, the non-saturating rule (unfused-nan) ±inf (0x7C/0xFC), and every NaN 0x7F.

Properties: drawn e5m2 Cases are bit-exact over both whole caches, contiguous and strided, and leave
every input (scale tensors included) unmodified; fixed edge values (57344, the 61440 tie, ±inf, NaN,
subnormals down to 2**-16 and the tie below it, normal-range ties) give the bytes docs/e5m2.md states;
uint8 with no cache_dtype is still e4m3; a cache_dtype that contradicts a float8 cache is a ValueError;
float8_e5m2 and uint8 caches spelled either way hold the same bytes; e4m3 and e5m2 calls alternate on one
layout; per-head scales; every bf16/fp16 pattern; the custom op and torch.compile; (CUDA) a captured
e5m2 call replays bit-exact. Each stands in for its family on e5m2 (docs/e5m2.md).
The reference itself is held to torch's own e5m2 cast in conformance/test_fidelity.py.

Who is held to e5m2 (conformance.fp8_formats): the kvfp8 convention with a `cache_dtype` parameter (passed as
a fixed keyword here: conformance.conventions passes no other keyword); the vllm convention, whose
kv_cache_dtype says "fp8_e5m2" on an e5m2 call, unless the kernel raises on a plain e5m2 call (it declines
e5m2); and a kvfp8 kernel with no format argument that reads its float8 caches' dtype (it writes e5m2 or
e4m3fnuz right on a plain call; uint8 caches are e4m3 for it). One that accepts a float8_e5m2 cache and
writes no such format right fails the argument-contract test here, and the rest skip with the reason.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.bytediff import compare_caches
from conformance.fp8_formats import (
    E5M2,
    check_all_patterns,
    check_contradiction_refused,
    check_custom_op_and_compile,
    check_drawn,
    check_edges,
    check_float8_cache_alone,
    check_formats_alternate,
    check_per_head,
    check_storage_and_spelling,
    check_uint8_alone_is_e4m3,
    format_cases,
    held,
)
from conformance.harness import fail, run_reference
from conformance.impls import test_device as _test_device  # not collected as a test
from conformance.test_compile import compile_settings
from conformance.test_exhaustive import CPU_SCALES
from conformance.test_graphs import capture, graph_settings, restore
from conformance.test_per_head import variant_settings
from strategies.build import build
from strategies.case import Scale
from strategies.replay import writing_cases


@variant_settings
@given(data=st.data())
def test_e5m2_is_bit_exact(data, impl, device, recipes):
    """Drawn e5m2 Cases (any layout, dtype, scale kind, special values at e5m2's edges): whole caches
    equal the reference's, and no input changes (the scale tensors included)."""
    check_drawn(data, impl, device, recipes, E5M2)


# bf16 bits of values at e5m2's edges (scale 1): what docs/e5m2.md states for each, saturate / non-saturate
EDGES = (
    (0x4760, "57344", 0x7B, 0x7B), (0xC760, "-57344", 0xFB, 0xFB),
    (0x4768, "59392", 0x7B, 0x7B), (0x476F, "61184", 0x7B, 0x7B),
    (0x4770, "61440 (tie: even 65536)", 0x7B, 0x7C), (0xC770, "-61440", 0xFB, 0xFC),
    (0x4780, "65536", 0x7B, 0x7C), (0x7149, "~1e30", 0x7B, 0x7C),
    (0x7F80, "+inf", 0x7B, 0x7C), (0xFF80, "-inf", 0xFB, 0xFC),
    (0x7FC0, "NaN", 0x7F, 0x7F), (0xFFC0, "-NaN", 0x7F, 0x7F), (0x7F81, "signalling NaN", 0x7F, 0x7F),
    (0x3780, "2**-16", 0x01, 0x01), (0x3700, "2**-17 (tie: even 0)", 0x00, 0x00),
    (0xB700, "-2**-17", 0x80, 0x80), (0x37C0, "3 * 2**-17 (tie: even 2**-15)", 0x02, 0x02),
    (0x3680, "2**-18", 0x00, 0x00), (0x8000, "-0", 0x80, 0x80), (0x0001, "bf16 subnormal", 0x00, 0x00),
    (0x3F90, "1.125 (tie: even 1.0)", 0x3C, 0x3C), (0x3FB0, "1.375 (tie: even 1.5)", 0x3E, 0x3E),
    (0x3880, "2**-14 (smallest normal)", 0x04, 0x04),
)



@pytest.mark.parametrize("cache_dtype", ["float8_e5m2", "uint8"])
def test_e5m2_edges(cache_dtype, impl, device, recipe):
    """The reference gives the stated bytes at e5m2's edges, and the implementation the reference's."""
    check_edges(EDGES, cache_dtype, impl, device, recipe, E5M2)


@pytest.mark.parametrize("scales", CPU_SCALES.values(), ids=CPU_SCALES.keys())
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_e5m2_all_patterns(dtype: str, recipe: str, scales: tuple[Scale, Scale], impl, device):
    """Every bf16 and fp16 pattern into an e5m2 cache (test_exhaustive's Case and fill; k and v scales
    that overflow, underflow and are brought into range first), bit-exact."""
    check_all_patterns(dtype, recipe, scales, impl, device, E5M2)


@variant_settings
@given(data=st.data())
def test_e5m2_storage_and_spelling_are_equivalent(data, impl, device):
    """Equivalence: float8_e5m2 caches, and uint8 caches told cache_dtype="fp8_e5m2" or torch.float8_e5m2,
    get the same bytes from the implementation itself (whole buffers compared)."""
    check_storage_and_spelling(data, impl, device, E5M2)


@variant_settings
@given(data=st.data())
def test_formats_alternate_on_one_layout(data, impl, device):
    """Repeat: one uint8 layout written as e4m3, as e5m2, then as e4m3 again (other data each time)."""
    check_formats_alternate(data, impl, device, E5M2, ("fp8_e4m3", "fp8_e5m2", "fp8_e4m3"))


@variant_settings
@given(data=st.data())
def test_e5m2_per_head_scales(data, impl, device, recipes):
    """Per-head scales ([H] float32, strided or not) on e5m2 caches: bit-exact (test_per_head's property)."""
    check_per_head(data, impl, device, recipes, E5M2)


def test_uint8_without_cache_dtype_is_e4m3(impl, device):
    """A uint8 cache and no cache_dtype: e4m3 bytes, as before e5m2 existed."""
    check_uint8_alone_is_e4m3(EDGES, impl, device, E5M2)


@pytest.mark.argument_contract
def test_a_float8_cache_alone_is_written_in_its_format_or_refused(impl, device):
    """A float8_e5m2 cache and no format argument (SGLang's signature says the format by the tensor's dtype):
    written in its format, or refused. An implementation that accepts it, writes other bytes and writes no
    format beyond e4m3 right does not read the dtype: the argument contract's defect, and the properties
    here skip for it."""
    check_float8_cache_alone(impl, device, E5M2)


@pytest.mark.argument_contract
@pytest.mark.parametrize("caches, cache_dtype, named", [
    (("float8_e4m3fn", "float8_e4m3fn"), "fp8_e5m2", "k_cache"),
    (("float8_e5m2", "float8_e5m2"), torch.float8_e4m3fn, "k_cache"),
    (("uint8", "float8_e5m2"), "fp8_e4m3", "v_cache"),
    (("float8_e4m3fn", "float8_e5m2"), None, "v_cache"),
])
def test_contradicting_cache_dtype_is_refused(caches, cache_dtype, named, impl, device):
    """A float8 cache whose dtype contradicts cache_dtype (or the other cache) is a ValueError naming
    it and cache_dtype, raised before anything is written."""
    check_contradiction_refused(caches, cache_dtype, named, impl, device, E5M2)


@compile_settings
@given(data=st.data())
def test_e5m2_custom_op_and_compile(data, impl, device, recipes):
    """The custom op with cache_dtype passes opcheck and a torch.compile(fullgraph=True) caller writes the
    reference's bytes, on e5m2 caches. This repository's kernel only, as conformance/test_compile.py."""
    check_custom_op_and_compile(data, impl, device, recipes, E5M2)


@pytest.mark.cuda
@pytest.mark.skipif(_test_device().type != "cuda", reason="CUDA graphs need CUDA (no CUDA device here, or "
                                                        "TRITON_INTERPRET is set)")
@graph_settings
@given(data=st.data())
def test_e5m2_capture_and_replay(data, impl, device):
    """A captured e5m2 call (any scale kind) replays bit-exact, and creates no tensor while captured."""
    target = held(impl, E5M2, device)
    case = data.draw(writing_cases(format_cases(impl, E5M2, size="large", checked=False, allow_out_of_range=True)),
                     label="case")
    built = build(case, device)
    pristine = built.snapshot()
    graph = capture(target, [lambda: target.invoke(built.call())], [case])
    restore(built, pristine)
    graph.replay()
    torch.cuda.synchronize()
    expected = run_reference(case, device)
    report = compare_caches(expected, built)
    if report:
        fail(target, f"a replayed e5m2 call differs from the reference (recipe {case.recipe}):", report, case)
