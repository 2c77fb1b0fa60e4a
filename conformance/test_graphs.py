"""Graphs: the call captured in a CUDA graph and replayed computes what the reference computes on
whatever the captured buffers hold at replay time.

Every capture warms up on a side stream first (so the Triton compile happens outside the capture),
runs one more eager call under `torch.cuda.set_sync_debug_mode("error")` (a host sync or a pageable
host-to-device copy raises), then captures under `torch.cuda.graph(..., capture_error_mode="global")`
with the garbage collector paused (conformance/capture.py says why) and every warning recorded: a capture
that syncs, copies from the host or warns fails the case.
Buffers are reset to their pristine bytes after the capture, so a replay that writes nothing (an
empty graph) shows up as a byte difference, and is named as such.

Float scales are captured as constants (docs/graphs.md): `test_float_scale_is_captured` checks
that a later call with another float does not change what the graph computes. A kernel that builds
a tensor from the float during the call either fails the capture (host-to-device copy) or replays
stale memory; either way that test fails.

Every property draws all it needs (new contents, eager cases) before its first call of the
implementation: a draw after a call would depend on how the call went, and an implementation whose
result depends on earlier calls (or on a CUDA state an earlier example left) then drew more or less on
a second run of one example, which Hypothesis reports as FlakyStrategyDefinition instead of the
failure. An exception of an eager call (the warm-up, a call between replays) is "raises on a valid
call", with the Case saved.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import pytest
import torch
from hypothesis import assume, given, note, settings
from hypothesis import strategies as st

from conformance.bytediff import compare_caches
from conformance.capture import graph_capture
from conformance.harness import describe_error, execute, fail, run_reference
from conformance.impls import Implementation
from conformance.impls import test_device as _test_device  # not collected as a test
from strategies import Case, Scale
from strategies.build import Built, build
from strategies.case import SCALE_KINDS
from strategies.fp import FP32, f32
from strategies.replay import new_contents, writing_cases

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(_test_device().type != "cuda",
                       reason="CUDA graphs need CUDA (no CUDA device here, or TRITON_INTERPRET is set)"),
]

# Each example captures one or more graphs (torch.cuda.graph syncs and collects garbage on entry),
# so the graph properties run a fraction of the profile's examples.
EXAMPLES = max(10, settings().max_examples // 5)
graph_settings = settings(max_examples=EXAMPLES)


def graph_cases(impl: Implementation, scale_kind: str | None = None, min_heads: int = 1) -> st.SearchStrategy[Case]:
    """A Case a graph of impl can hold: checked=False (the range check syncs), at least one write."""
    kinds = None if scale_kind is None else (scale_kind,)
    return writing_cases(impl.cases(size="large", checked=False, allow_out_of_range=True, scale_kinds=kinds,
                                    min_heads=min_heads))


def _call(impl: Implementation, built: Built) -> Callable[[], None]:
    """The bare call, no synchronization: it is captured."""
    return lambda: impl.invoke(built.call())


def capture(impl: Implementation, calls: list[Callable[[], None]], cases: list[Case]) -> torch.cuda.CUDAGraph:
    """Warm up on a side stream, check one eager round for syncs, then capture every call in one graph.

    Each step's failure is the implementation's, and is reported as such, with the Case of the call that
    failed (`cases[i]` is `calls[i]`'s; the capture as a whole, the first): an exception of an eager call
    (its own `assert` too) is "raises on a valid call", as everywhere.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call, case in zip(calls, cases):
            try:
                call()  # compiles the kernel, outside the capture
            except Exception as exc:
                fail(impl, "raises on a valid call:", describe_error(impl, exc), case, kind=type(exc).__name__)
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for call, case in zip(calls, cases):
                try:
                    call()
                except RuntimeError as exc:
                    fail(impl, "synchronizes with the host during the call, so it cannot be captured in a CUDA "
                               "graph:", f"{type(exc).__name__}: {exc}", case)
                except Exception as exc:  # not the sync check's error: the eager call itself raised
                    fail(impl, "raises on a valid call:", describe_error(impl, exc), case, kind=type(exc).__name__)
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    case = cases[0]
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with graph_capture(graph, stream=side, capture_error_mode="global"):
                for call in calls:
                    call()
        except Exception as exc:
            fail(impl, "failed under CUDA-graph capture:", capture_error(exc), case)
    if caught:
        fail(impl, "warned under CUDA-graph capture:",
             "; ".join(f"{w.category.__name__}: {w.message}" for w in caught), case)
    return graph


def capture_error(exc: BaseException) -> str:
    """A failed capture's errors, the first first: an error inside the capture makes torch.cuda.graph's exit
    fail too ("operation failed due to a previous error during capture"), and that one alone would hide the
    cause (an operation a capture forbids, or the GPU's memory running out while other processes held it)."""
    chain: list[BaseException] = []
    while exc is not None and len(chain) < 4:
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)  # as a traceback shows
    return "\n".join(f"{'then ' if i else ''}{type(e).__name__}: {e}" for i, e in enumerate(reversed(chain)))


def restore(built: Built, contents: dict[str, torch.Tensor]) -> None:
    """Copy `contents` into the built buffers in place (the graph holds their addresses)."""
    assert contents.keys() == built.buffers.keys(), (sorted(contents), sorted(built.buffers))
    for name, buf in built.buffers.items():
        assert buf.shape == contents[name].shape, (name, buf.shape, contents[name].shape)
        buf.copy_(contents[name])


def load(target: Built, case: Case) -> Built:
    """Fill target's buffers with `case`'s contents; returns target described as `case` (for reports)."""
    source = build(case, target.buffers["k"].device)
    restore(target, source.buffers)
    return dataclasses.replace(target, case=case, k_logical=source.k_logical, v_logical=source.v_logical)


def check_replay(impl: Implementation, actual: Built, pristine: dict[str, torch.Tensor], device: torch.device,
                 what: str) -> None:
    """The replayed caches (whole buffers) equal the reference on actual.case's contents."""
    torch.cuda.synchronize()
    expected = run_reference(actual.case, device)
    report = compare_caches(expected, actual)
    if report is None:
        return
    unchanged = all(torch.equal(actual.buffers[n].cpu(), pristine[n].cpu()) for n in ("k_cache", "v_cache"))
    changed_by_ref = any(not torch.equal(expected.buffers[n].cpu(), pristine[n].cpu())
                         for n in ("k_cache", "v_cache"))
    if unchanged and changed_by_ref:
        report = "the replay wrote nothing (is the captured graph empty?)\n" + report
    fail(impl, f"{what} (recipe {actual.case.recipe}):", f"{report}\ncase: {actual.case.to_json()}")


def captured(impl: Implementation, case: Case, device: torch.device) -> tuple[Built, torch.cuda.CUDAGraph,
                                                                                dict[str, torch.Tensor]]:
    """Build, capture one call, and reset the buffers to their pristine bytes; returns them and the graph."""
    built = build(case, device)
    pristine = built.snapshot()
    graph = capture(impl, [_call(impl, built)], [case])
    restore(built, pristine)
    return built, graph, pristine


@pytest.mark.parametrize("scale_kind", SCALE_KINDS)
@graph_settings
@given(data=st.data())
def test_capture_and_replay(data, scale_kind, impl, device):
    case = data.draw(graph_cases(impl, scale_kind), label="case")
    built, graph, pristine = captured(impl, case, device)
    graph.replay()
    check_replay(impl, built, pristine, device, "replay of the captured call")


@pytest.mark.parametrize("scale_kind", SCALE_KINDS)
@graph_settings
@given(data=st.data())
def test_replay_new_contents(data, scale_kind, impl, device):
    """Rewrite k, v, cache_loc, the scale tensors and the caches in place; replay; the new bytes follow."""
    case = data.draw(graph_cases(impl, scale_kind), label="case")
    rounds = []  # every round drawn before the first call (module docstring)
    for r in range(data.draw(st.integers(1, 3), label="rounds")):
        rounds.append((data.draw(new_contents(case), label=f"contents_{r}"),
                       data.draw(st.integers(1, 4), label=f"replays_{r}")))
    built, graph, pristine = captured(impl, case, device)
    for r, (new, replays) in enumerate(rounds):
        current = load(built, new)
        note(f"round {r}: seed={new.seed} cache_loc={new.cache_loc} scales={new.k_scale}, {new.v_scale}; "
             f"{replays} replays")
        for _ in range(replays):  # replaying on the same contents is idempotent
            graph.replay()
        check_replay(impl, current, build(new, device).buffers, device,
                     f"replay {r} after new contents were copied in")


def _with_scales(built: Built, case: Case) -> Built:
    """built with the float scales of `case` (another Case's floats), described as that call (for reports)."""
    return dataclasses.replace(built, case=case, k_scale=case.k_scale.value, v_scale=case.v_scale.value)


def other_floats(case: Case, factor: float) -> tuple[float, float]:
    """The float scales of the eager call after the capture: the Case's times factor, in fp32."""
    return f32(case.k_scale.value * factor), f32(case.v_scale.value * factor)


def reference_at_other_floats(case: Case, factor: float, device: torch.device) -> Built:
    """The reference's call on the Case's inputs with its floats times `factor`."""
    ref_other = _with_scales(build(case, device), other_case(case, factor))
    return run_reference(ref_other.case, device, ref_other)


def other_case(case: Case, factor: float) -> Case:
    """The Case of the eager call after the capture: its floats times factor, and the inputs that Case builds
    (values follow a scale's exponent, strategies.build), so its failure file replays that call bit for bit."""
    ks, vs = other_floats(case, factor)
    return case.replace(k_scale=Scale("float", ks), v_scale=Scale("float", vs))


def float_scale_experiment(impl: Implementation, case: Case, factor: float, device: torch.device) -> None:
    """Capture `case`'s call, make an eager call of `other_case`, then replay: each step is checked against
    the reference, and fails with the Case (inline, `captured: {json}`) and the factor, so the diagnosis can
    run the same experiment again (conformance.diagnosis.classify)."""
    built, graph, pristine = captured(impl, case, device)

    eager = build(other_case(case, factor), device)  # same impl, same kind of call, another float, after the capture
    execute(impl, eager)
    report = compare_caches(run_reference(eager.case, device), eager)
    if report:
        fail(impl, f"eager call with scale x{factor} after the capture:",
             f"{report}\ncaptured: {case.to_json()}", eager.case)

    graph.replay()
    check_replay(impl, built, pristine, device,
                 f"replay after an eager call with scale x{factor} (the graph must keep its float)")


@graph_settings
@given(data=st.data())
def test_float_scale_is_captured(data, impl, device):
    """A float scale is a constant of the graph: a later call with another float does not leak into it."""
    case = data.draw(graph_cases(impl, "float"), label="case")
    factor = data.draw(st.sampled_from((2.0, 0.5, 3.0, 0.7)), label="factor")
    ks, vs = other_floats(case, factor)
    assume(all(2.0**-126 <= s <= FP32.max_finite for s in (ks, vs)))
    # The same inputs under the other floats: can the reference tell the two apart?
    ref_other = reference_at_other_floats(case, factor, device)
    assume(compare_caches(run_reference(case, device), ref_other) is not None)
    float_scale_experiment(impl, case, factor, device)


@graph_settings
@given(data=st.data())
def test_several_calls_in_one_graph(data, impl, device):
    """Several layers' writes (each its own shapes and caches) captured in one graph."""
    layers = data.draw(st.lists(graph_cases(impl), min_size=2, max_size=4), label="layers")
    contents = [data.draw(new_contents(case), label=f"layer_{i}_contents") for i, case in enumerate(layers)]
    builts = [build(case, device) for case in layers]
    pristine = [b.snapshot() for b in builts]
    graph = capture(impl, [_call(impl, b) for b in builts], layers)
    for b, p in zip(builts, pristine):
        restore(b, p)
    graph.replay()
    for i, (b, p) in enumerate(zip(builts, pristine)):
        check_replay(impl, b, p, device, f"layer {i} of {len(layers)} in one graph")
    news = [load(b, new) for b, new in zip(builts, contents)]
    graph.replay()
    for i, cur in enumerate(news):
        check_replay(impl, cur, build(cur.case, device).buffers, device, f"layer {i} after new contents")


@graph_settings
@given(data=st.data())
def test_graphs_coexist_with_eager_calls(data, impl, device):
    """Two graphs of different shapes, replayed in turn, with eager calls on other buffers between."""
    first = data.draw(graph_cases(impl), label="first")
    second = data.draw(graph_cases(impl), label="second")
    eager_case = data.draw(impl.cases(size="large", checked=False), label="eager_case")
    first_contents = data.draw(new_contents(first), label="first_contents")
    built_a, graph_a, pristine_a = captured(impl, first, device)
    built_b, graph_b, pristine_b = captured(impl, second, device)

    eager = build(eager_case, device)
    graph_b.replay()
    execute(impl, eager)
    graph_a.replay()
    check_replay(impl, eager, build(eager_case, device).buffers, device, "eager call between replays")
    check_replay(impl, built_a, pristine_a, device, "first graph, replayed after the second")
    check_replay(impl, built_b, pristine_b, device, "second graph")

    new_a = load(built_a, first_contents)
    again = build(eager_case, device)
    graph_a.replay()
    execute(impl, again)
    graph_b.replay()  # the second graph rewrites the same bytes it wrote before
    check_replay(impl, new_a, build(new_a.case, device).buffers, device, "first graph, new contents")
    check_replay(impl, built_b, pristine_b, device, "second graph, replayed twice")
    check_replay(impl, again, build(eager_case, device).buffers, device, "second eager call")
