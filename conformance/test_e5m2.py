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

Only implementations that declare e5m2 caches are held to them: the kvfp8 convention with a
`cache_dtype` parameter (passed as a fixed keyword here: conformance.conventions passes no other
keyword). A kernel written for e4m3 alone skips, with the reason. The vllm convention passes
kv_cache_dtype="fp8" (e4m3), so it cannot express an e5m2 call.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from conformance.bytediff import compare_caches
from conformance.harness import check_case, execute, fail, run_impl, run_reference
from conformance.impls import Implementation
from conformance.impls import test_device as _test_device  # not collected as a test
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
from conformance.test_exhaustive import CPU_SCALES, FILL, PERMUTE, fill_patterns, pattern_case
from conformance.test_graphs import capture, graph_settings, restore
from conformance.test_per_head import _per_head, _skip_unless_per_head
from kernel.custom_op import fused_fp8_set_kv_buffer_op
from kernel.recipe import RECIPES
from strategies.build import build
from strategies.case import Case, Override, Scale
from strategies.replay import writing_cases
from strategies.scales import per_head_values

E5M2_FORMAT = ("fp8_e5m2",)


def _takes_cache_dtype(impl: Implementation) -> bool:
    """The implementation's signature names cache_dtype (or takes **kwargs) and its convention is kvfp8."""
    if impl.convention.name != "kvfp8":
        return False
    try:
        params = inspect.signature(impl.fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "cache_dtype" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def held(impl: Implementation) -> Implementation:
    """impl as an e5m2 call reaches it: told cache_dtype="fp8_e5m2" where its signature takes it.
    Skips for the vllm convention, which can only say kv_cache_dtype="fp8" (e4m3)."""
    if impl.convention.name == "vllm":
        pytest.skip("the vllm convention passes kv_cache_dtype='fp8' (e4m3); an e5m2 call needs 'fp8_e5m2'")
    if not _takes_cache_dtype(impl):  # a kernel written for e4m3 alone is not held to e5m2's bytes here
        pytest.skip(f"{impl.name} takes no cache_dtype=: it does not declare e5m2 caches")
    return dataclasses.replace(impl, kwargs={**impl.kwargs, "cache_dtype": "fp8_e5m2"})


def e5m2_cases(impl: Implementation, **space: object) -> st.SearchStrategy[Case]:
    """impl's Cases with e5m2 caches: float8_e5m2, and uint8 where impl can be told cache_dtype."""
    dtypes = ("float8_e5m2", "uint8") if _takes_cache_dtype(impl) else ("float8_e5m2",)
    return impl.cases(cache_formats=E5M2_FORMAT, cache_dtypes=dtypes, **space)


def _inputs_unmodified(impl: Implementation, before: dict[str, torch.Tensor], after: dict[str, torch.Tensor],
                       case: Case) -> None:
    for name in ("k", "v", "cache_loc", "k_scale", "v_scale"):
        as_bytes = lambda t: t.reshape(-1).view(torch.uint8)  # noqa: E731 (NaN-safe; a 0-d scale too)
        if name in before and not torch.equal(as_bytes(before[name]), as_bytes(after[name])):
            fail(impl, f"modified its input {name} (an e5m2 call):", f"{name}'s buffer changed", case)


@given(data=st.data())
def test_e5m2_is_bit_exact(data, impl, device, recipe):
    """Drawn e5m2 Cases (any layout, dtype, scale kind, special values at e5m2's edges): whole caches
    equal the reference's, and no input changes (the scale tensors included)."""
    target = held(impl)
    size = "large" if device.type == "cuda" else "small"
    case = data.draw(e5m2_cases(impl, recipes=(recipe,), size=size, allow_out_of_range=True), label="case")
    built = build(case, device)
    expected = run_reference(case, device, built.copy(inputs=False))
    before = built.snapshot()
    actual, error = run_impl(case, target, device, built)
    if error:
        fail(target, "raises on a valid e5m2 call:", error, case)
    report = compare_caches(expected, actual)
    if report:
        fail(target, f"differs from the reference on an e5m2 cache (recipe {case.recipe}, {case.cache_dtype}):",
             report, case)
    _inputs_unmodified(target, before, actual.buffers, case)


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


def _edge_case(cache_dtype: str, recipe: str) -> Case:
    """One token, one head, the edge values in K and V (V reversed), slot 2 of 4 one-slot pages, scale 1."""
    n = len(EDGES)
    over = tuple(Override(t, i if t == "k" else n - 1 - i, bits, label)
                 for t in ("k", "v") for i, (bits, label, _, _) in enumerate(EDGES))
    return Case(num_tokens=1, num_heads=1, head_dim=n, page_size=1, num_pages=4, cache_loc=(2,),
                cache_dtype=cache_dtype, overrides=over, recipe=recipe, cache_format="fp8_e5m2")


@pytest.mark.parametrize("cache_dtype", ["float8_e5m2", "uint8"])
def test_e5m2_edges(cache_dtype, impl, device, recipe):
    """The reference gives the stated bytes at e5m2's edges, and the implementation the reference's."""
    target = held(impl)
    if cache_dtype == "uint8" and target is impl:
        pytest.skip(f"{impl.name} takes no cache_dtype keyword: a uint8 cache cannot be told it holds e5m2")
    case = impl.fit(_edge_case(cache_dtype, recipe))
    expected = run_reference(case, device)
    slot = expected.k_cache.view(torch.uint8)[2, 0, 0].cpu().tolist()
    column = 2 if RECIPES[case.recipe].overflow == "saturate" else 3
    stated = [edge[column] for edge in EDGES]
    assert slot == stated, (f"the reference's e5m2 bytes at the edges (recipe {case.recipe}) are "
                            f"{[hex(b) for b in slot]}, docs/e5m2.md states {[hex(b) for b in stated]}")
    actual, error = run_impl(case, target, device)
    if error:
        fail(target, "raises on a valid e5m2 call (edge values):", error, case)
    report = compare_caches(expected, actual)
    if report:
        fail(target, f"differs from the reference at e5m2's edges (recipe {case.recipe}, {cache_dtype}):",
             report, case)


@pytest.mark.parametrize("scales", CPU_SCALES.values(), ids=CPU_SCALES.keys())
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_e5m2_all_patterns(dtype: str, recipe: str, scales: tuple[Scale, Scale], impl, device):
    """Every bf16 and fp16 pattern into an e5m2 cache (test_exhaustive's Case and fill; k and v scales
    that overflow, underflow and are brought into range first), bit-exact. float8_e5m2 caches, and
    uint8 ones told cache_dtype where the implementation takes it."""
    target = held(impl)
    cache_dtype = "uint8" if target is not impl and scales is CPU_SCALES["1e-30/none"] else "float8_e5m2"
    case = impl.fit(pattern_case(dtype, *scales, recipe).replace(cache_format="fp8_e5m2", cache_dtype=cache_dtype))
    expected = fill_patterns(build(case, device))
    run_reference(case, device, expected)
    actual = fill_patterns(build(case, device))
    execute(target, actual, fill=FILL)
    report = compare_caches(expected, actual)
    if report:
        fail(target, f"differs from the reference over all {dtype} patterns into an e5m2 cache ({cache_dtype}; k in "
                     f"order, v permuted by {PERMUTE}), recipe {case.recipe}, k_scale {case.k_scale}, v_scale "
                     f"{case.v_scale}:", report, case, fill=FILL)


@given(data=st.data())
def test_e5m2_storage_and_spelling_are_equivalent(data, impl, device):
    """Equivalence: float8_e5m2 caches, and uint8 caches told cache_dtype="fp8_e5m2" or torch.float8_e5m2,
    get the same bytes from the implementation itself (whole buffers compared)."""
    if not _takes_cache_dtype(impl):
        pytest.skip(f"{impl.name} takes no cache_dtype keyword: a uint8 cache cannot be told it holds e5m2")
    case = data.draw(impl.cases(cache_formats=E5M2_FORMAT, cache_dtypes=("float8_e5m2",), allow_out_of_range=True),
                     label="case")
    calls = ((case, "fp8_e5m2"), (case.replace(cache_dtype="uint8"), "fp8_e5m2"),
             (case.replace(cache_dtype="uint8"), torch.float8_e5m2))
    built = []
    for c, spelled in calls:
        target = dataclasses.replace(impl, kwargs={**impl.kwargs, "cache_dtype": spelled})
        actual, error = run_impl(c, target, device)
        if error:
            fail(target, f"raises on a valid e5m2 call ({c.cache_dtype} caches, cache_dtype={spelled!r}):", error, c)
        built.append(actual)
    for actual, (c, spelled) in zip(built[1:], calls[1:]):
        report = compare_caches(built[0], actual)
        if report:
            fail(impl, f"uint8 caches with cache_dtype={spelled!r} hold other bytes than float8_e5m2 caches "
                       f"(expected: the float8_e5m2 call's bytes):", report, c)


@given(data=st.data())
def test_formats_alternate_on_one_layout(data, impl, device):
    """Repeat: one uint8 layout written as e4m3, as e5m2, then as e4m3 again (other data each time): each
    call bit-exact, so nothing of one format's call (a remembered launch, say) leaks into the next."""
    target = held(impl)
    if target is impl:
        pytest.skip(f"{impl.name} takes no cache_dtype keyword: one uint8 layout cannot alternate formats")
    case = data.draw(impl.cases(cache_dtypes=("uint8",), allow_out_of_range=True), label="case")
    seeds = data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=3, max_size=3), label="seeds")
    for seed, fmt in zip(seeds, ("fp8_e4m3", "fp8_e5m2", "fp8_e4m3")):
        c = case.replace(seed=seed, cache_format=fmt)
        check_case(c, target if fmt == "fp8_e5m2" else impl, device)


@given(data=st.data())
def test_e5m2_per_head_scales(data, impl, device, recipe):
    """Per-head scales ([H] float32, strided or not) on e5m2 caches: bit-exact (test_per_head's property)."""
    _skip_unless_per_head(impl)
    target = held(impl)
    case = data.draw(e5m2_cases(impl, recipes=(recipe,), allow_out_of_range=True, min_heads=2), label="case")
    values = data.draw(per_head_values(case.num_heads), label="k_scale_per_head")
    step = data.draw(st.sampled_from((1, 2)), label="scale_step")
    expected = _per_head(build(case, device), "k_scale", values, step)
    run_reference(case, device, expected)
    actual, error = run_impl(case, target, device, _per_head(build(case, device), "k_scale", values, step))
    if error:
        fail(target, f"raises on a valid e5m2 call with per-head k_scale {list(values)}:", error)
    report = compare_caches(expected, actual)
    if report:
        fail(target, f"differs from the reference on an e5m2 cache with per-head k_scale {list(values)} "
                     f"(recipe {case.recipe}):", report)


def test_uint8_without_cache_dtype_is_e4m3(impl, device):
    """A uint8 cache and no cache_dtype: e4m3 bytes, as before e5m2 existed (the same call with
    cache_dtype="fp8_e5m2" writes other bytes for these values, so the two cannot be confused)."""
    case = impl.fit(_edge_case("uint8", impl.recipe or "divide").replace(cache_format="fp8_e4m3"))
    expected = run_reference(case, device)
    as_e5m2 = run_reference(case.replace(cache_format="fp8_e5m2"), device)
    assert compare_caches(expected, as_e5m2) is not None, "e4m3 and e5m2 bytes coincide on the edge values"
    actual, error = run_impl(case, impl, device)
    if error:
        fail(impl, "raises on a valid call (uint8 caches, no cache_dtype):", error, case)
    report = compare_caches(expected, actual)
    if report:
        fail(impl, "a uint8 cache with no cache_dtype must hold e4m3 bytes:", report, case)


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
    if not _takes_cache_dtype(impl):  # this message is our kernel's contract, not every kernel's
        pytest.skip(f"{impl.name} takes no cache_dtype=: it does not declare e5m2 caches")
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


@compile_settings
@given(data=st.data())
def test_e5m2_custom_op_and_compile(data, impl, device, recipes):
    """The custom op with cache_dtype passes opcheck (float8_e5m2 caches: all but test_schema,
    pytorch/pytorch#135998; uint8: all), and a torch.compile(fullgraph=True) caller writes the reference's
    bytes. This repository's kernel only, as conformance/test_compile.py."""
    from torch._dynamo.testing import CompileCounterWithBackend

    encoder = fused_encoder(impl)
    case = data.draw(held(impl).cases(recipes=recipes, cache_formats=E5M2_FORMAT, **SMALL), label="case")
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
    check_case(case, Implementation(f"compiled-{BACKEND}-{encoder}", fn, {"cache_dtype": "fp8_e5m2"}), device)
    assert_op_traced(counter)


@pytest.mark.cuda
@pytest.mark.skipif(_test_device().type != "cuda", reason="CUDA graphs need CUDA (no CUDA device here, or "
                                                        "TRITON_INTERPRET is set)")
@graph_settings
@given(data=st.data())
def test_e5m2_capture_and_replay(data, impl, device):
    """A captured e5m2 call (any scale kind) replays bit-exact, and creates no tensor while captured."""
    target = held(impl)
    case = data.draw(writing_cases(e5m2_cases(impl, size="large", checked=False, allow_out_of_range=True)),
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
