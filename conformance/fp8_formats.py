"""The properties that hold an implementation to a cache format other than e4m3 (e5m2, e4m3fnuz), written
once: conformance/test_e5m2.py and conformance/test_fnuz.py call them with their format's `Format` and
its edge table, and keep their own test names (the capability rows and the kill records name them).

Which implementations are held to a format's bytes:
- the kvfp8 convention with a `cache_dtype` parameter, told `cache_dtype=<format>`;
- the vllm convention, told by its kv_cache_dtype ("fp8_e5m2"; it has no word for fnuz), unless it raises on
  a plain call of the format (it declines it: the capability row says so);
- a kvfp8 implementation with no format argument, whose float8 cache tensors say the format (SGLang's
  signature), when it reads the cache's dtype (for some format beyond e4m3 a plain call writes other bytes
  than its e4m3 twin on the same inputs): every format it accepts is held to that format's bytes (a plain
  call that raises, where its e4m3 twin does not, declines the format).
  One that reads no float8 cache's dtype (it writes what it writes into e4m3 caches, or those values cast:
  a kernel written for e4m3 alone that takes any float8 cache) is not held to their bytes: accepting such a
  cache without refusing it is an argument-contract defect (`check_float8_cache_alone`), and the format's
  properties skip, saying so.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

import pytest
import torch
from hypothesis import assume
from hypothesis import strategies as st

from conformance.bytediff import compare_caches
from conformance.cachemap import written_mask
from conformance.diagnosis.classify import ALONE_TEST
from conformance.harness import check_case, execute, fail, run_impl, run_reference
from conformance.impls import Implementation
from conformance.test_compile import (
    ALL_OPCHECKS,
    BACKEND,
    FP8_OPCHECKS,
    OP,
    SMALL,
    assert_op_traced,
    fused_encoder,
    op_args,
)
from conformance.test_exhaustive import CPU_SCALES, FILL, PERMUTE, fill_patterns, pattern_case
from conformance.test_per_head import _per_head, _skip_unless_per_head, per_tensor_twin
from kernel.custom_op import fused_fp8_set_kv_buffer_op
from kernel.recipe import RECIPES
from strategies.build import Built, build
from strategies.case import Case, Override, Scale
from strategies.scales import per_head_values

#: (bf16 bits, label, byte under a saturating recipe, byte under the non-saturating one), scale 1.
Edge = tuple[int, str, int, int]


@dataclass(frozen=True)
class Format:
    """A non-e4m3 cache format under test: its cache_dtype name, its torch dtype's name, how reports say it."""

    name: str  # "fp8_e5m2": Case.cache_format and the cache_dtype keyword
    dtype: str  # "float8_e5m2"
    says: str  # "e5m2"

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


E5M2 = Format("fp8_e5m2", "float8_e5m2", "e5m2")
FNUZ = Format("fp8_e4m3fnuz", "float8_e4m3fnuz", "e4m3fnuz")
#: The formats an implementation is asked about, beyond e4m3 (whether it reads a float8 cache's dtype).
BEYOND_E4M3 = (E5M2, FNUZ)


def takes_cache_dtype(impl: Implementation) -> bool:
    """The implementation's signature names cache_dtype (or takes **kwargs) and its convention is kvfp8."""
    if impl.convention.name != "kvfp8":
        return False
    try:
        params = inspect.signature(impl.fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "cache_dtype" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def tellable(impl: Implementation) -> bool:
    """Whether a call can tell impl a cache's format (so a uint8 cache can hold it): a format argument."""
    return impl.convention.format_position is not None or takes_cache_dtype(impl)


def _untellable(impl: Implementation, fmt: Format) -> None:
    if not tellable(impl):
        pytest.skip(f"{impl.name} takes no format argument: a uint8 cache holds {fmt.says} only when the call says "
                    f"so (its {fmt.dtype} caches are held by the other properties)")


def told(impl: Implementation, spelled: object) -> Implementation:
    """impl told a cache format on every call: kvfp8 by the fixed keyword cache_dtype=spelled; a convention with
    a format argument (vLLM's kv_cache_dtype) says each Case's own format already (Built.call's cache_dtype)."""
    if impl.convention.format_position is not None:
        return impl
    return dataclasses.replace(impl, kwargs={**impl.kwargs, "cache_dtype": spelled})


def small_case(impl: Implementation, **changes: object) -> Case:
    """Two tokens into a cache of two 4-slot pages (slot 6 on the second page), the held recipe (divide when
    every recipe is told), made expressible in impl's convention."""
    return impl.fit(Case(num_tokens=2, num_heads=2, head_dim=16, page_size=4, num_pages=2, cache_loc=(1, 6),
                         seed=3, recipe=impl.recipe or "divide", **changes))


def plain_format_case(impl: Implementation, fmt: Format, device: torch.device) -> Case:
    """small_case in fmt's float8 caches, with both scales 1.0 of the first kind (the convention's plain kind
    first) whose e4m3 twin impl takes without raising: a call that raises in e4m3 as well says nothing about
    the format (a kernel that refuses a None scale is not declining e5m2). The plain kind's when none does."""
    convention = impl.convention
    kinds = dict.fromkeys((convention.plain_scale_kind, *(k for k in ("tensor1", "tensor0d", "float", "none")
                                                          if k in convention.scale_kinds)))
    cases = [small_case(impl, cache_format=fmt.name, cache_dtype=fmt.dtype, k_scale=Scale(kind), v_scale=Scale(kind))
             for kind in kinds]
    twin = {"cache_format": "fp8_e4m3", "cache_dtype": "float8_e4m3fn"}
    return next((c for c in cases if run_impl(c.replace(**twin), impl.telling(c.replace(**twin)), device)[1] is None),
                cases[0])


_DECLINED: dict[tuple[str, str, str], str | None] = {}


def declined(impl: Implementation, fmt: Format, device: torch.device) -> str | None:
    """Why impl declines fmt's caches (a plain call raises, in float8 and in uint8 caches), or None.

    Asked of a convention that always passes a format argument (vLLM's kv_cache_dtype, a parameter every
    such kernel has): raising on a format it does not write is its answer, not a defect. A kernel that takes
    the plain call is held to the format's bytes in every property."""
    key = (impl.spec or impl.name, fmt.name, str(device))
    if key not in _DECLINED:
        case = plain_format_case(impl, fmt, device)
        errors = [run_impl(case.replace(cache_dtype=dtype), impl, device)[1] for dtype in (fmt.dtype, "uint8")]
        _DECLINED[key] = all(errors) and f"declines {fmt.says} caches: on a plain {fmt.says} call, {errors[0]}"
    return _DECLINED[key]


@dataclass(frozen=True)
class Answer:
    """What an implementation does with a float8 cache of a format and no format argument, on a plain call."""

    kind: str  # "declines" (raises), "writes" (fmt's bytes under some recipe), "ignores" (what it writes into
    # an e4m3 cache, or those values cast to fmt: it does not read the dtype), "other" (it reads it, wrongly)
    detail: str  # declines: why; ignores, other: which bytes it writes
    case: Case  # the plain call asked
    report: str = ""  # ignores, other: its byte diff against the reference


_ANSWERS: dict[tuple[str, str, str], Answer] = {}


def _untold(impl: Implementation) -> Implementation:
    """impl told no format (its fixed cache_dtype dropped): the float8 cache's dtype is the call's only word."""
    return dataclasses.replace(impl, kwargs={k: v for k, v in impl.kwargs.items() if k != "cache_dtype"})


def untold_answer(impl: Implementation, fmt: Format, device: torch.device) -> Answer:
    """A plain call with float8 caches of fmt and no format argument, beside its e4m3 twin on the same inputs:
    declined, fmt written right, the dtype ignored, or other bytes."""
    key = (impl.spec or impl.name, fmt.name, str(device))
    if key not in _ANSWERS:
        plain = _untold(impl)
        case = plain_format_case(plain, fmt, device)
        actual, error = run_impl(case, plain, device)
        recipes = (case.recipe,) if impl.recipe else tuple(RECIPES)  # "writes fmt" under any recipe it may use
        if error:
            answer = Answer("declines", f"declines {fmt.dtype} caches: on a plain {fmt.says} call, {error}", case)
        elif any(compare_caches(run_reference(case.replace(recipe=r), device), actual) is None for r in recipes):
            answer = Answer("writes", "", case)
        else:
            kind, detail = _beside_e4m3(case, plain, actual, fmt, device)
            answer = Answer(kind, detail, case, compare_caches(run_reference(case, device), actual) or "")
        _ANSWERS[key] = answer
    return _ANSWERS[key]


def _beside_e4m3(case: Case, impl: Implementation, actual: Built, fmt: Format,
                 device: torch.device) -> tuple[str, str]:
    """(kind, detail) of fmt's wrong bytes beside impl's own e4m3 call on the same inputs (the same buffers
    viewed as e4m3): the same bytes, or their e4m3 values cast to fmt (a result stored through the cache's
    dtype: a cast, a Triton store), say it ignores the dtype; others, that it reads the dtype and writes fmt
    wrong."""
    e4m3 = case.replace(cache_format="fp8_e4m3", cache_dtype="float8_e4m3fn")
    built = build(case, device)
    views = {name: getattr(built, name).view(torch.float8_e4m3fn) for name in ("k_cache", "v_cache")}
    twin, error = run_impl(e4m3, impl, device, dataclasses.replace(built, case=e4m3, **views))
    if error:
        return "other", f"other bytes than {fmt.says}'s"
    if compare_caches(twin, actual) is None:
        return "ignores", "the bytes it writes into e4m3 caches"
    for name in ("k_cache", "v_cache"):  # the written slots only: an unwritten fill byte is no e4m3 value
        mask = written_mask(e4m3, name)
        ours, theirs = twin.buffers[name].cpu()[mask], actual.buffers[name].cpu()[mask]
        cast = ours.view(torch.float8_e4m3fn).float().to(fmt.torch_dtype).view(torch.uint8)
        if not torch.equal(cast, theirs):
            return "other", f"other bytes than {fmt.says}'s (and than its e4m3 call's)"
    return "ignores", (f"its e4m3 values cast to {fmt.says} (each rounded to e4m3 first, then stored through the "
                       "cache's dtype)")


def reads_format(impl: Implementation, device: torch.device) -> bool:
    """Whether impl, told no format, reads a float8 cache's dtype: for some format beyond e4m3 a plain call
    writes other bytes than into an e4m3 cache (the format's, or wrong ones). Every format it accepts is then
    held to that format's bytes."""
    return any(untold_answer(impl, f, device).kind in ("writes", "other") for f in BEYOND_E4M3)


def held(impl: Implementation, fmt: Format, device: torch.device) -> Implementation:
    """impl held to fmt's bytes: told fmt on every call where it has a format argument, else as it is (its
    float8 caches say the format). Skips one that declines fmt, one whose convention has no word for it,
    and one with no format argument that reads no float8 cache's dtype (ALONE_TEST's question)."""
    convention = impl.convention
    if convention.format_position is not None:
        if convention.format_name(fmt.name) is None:
            pytest.skip(f"the {convention.name} convention has no kv_cache_dtype for {fmt.says} caches")
        reason = declined(impl, fmt, device)
        if reason:
            pytest.skip(reason)
        return impl
    if takes_cache_dtype(impl):
        return told(impl, fmt.name)
    answer = untold_answer(impl, fmt, device)
    if answer.kind == "declines":
        pytest.skip(answer.detail)
    if not reads_format(impl, device):  # a kernel written for e4m3 alone is not held to this format's bytes
        pytest.skip(f"{impl.name} takes no format argument and reads no float8 cache's dtype: it accepts "
                    f"{fmt.dtype} caches and writes {answer.detail} ({ALONE_TEST} says so)")
    return impl


def format_cases(impl: Implementation, fmt: Format, **space: object) -> st.SearchStrategy[Case]:
    """impl's Cases with caches of fmt: the float8 dtype, and uint8 where a call can say the format."""
    dtypes = (fmt.dtype, "uint8") if tellable(impl) else (fmt.dtype,)
    return impl.cases(cache_formats=(fmt.name,), cache_dtypes=dtypes, **space)


def inputs_unmodified(impl: Implementation, before: dict[str, torch.Tensor], after: dict[str, torch.Tensor],
                      case: Case, fmt: Format) -> None:
    for name in ("k", "v", "cache_loc", "k_scale", "v_scale"):
        as_bytes = lambda t: t.reshape(-1).view(torch.uint8)  # noqa: E731 (NaN-safe; a 0-d scale too)
        if name in before and not torch.equal(as_bytes(before[name]), as_bytes(after[name])):
            fail(impl, f"modified its input {name} (an {fmt.says} call):", f"{name}'s buffer changed", case)


def check_drawn(data, impl: Implementation, device: torch.device, recipes: tuple[str, ...], fmt: Format) -> None:
    """Drawn Cases of fmt (a recipe drawn among those held): whole caches equal the reference's, and no input
    changes."""
    target = held(impl, fmt, device)
    size = "large" if device.type == "cuda" else "small"
    case = data.draw(format_cases(impl, fmt, recipes=recipes, size=size, allow_out_of_range=True), label="case")
    built = build(case, device)
    expected = run_reference(case, device, built.copy(inputs=False))
    before = built.snapshot()
    actual, error = run_impl(case, target, device, built)
    if error:
        fail(target, f"raises on a valid {fmt.says} call:", error, case)
    report = compare_caches(expected, actual)
    if report:
        fail(target, f"differs from the reference on an {fmt.says} cache (recipe {case.recipe}, {case.cache_dtype}):",
             report, case)
    inputs_unmodified(target, before, actual.buffers, case, fmt)


def edge_case(edges: tuple[Edge, ...], cache_dtype: str, recipe: str, fmt: Format) -> Case:
    """One token, one head, the edge values in K and V (V reversed), slot 2 of 4 one-slot pages, scale 1."""
    n = len(edges)
    over = tuple(Override(t, i if t == "k" else n - 1 - i, bits, label)
                 for t in ("k", "v") for i, (bits, label, _, _) in enumerate(edges))
    return Case(num_tokens=1, num_heads=1, head_dim=n, page_size=1, num_pages=4, cache_loc=(2,),
                cache_dtype=cache_dtype, overrides=over, recipe=recipe, cache_format=fmt.name)


def check_edges(edges: tuple[Edge, ...], cache_dtype: str, impl: Implementation, device: torch.device, recipe: str,
                fmt: Format) -> None:
    """The reference gives the stated bytes at the format's edges, and the implementation the reference's."""
    target = held(impl, fmt, device)
    if cache_dtype == "uint8":
        _untellable(impl, fmt)
    case = impl.fit(edge_case(edges, cache_dtype, recipe, fmt))
    expected = run_reference(case, device)
    slot = expected.k_cache.view(torch.uint8)[2, 0, 0].cpu().tolist()
    column = 2 if RECIPES[case.recipe].overflow == "saturate" else 3
    stated = [edge[column] for edge in edges]
    assert slot == stated, (f"the reference's {fmt.says} bytes at the edges (recipe {case.recipe}) are "
                            f"{[hex(b) for b in slot]}, docs/e5m2.md states {[hex(b) for b in stated]}")
    actual, error = run_impl(case, target, device)
    if error:
        fail(target, f"raises on a valid {fmt.says} call (edge values):", error, case)
    report = compare_caches(expected, actual)
    if report:
        fail(target, f"differs from the reference at {fmt.says}'s edges (recipe {case.recipe}, {cache_dtype}):",
             report, case)


def check_all_patterns(dtype: str, recipe: str, scales: tuple[Scale, Scale], impl: Implementation,
                       device: torch.device, fmt: Format) -> None:
    """Every bf16/fp16 pattern into a cache of fmt (test_exhaustive's Case and fill): float8 caches, and
    uint8 ones for one of the scale pairs."""
    target = held(impl, fmt, device)
    cache_dtype = "uint8" if scales is CPU_SCALES["1e-30/none"] and tellable(impl) else fmt.dtype
    case = impl.fit(pattern_case(dtype, *scales, recipe).replace(cache_format=fmt.name, cache_dtype=cache_dtype))
    expected = fill_patterns(build(case, device))
    run_reference(case, device, expected)
    actual = fill_patterns(build(case, device))
    execute(target, actual, fill=FILL)
    report = compare_caches(expected, actual)
    if report:
        fail(target, f"differs from the reference over all {dtype} patterns into an {fmt.says} cache ({cache_dtype}; "
                     f"k in order, v permuted by {PERMUTE}), recipe {case.recipe}, k_scale {case.k_scale}, v_scale "
                     f"{case.v_scale}:", report, case, fill=FILL)


def check_storage_and_spelling(data, impl: Implementation, device: torch.device, fmt: Format) -> None:
    """float8 caches of fmt, and uint8 caches told cache_dtype by name or by torch dtype: the same bytes
    from the implementation itself (whole buffers compared)."""
    held(impl, fmt, device)
    _untellable(impl, fmt)
    case = data.draw(impl.cases(cache_formats=(fmt.name,), cache_dtypes=(fmt.dtype,), allow_out_of_range=True),
                     label="case")
    calls = ((case, fmt.name), (case.replace(cache_dtype="uint8"), fmt.name))
    if impl.convention.format_position is None:  # kv_cache_dtype has no torch-dtype spelling
        calls += ((case.replace(cache_dtype="uint8"), fmt.torch_dtype),)
    built = []
    for c, spelled in calls:
        target = told(impl, spelled)
        actual, error = run_impl(c, target, device)
        if error:
            fail(target, f"raises on a valid {fmt.says} call ({c.cache_dtype} caches, cache_dtype={spelled!r}):",
                 error, c)
        built.append(actual)
    for actual, (c, spelled) in zip(built[1:], calls[1:]):
        report = compare_caches(built[0], actual)
        if report:
            fail(impl, f"uint8 caches with cache_dtype={spelled!r} hold other bytes than {fmt.dtype} caches "
                       f"(expected: the {fmt.dtype} call's bytes):", report, c)


def check_formats_alternate(data, impl: Implementation, device: torch.device, fmt: Format,
                            order: tuple[str, ...]) -> None:
    """One uint8 layout written in each format of `order` in turn (other data each time): each call
    bit-exact, so nothing of one format's call (a remembered launch, say) leaks into the next. Skips unless
    impl is held to fmt and a call can say the format."""
    held(impl, fmt, device)
    _untellable(impl, fmt)
    case = data.draw(impl.cases(cache_dtypes=("uint8",), allow_out_of_range=True), label="case")
    seeds = data.draw(st.lists(st.integers(0, 2**32 - 1), min_size=len(order), max_size=len(order)), label="seeds")
    for seed, name in zip(seeds, order):
        target = impl if name == "fp8_e4m3" else told(impl, name)
        check_case(case.replace(seed=seed, cache_format=name), target, device)


def check_per_head(data, impl: Implementation, device: torch.device, recipes: tuple[str, ...], fmt: Format) -> None:
    """Per-head scales ([H] float32, strided or not) on caches of fmt, a recipe drawn among those held: bit-exact
    (test_per_head's property)."""
    _skip_unless_per_head(impl)
    target = held(impl, fmt, device)
    case = data.draw(format_cases(impl, fmt, recipes=recipes, allow_out_of_range=True, min_heads=2), label="case")
    values = data.draw(per_head_values(case.num_heads), label="k_scale_per_head")
    step = data.draw(st.sampled_from((1, 2)), label="scale_step")
    expected = _per_head(build(case, device), "k_scale", values, step)
    run_reference(case, device, expected)
    actual, error = run_impl(case, target, device, _per_head(build(case, device), "k_scale", values, step))
    if error:
        fail(target, f"raises on a valid {fmt.says} call with per-head k_scale {list(values)}:",
             f"{error}\n{per_tensor_twin(case, {'k_scale': values}, step)}")
    report = compare_caches(expected, actual)
    if report:
        fail(target, f"differs from the reference on an {fmt.says} cache with per-head k_scale {list(values)} "
                     f"(recipe {case.recipe}):", f"{report}\n{per_tensor_twin(case, {'k_scale': values}, step)}")


def check_uint8_alone_is_e4m3(edges: tuple[Edge, ...], impl: Implementation, device: torch.device,
                              fmt: Format) -> None:
    """A uint8 cache and no cache_dtype: e4m3 bytes (fmt's differ on these values: they cannot be confused)."""
    case = impl.fit(edge_case(edges, "uint8", impl.recipe or "divide", fmt).replace(cache_format="fp8_e4m3"))
    expected = run_reference(case, device)
    other = run_reference(case.replace(cache_format=fmt.name), device)
    assert compare_caches(expected, other) is not None, f"e4m3 and {fmt.says} bytes coincide on the edge values"
    actual, error = run_impl(case, impl, device)
    if error:
        fail(impl, "raises on a valid call (uint8 caches, no cache_dtype):", error, case)
    report = compare_caches(expected, actual)
    if report:
        fail(impl, "a uint8 cache with no cache_dtype must hold e4m3 bytes:", report, case)


def check_float8_cache_alone(impl: Implementation, device: torch.device, fmt: Format) -> None:
    """A float8 cache of fmt and no format argument (SGLang's signature: the tensor's dtype is the only word
    for the format) is written in fmt or refused. Fails for a kvfp8 implementation that accepts it without
    reading its dtype (it writes what it writes into an e4m3 cache, or those values cast), where it reads no
    float8 cache's dtype (one with a cache_dtype parameter must read it when not told). One that reads the
    dtype is held to fmt's bytes by the properties instead."""
    if impl.convention.format_position is not None:
        pytest.skip(f"the {impl.convention.name} convention always says the cache format (kv_cache_dtype)")
    answer = untold_answer(impl, fmt, device)
    if answer.kind == "declines":
        pytest.skip(answer.detail)
    told_elsewhere = takes_cache_dtype(impl)
    if answer.kind != "writes" and not told_elsewhere and reads_format(impl, device):
        pytest.skip(f"{impl.name} reads a float8 cache's dtype: its {fmt.dtype} caches are held to {fmt.says}'s "
                    "bytes by the properties")
    if answer.kind != "writes":  # the plain call's Case and diff, as untold_answer asked it
        why = ("when told no cache_dtype= (the cache's dtype says the format: read it, or refuse the cache)"
               if told_elsewhere else "and reads no float8 cache's dtype (a cache of a format it does not write "
                                      "must be refused)")
        fail(_untold(impl), f"does not validate a {fmt.dtype} cache given with no format argument: it accepts such "
                            f"caches and writes {answer.detail}, {why}:", answer.report, answer.case)


def check_contradiction_refused(caches: tuple[str, str], cache_dtype: object, named: str, impl: Implementation,
                                device: torch.device, fmt: Format) -> None:
    """A float8 cache whose dtype contradicts cache_dtype (or the other cache) is a ValueError naming it,
    raised before anything is written. This repository's message: kernels that declare the format only."""
    if not takes_cache_dtype(impl):
        pytest.skip(f"{impl.name} takes no cache_dtype=: the contradiction error is this project's cache_dtype "
                    "contract")
    case = small_case(impl)
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


def check_custom_op_and_compile(data, impl: Implementation, device: torch.device, recipes: tuple[str, ...],
                                fmt: Format) -> None:
    """The custom op with cache_dtype passes opcheck (float8 caches: all but test_schema,
    pytorch/pytorch#135998; uint8: all), and a torch.compile(fullgraph=True) caller writes the reference's
    bytes. This repository's kernel only, as conformance/test_compile.py."""
    from torch._dynamo.testing import CompileCounterWithBackend

    encoder = fused_encoder(impl)
    case = data.draw(held(impl, fmt, device).cases(recipes=recipes, cache_formats=(fmt.name,), **SMALL), label="case")
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
    check_case(case, Implementation(f"compiled-{BACKEND}-{encoder}", fn, {"cache_dtype": fmt.name}), device)
    assert_op_traced(counter)
