"""e4m3fnuz caches: vLLM on ROCm MI300 (gfx942) stores K and V as float8_e4m3fnuz (issue 26).

e4m3fnuz: 1 sign, 4 exponent (bias 8), 3 mantissa bits; no infinity, no -0, one NaN (0x80); largest finite
240 (0x7F), smallest normal 2**-7, subnormals M * 2**-10. A float8_e4m3fnuz cache says its format itself;
a uint8 cache holds fnuz when the call says so (`cache_dtype="fp8_e4m3fnuz"` or torch.float8_e4m3fnuz), and
e4m3 when it says nothing. The spec is every recipe with its last step onto the fnuz grid (docs/e5m2.md,
"e4m3fnuz caches"): saturating recipes write ±240 past the range, the non-saturating rule (unfused-nan)
0x80 from 248 (the tie with 256) up, as torch's cast does (docs/facts.md, fact 6); every NaN is 0x80 and
zero has no sign (-0 and negatives that round to zero are 0x00).

The e5m2 family's properties and rules, shared (conformance/fp8_formats.py): implementations told the format
(a `cache_dtype` parameter, kvfp8 convention), and kvfp8 ones with no format argument that read their float8
caches' dtype, are held to it; one that accepts float8_e4m3fnuz caches without reading the dtype fails the
argument-contract test here; others skip with the reason.
Properties: drawn fnuz Cases bit-exact and inputs unmodified; fixed edges give the stated bytes; every
bf16/fp16 pattern; float8_e4m3fnuz and uint8 caches spelled either way are equivalent; uint8 with no
cache_dtype is still e4m3; a contradicting dtype is refused; e4m3, fnuz and e5m2 calls alternate on one
layout; per-head scales; the custom op and torch.compile. The reference is held to torch's own fnuz cast in
conformance/test_fidelity.py. Not here: CUDA graph replay (test_e5m2's graph property has no fnuz twin yet).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.fp8_formats import (
    FNUZ,
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
)
from conformance.test_compile import compile_settings
from conformance.test_exhaustive import CPU_SCALES
from conformance.test_per_head import variant_settings
from strategies.case import Scale


def _drawn(impl) -> None:
    """Skips a drawn property for this repository's kernel on the hardware encoder: fnuz has only the software
    encoder, so that call runs fused-software's kernel (kernel/fused.py), held by the same property there; the
    hardware call's own routing is held by its edges and all its patterns, here."""
    if impl.is_ours and impl.encoder == "hardware":
        pytest.skip("e4m3fnuz has only the software encoder: fused-hardware runs fused-software's kernel, which "
                    "this property holds under fused-software")


@variant_settings
@given(data=st.data())
def test_fnuz_is_bit_exact(data, impl, device, recipes):
    """Drawn fnuz Cases (any layout, dtype, scale kind, special values at fnuz's edges): whole caches
    equal the reference's, and no input changes (the scale tensors included)."""
    _drawn(impl)
    check_drawn(data, impl, device, recipes, FNUZ)


# bf16 bits of values at fnuz's edges (scale 1): the bytes docs/e5m2.md states, saturate / non-saturate
EDGES = (
    (0x4370, "240", 0x7F, 0x7F), (0xC370, "-240", 0xFF, 0xFF), (0x4374, "244", 0x7F, 0x7F),
    (0x4378, "248 (tie: even 256)", 0x7F, 0x80), (0xC378, "-248", 0xFF, 0x80),
    (0x4380, "256", 0x7F, 0x80), (0x7149, "~1e30", 0x7F, 0x80),
    (0x7F80, "+inf", 0x7F, 0x80), (0xFF80, "-inf", 0xFF, 0x80),
    (0x7FC0, "NaN", 0x80, 0x80), (0xFFC0, "-NaN", 0x80, 0x80), (0x7F81, "signalling NaN", 0x80, 0x80),
    (0x3A80, "2**-10", 0x01, 0x01), (0xBA80, "-2**-10", 0x81, 0x81), (0x3A00, "2**-11 (tie: even 0)", 0x00, 0x00),
    (0xBA00, "-2**-11 (to zero, unsigned)", 0x00, 0x00), (0x3AC0, "3 * 2**-11 (tie: even 2**-9)", 0x02, 0x02),
    (0x3980, "2**-12", 0x00, 0x00), (0x8000, "-0", 0x00, 0x00), (0x0001, "bf16 subnormal", 0x00, 0x00),
    (0x8001, "-bf16 subnormal", 0x00, 0x00),
    (0x3F88, "1.0625 (tie: even 1.0)", 0x40, 0x40), (0x3F98, "1.1875 (tie: even 1.25)", 0x42, 0x42),
    (0x3C00, "2**-7 (smallest normal)", 0x08, 0x08), (0xBF80, "-1", 0xC0, 0xC0),
)



@pytest.mark.parametrize("cache_dtype", ["float8_e4m3fnuz", "uint8"])
def test_fnuz_edges(cache_dtype, impl, device, recipe):
    """The reference gives the stated bytes at fnuz's edges, and the implementation the reference's."""
    check_edges(EDGES, cache_dtype, impl, device, recipe, FNUZ)


@pytest.mark.parametrize("scales", CPU_SCALES.values(), ids=CPU_SCALES.keys())
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fnuz_all_patterns(dtype: str, recipe: str, scales: tuple[Scale, Scale], impl, device):
    """Every bf16 and fp16 pattern into an e4m3fnuz cache (test_exhaustive's Case and fill), bit-exact:
    float8_e4m3fnuz caches, and uint8 ones for one of the scale pairs."""
    check_all_patterns(dtype, recipe, scales, impl, device, FNUZ)


@variant_settings
@given(data=st.data())
def test_fnuz_storage_and_spelling_are_equivalent(data, impl, device):
    """Equivalence: float8_e4m3fnuz caches, and uint8 caches told cache_dtype="fp8_e4m3fnuz" or
    torch.float8_e4m3fnuz, get the same bytes from the implementation itself (whole buffers compared)."""
    _drawn(impl)
    check_storage_and_spelling(data, impl, device, FNUZ)


def test_uint8_without_cache_dtype_is_e4m3_not_fnuz(impl, device):
    """A uint8 cache and no cache_dtype: e4m3 bytes, as before fnuz existed."""
    check_uint8_alone_is_e4m3(EDGES, impl, device, FNUZ)


@pytest.mark.argument_contract
def test_a_float8_cache_alone_is_written_in_its_format_or_refused(impl, device):
    """test_e5m2's argument-contract test for float8_e4m3fnuz caches (a kernel that reads no dtype writes e4m3fn
    bytes there: read as fnuz, each value halves)."""
    check_float8_cache_alone(impl, device, FNUZ)


@pytest.mark.argument_contract
@pytest.mark.parametrize("caches, cache_dtype, named", [
    (("float8_e4m3fnuz", "float8_e4m3fnuz"), "fp8_e4m3", "k_cache"),
    (("float8_e4m3fn", "float8_e4m3fn"), torch.float8_e4m3fnuz, "k_cache"),
    (("uint8", "float8_e4m3fnuz"), "fp8_e5m2", "v_cache"),
    (("float8_e4m3fnuz", "float8_e4m3fn"), None, "v_cache"),
])
def test_fnuz_contradicting_cache_dtype_is_refused(caches, cache_dtype, named, impl, device):
    """A float8 cache whose dtype contradicts cache_dtype (or the other cache) is a ValueError naming
    it, raised before anything is written (e4m3fn and e4m3fnuz caches are not interchangeable)."""
    check_contradiction_refused(caches, cache_dtype, named, impl, device, FNUZ)


@variant_settings
@given(data=st.data())
def test_fnuz_formats_alternate_on_one_layout(data, impl, device):
    """Repeat: one uint8 layout written as e4m3, e4m3fnuz, e5m2, then e4m3fnuz again (other data each time)."""
    check_formats_alternate(data, impl, device, FNUZ, ("fp8_e4m3", FNUZ.name, "fp8_e5m2", FNUZ.name))


@variant_settings
@given(data=st.data())
def test_fnuz_per_head_scales(data, impl, device, recipes):
    """Per-head scales ([H] float32, strided or not) on e4m3fnuz caches: bit-exact (test_per_head's property)."""
    _drawn(impl)
    check_per_head(data, impl, device, recipes, FNUZ)


@compile_settings
@given(data=st.data())
def test_fnuz_custom_op_and_compile(data, impl, device, recipes):
    """The custom op with cache_dtype passes opcheck and a torch.compile(fullgraph=True) caller writes the
    reference's bytes, on e4m3fnuz caches. This repository's kernel only, as conformance/test_compile.py."""
    check_custom_op_and_compile(data, impl, device, recipes, FNUZ)
