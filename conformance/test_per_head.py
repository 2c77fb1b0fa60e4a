"""Per-head scales: a float32 k_scale or v_scale of shape [H], head h's bytes scaled by scale[h].

vLLM's per-attention-head FP8 KV-cache scales (vllm#30141) reach the write as `[num_kv_heads]` tensors,
indexed `scale[head]`. The spec (kernel.reference.head_scales) applies the held recipe with each head's
own scale; every other step is the per-tensor write's. One scale tensor may be per-head and the other
not; a per-head tensor may be a strided view (a column of a [2, H] K/V scale table, say).

Also: the scale tensor is left unmodified; one value for every head writes what that value as one
element writes; and (CUDA) a captured call reads the tensor when replayed.
A Case whose per-tensor twin (the same call, one scale a cache) writes wrong bytes too does not fail here:
that is test_bit_exact's defect, and failing on it would shrink every per-head failure to it.
Only implementations whose convention passes per-head scales are called (the kvfp8 convention, this
repository's kernel, and vllm-per-head, opt-in); the others skip, saying so. Cases here are not saved as
failure files: a Case holds one scale per cache, so the report quotes the per-head values instead.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hypothesis import assume, event, given
from hypothesis import strategies as st

from conformance.budgets import share
from conformance.bytediff import compare_caches
from conformance.harness import fail, run_impl, run_reference
from conformance.impls import test_device as _test_device  # not collected as a test
from conformance.test_graphs import _call, capture, graph_cases, graph_settings, restore
from strategies.build import Built, build
from strategies.case import Case
from strategies.scales import per_head_values


def _per_head(built: Built, name: str, values: tuple[float, ...], step: int) -> Built:
    """built with `name` replaced by a [H] float32 view: every `step`-th element of a fresh buffer whose
    gaps hold NaN (a kernel that reads a gap writes NaN bytes)."""
    buffer = torch.full((len(values) * step,), float("nan"), dtype=torch.float32, device=built.k.device)
    view = buffer[::step]
    view.copy_(torch.tensor(values, dtype=torch.float32))
    return dataclasses.replace(built, **{name: view})


# The per-head and format properties vary what the per-tensor e4m3 ones hold fixed (the scale's index, the
# encoder's constants) over layouts that run the same kernel code as test_bit_exact's. Each draws its recipe
# among those held (one test, not one a recipe: on CUDA nearly every example compiles a kernel variant), with
# half the profile's examples.
variant_settings = share(2)


#: The stride of each [H] scale: one for both, or one a scale (K's and V's drawn apart: a wrapper that passes
#: one scale's stride for both reads V's scale with K's, seen held out).
Steps = int | dict[str, int]


def step_of(step: Steps, name: str) -> int:
    return step if isinstance(step, int) else step[name]


def per_tensor_twin(case: Case, values: dict[str, tuple[float, ...]], step: Steps) -> str:
    """The line a per-head failure ends with: its [H] scales, and the same call with the Case's own per-tensor
    scales, which the report replays (conformance/diagnosis/classify.py): where that fails too, the defect is
    not the per-head scales' and is diagnosed as every other Case is; where it passes, the report tries the
    wrong readings of the [H] scales (conformance/diagnosis/per_head.py)."""
    scales = json.dumps({"values": {k: list(v) for k, v in values.items()}, "step": step})
    return f"per-head scales: {scales}; per-tensor twin (the same call, one scale a cache), case: " \
           f"{json.dumps(case.to_dict())}"


def _twin_writes_wrong_bytes(case: Case, impl, device: torch.device) -> bool:
    """Whether the Case's own per-tensor call writes other bytes than the reference (a raise is not counted:
    a kernel that takes only [H] scales keeps its per-head failures)."""
    expected, actual = build(case, device), build(case, device)
    run_reference(case, device, expected)
    actual, error = run_impl(case, impl, device, actual)
    return error is None and bool(compare_caches(expected, actual))


#: The failure's words when a head of a per-head call is neither the reference's nor the implementation's own
#: per-tensor write with that head's scale (conformance/diagnosis/classify.py keys it as the [H] scale's).
UNLIKE_OWN = "differs from its own per-tensor write with that head's scale"


def _head_unlike_own(case: Case, values: dict[str, tuple[float, ...]], expected: Built, actual: Built, impl,
                     device: torch.device) -> str | None:
    """Where the per-tensor twin is wrong too, the [H] scales can still be judged against the implementation
    itself: each head of a per-head call must hold what its own call with that head's scale as a one-element
    tensor writes there (whatever its arithmetic). The first head that differs from both that call and the
    reference, in words; None where there is none (or such a call raises)."""
    def head(built: Built, name: str, h: int) -> torch.Tensor:
        return getattr(built, name).view(torch.uint8)[..., h, :].cpu()

    for h in range(case.num_heads):
        wrong = [n for n in ("k_cache", "v_cache") if not torch.equal(head(actual, n, h), head(expected, n, h))]
        if not wrong:
            continue  # the reference's bytes: nothing to ask of its own write
        own = build(case, device)
        own = dataclasses.replace(own, **{n: torch.tensor([v[h]], dtype=torch.float32, device=device)
                                          for n, v in values.items()})
        own, error = run_impl(case, impl, device, own)
        if error:
            return None
        for name in wrong:
            got, mine = head(actual, name, h), head(own, name, h)
            if not torch.equal(got, mine):
                scales = ", ".join(f"{n} {v[h]!r}" for n, v in values.items())
                return (f"{name} head {h} {UNLIKE_OWN} ({scales}): {int((got != mine).sum())} of {got.numel()} "
                        "bytes")
    return None


def _skip_unless_per_head(impl) -> None:
    if not impl.convention.per_head_scales:
        pytest.skip(f"the {impl.convention.name} convention passes no per-head scales (a [H] k_scale/v_scale)")


#: H of the many-heads property: past 16, up to 64, the KV heads of multi-head-attention models (32 for
#: Llama-2-7B, 40 for Llama-2-13B), where a head table or tile sized for grouped-query models (8 or 16) ends.
MANY_HEADS = (17, 64)


@variant_settings
@given(data=st.data())
def test_per_head_scales_are_bit_exact(data, impl, device, recipes):
    _skip_unless_per_head(impl)
    size = "large" if device.type == "cuda" else "small"
    case = data.draw(impl.cases(recipes=recipes, size=size, allow_out_of_range=True, min_heads=2), label="case")
    _check_per_head(data, impl, device, case)


@variant_settings
@given(data=st.data())
def test_per_head_scales_on_many_heads(data, impl, device, recipes):
    """The same property where H is past 16 (MANY_HEADS; the other property draws H <= 6 on the CPU), with
    few tokens and small heads, so that the interpreter's cost stays that of a small Case. Shrinks to H = 17."""
    _skip_unless_per_head(impl)
    case = data.draw(impl.cases(recipes=recipes, size="small", allow_out_of_range=True, min_heads=MANY_HEADS[0],
                                max_heads=MANY_HEADS[1], max_tokens=4, max_dim=32), label="case")
    _check_per_head(data, impl, device, case)


def _check_per_head(data, impl, device: torch.device, case: Case) -> None:
    """Bit-exactness of one drawn Case with [H] scales (drawn here) for K, V or both, whole caches compared."""
    which = data.draw(st.sampled_from((("k_scale",), ("v_scale",), ("k_scale", "v_scale"))), label="per_head")
    values = {name: data.draw(per_head_values(case.num_heads), label=f"{name}_per_head") for name in which}
    step = {name: data.draw(st.sampled_from((1, 2)), label=f"{name}_step") for name in which}
    expected, actual = build(case, device), build(case, device)
    for name, vals in values.items():
        expected, actual = (_per_head(b, name, vals, step[name]) for b in (expected, actual))
    run_reference(case, device, expected)
    scales_before = {name: getattr(actual, name)._base.clone() for name in values}
    actual, error = run_impl(case, impl, device, actual)
    given_scales = "; ".join(f"{name}[h] = {list(vals)} (stride {step[name]})" for name, vals in values.items())
    if error:
        fail(impl, f"raises on a valid call with per-head scales ({given_scales}):",
             f"{error}\n{per_tensor_twin(case, values, step)}")
    report = compare_caches(expected, actual)
    if report and _twin_writes_wrong_bytes(case, impl, device):
        # The same call with one scale a cache is wrong too: test_bit_exact's defect, which it reports. Failing
        # here would shrink to that defect's Case and hide a per-head one behind it (a held-out kernel ignored
        # cache_loc's stride, and its per-head bug went unseen), so the search goes on for a Case that shows
        # the per-head scales alone, unless a head is unlike the implementation's own per-tensor write with
        # its scale (a tile's scales read at the tile's index, behind subnormals rounded on every call)
        unlike = _head_unlike_own(case, values, expected, actual, impl, device)
        if unlike:
            fail(impl, f"with per-head scales ({given_scales}; recipe {case.recipe}), a head {UNLIKE_OWN}:",
                 f"{unlike}\n{per_tensor_twin(case, values, step)}")
        event("per-tensor twin wrong too: left to test_bit_exact")
        return
    if report:
        fail(impl, f"differs from the reference with per-head scales ({given_scales}; recipe {case.recipe}):",
             f"{report}\n{per_tensor_twin(case, values, step)}")
    for name, before in scales_before.items():
        if not torch.equal(getattr(actual, name)._base.view(torch.int32), before.view(torch.int32)):
            fail(impl, f"modified its input {name} (a per-head scale tensor, {given_scales}):",
                 f"{name}'s buffer before: {before.tolist()}, after: {getattr(actual, name)._base.tolist()}")


@variant_settings
@given(data=st.data())
def test_one_scale_for_every_head_is_the_per_tensor_write(data, impl, device, recipes):
    """Equivalence: a [H] scale holding one value everywhere writes what that value as a one-element
    tensor writes (both calls of the implementation itself, whole caches compared)."""
    _skip_unless_per_head(impl)
    case = data.draw(impl.cases(recipes=recipes, size="small", allow_out_of_range=True, min_heads=2),
                     label="case")
    assume(case.k_scale.kind != "none")
    value = case.k_scale.value
    one = dataclasses.replace(build(case, device), k_scale=torch.tensor([value], dtype=torch.float32, device=device))
    every = _per_head(build(case, device), "k_scale", (value,) * case.num_heads, 1)
    for built in (one, every):
        _, error = run_impl(case, impl, device, built)
        if error:
            fail(impl, f"raises on a valid call (k_scale {list(built.k_scale.shape)} of {value!r}):", error)
    report = compare_caches(one, every)
    if report:  # with the per-tensor twin line, the report diagnoses it as a per-head failure (per_head.py)
        fail(impl, f"k_scale of {value!r} for each of {case.num_heads} heads writes other bytes than k_scale "
                   f"[{value!r}] (recipe {case.recipe}; expected: the one-element call's bytes):",
             f"{report}\n{per_tensor_twin(case, {'k_scale': (value,) * case.num_heads}, 1)}")


@pytest.mark.cuda
@pytest.mark.skipif(_test_device().type != "cuda", reason="CUDA graphs need CUDA (no CUDA device here, or "
                                                        "TRITON_INTERPRET is set)")
@graph_settings
@given(data=st.data())
def test_per_head_scales_are_read_at_replay(data, impl, device):
    """A captured call reads its per-head scale tensor when replayed: values copied in after the capture
    are the ones the replay's bytes follow (a checkpoint's scales loaded after the graphs were captured)."""
    _skip_unless_per_head(impl)
    case = data.draw(graph_cases(impl, min_heads=2), label="case")
    captured_values = data.draw(per_head_values(case.num_heads), label="captured_k_scale")
    new_values = data.draw(per_head_values(case.num_heads), label="replayed_k_scale")
    built = _per_head(build(case, device), "k_scale", captured_values, 1)
    pristine = built.snapshot()
    graph = capture(impl, [_call(impl, built)], [case])
    restore(built, pristine)
    built.k_scale.copy_(torch.tensor(new_values, dtype=torch.float32))
    graph.replay()
    torch.cuda.synchronize()
    expected = _per_head(build(case, device), "k_scale", new_values, 1)
    run_reference(case, device, expected)
    report = compare_caches(expected, built)
    if report:
        fail(impl, f"a replay does not follow per-head scales copied in after the capture (captured "
                   f"{list(captured_values)}, replayed with {list(new_values)}; recipe {case.recipe}):", report)


@pytest.mark.parametrize("shape", [(2,), (1, 3), (3, 1)])
def test_a_scale_of_another_shape_is_refused(shape, impl, device):
    """A scale that is neither one value nor [H] values (H = 3 here) is a ValueError naming it."""
    _skip_unless_per_head(impl)
    case = impl.fit(Case(num_tokens=2, num_heads=3, head_dim=16, page_size=4, num_pages=2, cache_loc=(1, 6),
                         seed=1, recipe=impl.recipe or "unfused"))
    built = dataclasses.replace(build(case, device), k_scale=torch.ones(shape, dtype=torch.float32, device=device))
    before = built.snapshot()
    if impl.is_ours:  # this repository's message; another implementation's need only be a ValueError naming k_scale
        with pytest.raises(ValueError, match=r"k_scale must be a 0-d or 1-element tensor, or a \[3\] tensor"):
            impl.run(built)
    else:
        try:
            impl.run(built)
        except ValueError as exc:
            if "k_scale" not in str(exc):
                fail(impl, f"refuses a k_scale of shape {shape} (H = 3) without naming it:", f"ValueError: {exc}")
        except Exception as exc:  # the implementation's own exception, reported as such
            fail(impl, f"refuses a k_scale of shape {shape} (H = 3) with {type(exc).__name__}, not ValueError:",
                 f"{type(exc).__name__}: {exc}")
        else:
            fail(impl, f"does not validate a k_scale of shape {shape} with H = 3 (neither one value nor one a "
                       "head):", "the call did not raise")
    for name in ("k_cache", "v_cache"):
        assert torch.equal(built.buffers[name], before[name]), f"{name} was written before the error"
