"""e4m3fnuz caches: vLLM on ROCm MI300 (gfx942) stores K and V as float8_e4m3fnuz (issue 26).

e4m3fnuz: 1 sign, 4 exponent (bias 8), 3 mantissa bits; no infinity, no -0, one NaN (0x80); largest finite
240 (0x7F), smallest normal 2**-7, subnormals M * 2**-10. A float8_e4m3fnuz cache says its format itself;
a uint8 cache holds fnuz when the call says so (`cache_dtype="fp8_e4m3fnuz"` or torch.float8_e4m3fnuz), and
e4m3 when it says nothing. The spec is every recipe with its last step onto the fnuz grid (docs/e5m2.md,
"e4m3fnuz caches"): saturating recipes write ±240 past the range, the non-saturating rule (unfused-nan)
0x80 from 248 (the tie with 256) up, as torch's cast does (docs/facts.md, fact 6); every NaN is 0x80 and
zero has no sign (-0 and negatives that round to zero are 0x00).

The e5m2 family's machinery and rules, reused (conformance/test_e5m2.py): only implementations that declare
the format (a `cache_dtype` parameter, kvfp8 convention) are held to it, others skip with the reason.
Properties: drawn fnuz Cases bit-exact and inputs unmodified; fixed edges give the stated bytes; every
bf16/fp16 pattern; float8_e4m3fnuz and uint8 caches spelled either way are equivalent; uint8 with no
cache_dtype is still e4m3; a contradicting dtype is refused; e4m3, fnuz and e5m2 calls alternate on one
layout; per-head scales; the custom op and torch.compile. The reference is held to torch's own fnuz cast in
conformance/test_fidelity.py. Not here: CUDA graph replay (test_e5m2's graph property has no fnuz twin yet).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from conformance.bytediff import compare_caches
from conformance.harness import check_case, execute, fail, run_impl, run_reference
from conformance.impls import Implementation
from conformance.test_compile import (
    ALL_OPCHECKS,
    BACKEND,
    FP8_OPCHECKS,
    OP,
    SMALL,
    assert_op_traced,
    compile_settings,
    fused_encoder,
    op_args,
)
from conformance.test_e5m2 import _inputs_unmodified, _takes_cache_dtype
from conformance.test_exhaustive import CPU_SCALES, FILL, PERMUTE, fill_patterns, pattern_case
from conformance.test_per_head import _per_head, _skip_unless_per_head
from kernel.custom_op import fused_fp8_set_kv_buffer_op
from kernel.recipe import RECIPES
from strategies.build import build
from strategies.case import Case, Override, Scale
from strategies.scales import per_head_values

FNUZ = "fp8_e4m3fnuz"
FNUZ_FORMAT = (FNUZ,)


def held(impl: Implementation) -> Implementation:
    """impl as an fnuz call reaches it: told cache_dtype="fp8_e4m3fnuz" where its signature takes it.
    Skips for the vllm convention (it passes kv_cache_dtype="fp8") and for kernels without cache_dtype."""
    if impl.convention.name == "vllm":
        pytest.skip("the vllm convention passes kv_cache_dtype='fp8'; an e4m3fnuz call needs a cache_dtype")
    if not _takes_cache_dtype(impl):
        pytest.skip(f"{impl.name} takes no cache_dtype=: it does not declare e4m3fnuz caches")
    return dataclasses.replace(impl, kwargs={**impl.kwargs, "cache_dtype": FNUZ})


@given(data=st.data())
def test_fnuz_is_bit_exact(data, impl, device, recipe):
    """Drawn fnuz Cases (any layout, dtype, scale kind, special values at fnuz's edges): whole caches
    equal the reference's, and no input changes (the scale tensors included)."""
    target = held(impl)
    size = "large" if device.type == "cuda" else "small"
    case = data.draw(impl.cases(cache_formats=FNUZ_FORMAT, cache_dtypes=("float8_e4m3fnuz", "uint8"),
                                recipes=(recipe,), size=size, allow_out_of_range=True), label="case")
    built = build(case, device)
    expected = run_reference(case, device, built.copy(inputs=False))
    before = built.snapshot()
    actual, error = run_impl(case, target, device, built)
    if error:
        fail(target, "raises on a valid e4m3fnuz call:", error, case)
    report = compare_caches(expected, actual)
    if report:
        fail(target, f"differs from the reference on an e4m3fnuz cache (recipe {case.recipe}, {case.cache_dtype}):",
             report, case)
    _inputs_unmodified(target, before, actual.buffers, case)


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


def _edge_case(cache_dtype: str, recipe: str) -> Case:
    """One token, one head, the edge values in K and V (V reversed), slot 2 of 4 one-slot pages, scale 1."""
    n = len(EDGES)
    over = tuple(Override(t, i if t == "k" else n - 1 - i, bits, label)
                 for t in ("k", "v") for i, (bits, label, _, _) in enumerate(EDGES))
    return Case(num_tokens=1, num_heads=1, head_dim=n, page_size=1, num_pages=4, cache_loc=(2,),
                cache_dtype=cache_dtype, overrides=over, recipe=recipe, cache_format=FNUZ)


@pytest.mark.parametrize("cache_dtype", ["float8_e4m3fnuz", "uint8"])
def test_fnuz_edges(cache_dtype, impl, device, recipe):
    """The reference gives the stated bytes at fnuz's edges, and the implementation the reference's."""
    target = held(impl)
    case = impl.fit(_edge_case(cache_dtype, recipe))
    expected = run_reference(case, device)
    slot = expected.k_cache.view(torch.uint8)[2, 0, 0].cpu().tolist()
    column = 2 if RECIPES[case.recipe].overflow == "saturate" else 3
    stated = [edge[column] for edge in EDGES]
    assert slot == stated, (f"the reference's e4m3fnuz bytes at the edges (recipe {case.recipe}) are "
                            f"{[hex(b) for b in slot]}, docs/e5m2.md states {[hex(b) for b in stated]}")
    actual, error = run_impl(case, target, device)
    if error:
        fail(target, "raises on a valid e4m3fnuz call (edge values):", error, case)
    report = compare_caches(expected, actual)
    if report:
        fail(target, f"differs from the reference at e4m3fnuz's edges (recipe {case.recipe}, {cache_dtype}):",
             report, case)


@pytest.mark.parametrize("scales", CPU_SCALES.values(), ids=CPU_SCALES.keys())
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fnuz_all_patterns(dtype: str, recipe: str, scales: tuple[Scale, Scale], impl, device):
    """Every bf16 and fp16 pattern into an e4m3fnuz cache (test_exhaustive's Case and fill), bit-exact:
    float8_e4m3fnuz caches, and uint8 ones for one of the scale pairs."""
    target = held(impl)
    cache_dtype = "uint8" if scales is CPU_SCALES["1e-30/none"] else "float8_e4m3fnuz"
    case = impl.fit(pattern_case(dtype, *scales, recipe).replace(cache_format=FNUZ, cache_dtype=cache_dtype))
    expected = fill_patterns(build(case, device))
    run_reference(case, device, expected)
    actual = fill_patterns(build(case, device))
    execute(target, actual, fill=FILL)
    report = compare_caches(expected, actual)
    if report:
        fail(target, f"differs from the reference over all {dtype} patterns into an e4m3fnuz cache ({cache_dtype}; "
                     f"k in order, v permuted by {PERMUTE}), recipe {case.recipe}, k_scale {case.k_scale}, v_scale "
                     f"{case.v_scale}:", report, case, fill=FILL)


@given(data=st.data())
def test_fnuz_storage_and_spelling_are_equivalent(data, impl, device):
    """Equivalence: float8_e4m3fnuz caches, and uint8 caches told cache_dtype="fp8_e4m3fnuz" or
    torch.float8_e4m3fnuz, get the same bytes from the implementation itself (whole buffers compared)."""
    if not _takes_cache_dtype(impl):
        pytest.skip(f"{impl.name} takes no cache_dtype keyword: a uint8 cache cannot be told it holds e4m3fnuz")
    case = data.draw(impl.cases(cache_formats=FNUZ_FORMAT, cache_dtypes=("float8_e4m3fnuz",),
                                allow_out_of_range=True), label="case")
    calls = ((case, FNUZ), (case.replace(cache_dtype="uint8"), FNUZ),
             (case.replace(cache_dtype="uint8"), torch.float8_e4m3fnuz))
    built = []
    for c, spelled in calls:
        target = dataclasses.replace(impl, kwargs={**impl.kwargs, "cache_dtype": spelled})
        actual, error = run_impl(c, target, device)
        if error:
            fail(target, f"raises on a valid e4m3fnuz call ({c.cache_dtype} caches, cache_dtype={spelled!r}):",
                 error, c)
        built.append(actual)
    for actual, (c, spelled) in zip(built[1:], calls[1:]):
        report = compare_caches(built[0], actual)
        if report:
            fail(impl, f"uint8 caches with cache_dtype={spelled!r} hold other bytes than float8_e4m3fnuz caches "
                       f"(expected: the float8_e4m3fnuz call's bytes):", report, c)


def test_uint8_without_cache_dtype_is_e4m3_not_fnuz(impl, device):
    """A uint8 cache and no cache_dtype: e4m3 bytes, as before fnuz existed (fnuz bytes differ on these
    values, so the two cannot be confused)."""
    case = impl.fit(_edge_case("uint8", impl.recipe or "divide").replace(cache_format="fp8_e4m3"))
    expected = run_reference(case, device)
    as_fnuz = run_reference(case.replace(cache_format=FNUZ), device)
    assert compare_caches(expected, as_fnuz) is not None, "e4m3 and e4m3fnuz bytes coincide on the edge values"
    actual, error = run_impl(case, impl, device)
    if error:
        fail(impl, "raises on a valid call (uint8 caches, no cache_dtype):", error, case)
    report = compare_caches(expected, actual)
    if report:
        fail(impl, "a uint8 cache with no cache_dtype must hold e4m3 bytes:", report, case)


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
    if not _takes_cache_dtype(impl):
        pytest.skip(f"{impl.name} takes no cache_dtype=: it does not declare e4m3fnuz caches")
    case = impl.fit(Case(num_tokens=2, num_heads=2, head_dim=16, page_size=4, num_pages=2, cache_loc=(1, 6),
                         seed=3, recipe=impl.recipe or "divide"))
    built = build(case, device)
    views = {name: built.buffers[name].view(getattr(torch, dtype)).as_strided(t.shape, t.stride(),
                                                                             t.storage_offset())
             for name, t, dtype in (("k_cache", built.k_cache, caches[0]), ("v_cache", built.v_cache, caches[1]))}
    built = dataclasses.replace(built, **views)
    target = impl if cache_dtype is None else dataclasses.replace(impl, kwargs={**impl.kwargs,
                                                                                "cache_dtype": cache_dtype})
    before = built.snapshot()
    with pytest.raises(ValueError, match=rf"{named}.dtype .* contradicts"):
        target.run(built)
    for name in ("k_cache", "v_cache"):
        assert torch.equal(built.buffers[name], before[name]), f"{name} was written before the error"


@given(data=st.data())
def test_fnuz_formats_alternate_on_one_layout(data, impl, device):
    """Repeat: one uint8 layout written as e4m3, e4m3fnuz, e5m2, then e4m3fnuz again (other data each time):
    each call bit-exact, so nothing of one format's call (a remembered launch, say) leaks into the next."""
    held(impl)  # skips unless impl declares fnuz caches; each call below is told its own format
    case = data.draw(impl.cases(cache_dtypes=("uint8",), allow_out_of_range=True), label="case")
    seeds = data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=4, max_size=4), label="seeds")
    for seed, fmt in zip(seeds, ("fp8_e4m3", FNUZ, "fp8_e5m2", FNUZ)):
        c = case.replace(seed=seed, cache_format=fmt)
        told = impl if fmt == "fp8_e4m3" else dataclasses.replace(impl, kwargs={**impl.kwargs, "cache_dtype": fmt})
        check_case(c, told, device)


@given(data=st.data())
def test_fnuz_per_head_scales(data, impl, device, recipe):
    """Per-head scales ([H] float32, strided or not) on e4m3fnuz caches: bit-exact (test_per_head's property)."""
    _skip_unless_per_head(impl)
    target = held(impl)
    case = data.draw(impl.cases(cache_formats=FNUZ_FORMAT, cache_dtypes=("float8_e4m3fnuz", "uint8"),
                                recipes=(recipe,), allow_out_of_range=True, min_heads=2), label="case")
    values = data.draw(per_head_values(case.num_heads), label="k_scale_per_head")
    step = data.draw(st.sampled_from((1, 2)), label="scale_step")
    expected = _per_head(build(case, device), "k_scale", values, step)
    run_reference(case, device, expected)
    actual, error = run_impl(case, target, device, _per_head(build(case, device), "k_scale", values, step))
    if error:
        fail(target, f"raises on a valid e4m3fnuz call with per-head k_scale {list(values)}:", error)
    report = compare_caches(expected, actual)
    if report:
        fail(target, f"differs from the reference on an e4m3fnuz cache with per-head k_scale {list(values)} "
                     f"(recipe {case.recipe}):", report)


@compile_settings
@given(data=st.data())
def test_fnuz_custom_op_and_compile(data, impl, device, recipes):
    """The custom op with cache_dtype passes opcheck (float8_e4m3fnuz caches: all but test_schema, as for
    e5m2; uint8: all), and a torch.compile(fullgraph=True) caller writes the reference's bytes. This
    repository's kernel only, as conformance/test_compile.py."""
    from torch._dynamo.testing import CompileCounterWithBackend

    encoder = fused_encoder(impl)
    case = data.draw(held(impl).cases(recipes=recipes, cache_formats=FNUZ_FORMAT, **SMALL), label="case")
    assume(case.num_tokens > 0)  # as test_compile.test_opcheck: opcheck's clone of 0-token tensors
    tests = ALL_OPCHECKS if case.cache_dtype == "uint8" else FP8_OPCHECKS
    torch.library.opcheck(OP, (*op_args(build(case, device), encoder), case.cache_format), test_utils=tests)
    counter = CompileCounterWithBackend(BACKEND)

    def step(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, *, recipe, checked,
             cache_dtype):
        fused_fp8_set_kv_buffer_op(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe,
                                   checked=checked, encoder=encoder, cache_dtype=cache_dtype)

    torch._dynamo.reset()
    fn = torch.compile(step, backend=counter, fullgraph=True, dynamic=data.draw(st.booleans(), label="dynamic"))
    check_case(case, Implementation(f"compiled-{BACKEND}-{encoder}", fn, {"cache_dtype": FNUZ}), device)
    assert_op_traced(counter)
