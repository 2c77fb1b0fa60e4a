"""The diagnosis machinery (conformance/diagnosis/ablation, effects, diagnose) on implementations written
here: ablations make valid Cases that move one dimension only; the reference itself has no defect; a
planted defect gets one key, by its effect and its trigger, whatever Case found it; two causes with the
same message get two keys; a pair of defects gets two; what no model explains is said so, with bytes.
The whole-report check over a corpus of one-defect kernels is meta_tests/test_defect_corpus.py.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.conventions import VLLM, VLLM_PADDED_KEYS
from conformance.diagnosis.ablation import ABLATIONS
from conformance.diagnosis.diagnose import Diagnoser, class_of
from conformance.impls import Implementation
from kernel import naive_fp8_set_kv_buffer
from kernel.plan import ScaleArg
from kernel.recipe import get_recipe
from strategies import cases
from strategies.build import build
from strategies.case import Case, Layout, Override, Scale

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _failures_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path / "failures"))


@settings(max_examples=60, deadline=None)
@given(case=cases(allow_out_of_range=True, max_tokens=6, max_heads=5, max_dim=40), data=st.data())
def test_every_ablation_makes_a_valid_case_the_reference_accepts(case: Case, data) -> None:
    """An ablation is a pure Case -> Case: the variant builds, the reference writes it, and it differs from
    the Case in the ablation's own dimension (the slots may move with it)."""
    ablation = data.draw(st.sampled_from(ABLATIONS), label="ablation")
    for variant in ablation.variants(case, "tensor1"):
        assert variant != case, ablation.name
        naive_fp8_set_kv_buffer(**build(variant, CPU).call())
        assert variant == Case.from_json(variant.to_json())
        assert list(ablation.variants(variant, "tensor1")) != [variant], ablation.name


def _impl(fn, recipe: str = "unfused") -> Implementation:
    return Implementation(fn.__name__.strip("_"), fn, {}, recipe=recipe)


def _reference(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
               recipe="unfused", checked=False):
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe,
                            checked=checked)


@settings(max_examples=25, deadline=None)
@given(case=cases(allow_out_of_range=True, max_tokens=5, max_heads=4, max_dim=32))
def test_the_reference_has_no_defect(case: Case) -> None:
    assert Diagnoser(_impl(_reference), CPU).diagnose(case) == []


def _pow2_tiles(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                recipe="unfused", checked=False):
    """Raises one and the same message for H and for D not a power of two: two causes, one text."""
    for n in k_cache.shape[-2:]:
        if n & (n - 1):
            raise ValueError("arange's range must be a power of 2")
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def _case(**changes) -> Case:
    base = Case(num_tokens=3, num_heads=2, head_dim=8, page_size=4, num_pages=3, cache_loc=(5, 0, 9),
                k_scale=Scale("tensor1", 0.3), v_scale=Scale("float", 0.7), seed=3, recipe="unfused")
    return base.replace(**changes)


def _groups(*keys: str) -> dict:
    """A report's groups of one finding a key, for the report's rules."""
    from conformance.diagnosis.classify import Finding
    return {k: [("t", Finding(class_of(k), k, "?"))] for k in keys}


def _raises_on_2d_tensor_scales(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                                use_triton=True, *, recipe="unfused", checked=False):
    """Held-out batch 53: a tensor scale shaped [1, -1, 1] for [T, H, D], divided in place into a [T, H*D]
    input (an in-place op cannot grow its rank): raises for 2-D inputs with tensor scales, not with floats."""
    if k.dim() == 2 and isinstance(k_scale, torch.Tensor):
        raise RuntimeError("output with shape [1, 1] doesn't match the broadcast shape [1, 1, 1]")
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_a_raise_that_a_float_scale_does_not_make_is_triggered_by_tensor_scales() -> None:
    """The plain call's scale is a tensor ([1]); ablations move dimensions back to it, so none says "tensor".
    A raise that the same values as Python floats do not make names it; one that floats make too does not."""
    case = _case(input_rank=2, k_scale=Scale("tensor1", 0.5), v_scale=Scale("tensor1", 0.25))
    [found] = [f for f in Diagnoser(_impl(_raises_on_2d_tensor_scales), CPU).diagnose(case) if f.cls == "raises"]
    assert found.key == "raises:RuntimeError@input-2d+scale-tensor", found.key
    assert "as a tensor" in found.title
    keys = {f.key for f in Diagnoser(_impl(_pow2_tiles), CPU).diagnose(case.replace(num_heads=3))}
    assert keys == {"raises:ValueError@heads-not-pow2"}, keys


def _two_runtime_errors(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                        *, recipe="unfused", checked=False):
    """Held-out batch 53: one exception type from two causes: `index_copy_` given an int32 cache_loc (3-D
    caches), and `view(T, -1, D)` of an empty batch's 2-D input (the -1 ambiguous)."""
    if k.dim() == 2 and k.shape[0] == 0:
        raise RuntimeError(f"cannot reshape tensor of 0 elements into shape [0, -1, {k_cache.shape[-1]}]")
    if k_cache.dim() == 3 and cache_loc.dtype == torch.int32:
        raise RuntimeError("index_copy_(): Expected a long tensor for index, but got Int")
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_one_exception_type_two_messages_two_defects() -> None:
    """Shrinking an empty batch that raises must not slide onto the other cause's raise of the same type: a
    variant raising another message does not show this one."""
    d = Diagnoser(_impl(_two_runtime_errors), CPU)
    both = _case(num_tokens=0, cache_loc=(), input_rank=2, cache_rank=3, loc_dtype="int32")
    assert {f.key for f in d.diagnose(both)} == {"raises:RuntimeError@empty-batch+input-2d"}
    index = _case(cache_rank=3, loc_dtype="int32")
    assert {f.key for f in d.diagnose(index)} == {"raises:RuntimeError@cache-3d+loc-int32"}


def test_one_message_two_triggers_two_defects() -> None:
    d = Diagnoser(_impl(_pow2_tiles), CPU)
    heads = {f.key for f in d.diagnose(_case(num_heads=3))}
    dims = {f.key for f in d.diagnose(_case(head_dim=24))}
    both = {f.key for f in d.diagnose(_case(num_heads=3, head_dim=24))}
    assert heads == {"raises:ValueError@heads-not-pow2"}, heads
    assert dims == {"raises:ValueError@dim-not-pow2"}, dims
    assert both <= heads | dims and both, both


def _scale_on_the_axis_of_length_h(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                                   use_triton=True, *, recipe="unfused", checked=False):
    """Halves K where T = H, as code that finds "the axis of length H" by its length goes wrong."""
    if k.shape[0] == k.shape[1]:
        k = k / 2
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_a_defect_only_where_t_equals_h_is_triggered_by_the_coincidence() -> None:
    """Adding a token and dropping one both pass: the trigger is T = H, not more than one token nor H's size."""
    case = _case(num_tokens=3, num_heads=3, cache_loc=(5, 0, 9), k_scale=Scale("float", 0.3))
    found = {f.key for f in Diagnoser(_impl(_scale_on_the_axis_of_length_h), CPU).diagnose(case)}
    assert found and {k.split("@")[1] for k in found} == {"tokens-equal-heads"}, found


def test_t_equal_to_h_is_drawn_and_shrinks_to_two() -> None:
    from hypothesis import find

    from strategies.dims import dims
    # its own budget: the local "dev" profile's 15 examples (inherited) sometimes drew no T = H at all
    found = find(dims(), lambda d: d.num_tokens == d.num_heads >= 2,
                 settings=settings(database=None, max_examples=1000, derandomize=True))
    assert (found.num_tokens, found.num_heads) == (2, 2), found


def _loc_contiguous(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                    *, recipe="unfused", checked=False):
    """Reads cache_loc as if contiguous: a wrong slot for some tokens, and the slots they name left unwritten."""
    loc = cache_loc.as_strided(cache_loc.shape, (1,), cache_loc.storage_offset())
    _reference(k, v, k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


@pytest.mark.parametrize("case", [
    _case(loc_step=2), _case(loc_step=3, cache_dtype="uint8", k_layout=Layout((0, 2, 1), (0, 1, 0))),
    _case(loc_step=2, cache_loc=(5, -1, 9), overrides=(Override("k", 0, 0xFFC0, "-nan"),)),
])
def test_symptoms_of_one_cause_are_one_defect(case: Case) -> None:
    found = {f.key for f in Diagnoser(_impl(_loc_contiguous), CPU).diagnose(case)}
    assert found == {"strides:cache-loc-ignored@strided-loc"}, found


def _flush_and_pad(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                   *, recipe="unfused", checked=False):
    """Two defects: padding slot -1 is the last slot, and e4m3 subnormal results are written as zero."""
    n = k_cache.shape[0] * (page_size if k_cache.dim() == 4 else 1)
    loc = torch.where(cache_loc == -1, n - 1, cache_loc)
    before = [c.view(torch.uint8).clone() for c in (k_cache, v_cache)]
    _reference(k, v, k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    for cache, old in zip((k_cache, v_cache), before):
        b = cache.view(torch.uint8)
        sub = ((b & 0x7F) >= 1) & ((b & 0x7F) <= 7) & (b != old)  # the bytes it wrote
        b.copy_(torch.where(sub, b & 0x80, b))


def test_a_pair_of_defects_is_two_defects() -> None:
    """The flush skips a byte equal to the slot's old one: in a re-drawn call of 32 tokens that refutes the
    flush's model, and what remains is a wrong subnormal path, the wider class the report merges it into."""
    from conformance.diagnosis.report import _merge_wider
    d = Diagnoser(_impl(_flush_and_pad), CPU)
    found = set()
    for case in (_case(cache_loc=(5, -1, 9)), _case(cache_loc=(1, -1, 2), seed=8)):
        found |= {f.key for f in d.diagnose(case)}
    assert "padding:wraps-to-end@padding" in found, found
    groups = _groups(*found)
    _merge_wider(groups)
    assert len(groups) == 2, found


def _xor(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
         recipe="unfused", checked=False):
    """Flips one bit of every written byte whose low bit is set: no recipe, scale or rule explains it."""
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    b = v_cache.view(torch.uint8).flatten()
    b[::7] ^= 0x10


def test_what_nothing_explains_is_said_so_with_its_bytes() -> None:
    [f] = Diagnoser(_impl(_xor), CPU).diagnose(_case())
    assert f.key.startswith(("wrong-bytes:unexplained@", "wrong-slot:unexplained@")), f
    assert "->" in f.facts["detail"], f.facts
    # the kinds of value its expected bytes are, as facts the report weighs, and in the detail's words too
    kinds = f.facts["value_kinds"]
    assert kinds and set(kinds) <= {"±0", "subnormal", "normal", "largest", "NaN/inf"}, f.facts
    assert all(kind in f.facts["detail"].rpartition("expected values: ")[2] for kind in kinds), f.facts


def test_a_big_cache_failure_its_small_twin_shows_is_the_small_twins_defect() -> None:
    """test_input_rows_past_2_31_elements fails for a value defect as much as for 32-bit offsets: the
    classifier replays its small twin, and only a twin that passes leaves `big-cache:wrong-offsets`."""
    from conformance.diagnosis.classify import _bigcache_case
    impl = _impl(_xor)
    small = _bigcache_case("test_input_rows_past_2_31_elements", {}, impl)
    assert small is not None
    [f] = Diagnoser(impl, CPU).big(small, "inputs above 2**31 elements")
    assert not f.key.startswith("big-cache:"), f.key
    assert Diagnoser(_impl(_reference), CPU).big(small, "inputs above 2**31 elements")[0].key == \
        "big-cache:wrong-offsets@big-cache"


def test_a_raise_no_replay_triggered_joins_the_one_diagnosed_raise_of_its_type() -> None:
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_same_exception
    untriggered = Finding("raises", "raises:TypeError: cache_loc must be int64", "raises TypeError")
    groups = {"raises:TypeError@loc-int32": [("a", Finding("raises", "raises:TypeError@loc-int32", "raises"))],
              untriggered.key: [("b", untriggered)],
              "raises:ValueError: other": [("c", Finding("raises", "raises:ValueError: other", "raises"))]}
    _merge_same_exception(groups)
    assert sorted(groups) == ["raises:TypeError@loc-int32", "raises:ValueError: other"], sorted(groups)
    assert untriggered.facts["symptom_of"] == "raises:TypeError@loc-int32"


def _item_sync(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
               recipe="unfused", checked=False):
    """Reads each tensor scale on the host (.item()): a host sync, which a CUDA-graph capture refuses."""
    ks = k_scale.item() if isinstance(k_scale, torch.Tensor) else k_scale
    vs = v_scale.item() if isinstance(v_scale, torch.Tensor) else v_scale
    _reference(k, v, k_cache, v_cache, cache_loc, ks, vs, page_size, recipe=recipe, checked=checked)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA-graph capture")
def test_a_graph_defect_on_the_plain_call_is_keyed_at_plain() -> None:
    """A capture that fails on the plain call too (an experiment, not the test's name) is `@plain`."""
    from conformance.diagnosis.classify import Finding, _graph_on_plain
    device = torch.device("cuda")
    message = f"failed under CUDA-graph capture:\ncase: {_case().to_json()}"
    found = _graph_on_plain(Finding("graph", "graph:sync", "syncs"), message, _impl(_item_sync), device)
    assert found.key == "graph:sync@plain", found.key
    from conformance.impls import fused  # graph-safe, unlike the reference (it indexes by mask: a sync)
    clean = _graph_on_plain(Finding("graph", "graph:sync", "syncs"), message, fused("hardware"), device)
    assert clean.key == "unclassified:no-repro", clean.key  # its capture, run again, passes


class _Rerun:
    """A Diagnoser stand-in that records which graph experiment was run again, and answers `result`."""

    def __init__(self, result):
        self.result, self.calls = result, []

    def captured_fails(self, case):
        self.calls.append(("capture", case, None))
        return self.result

    def float_scale_fails(self, case, factor):
        self.calls.append(("float-scale", case, factor))
        return self.result


def test_a_graph_failure_is_run_again_as_the_same_experiment() -> None:
    """graph:float-scale repeats the float-scale experiment on the Case it captured (named `captured:` by an
    eager call's failure, inline by a replay's) with its factor; a capture failure repeats the capture."""
    from conformance.diagnosis.classify import _graph_again
    captured, eager = _case(), _case(k_scale=Scale("float", 0.7))
    rerun = _Rerun(True)
    message = (f"eager call with scale x0.7 after the capture:\nbyte diff\ncaptured: {captured.to_json()}\n"
               "failure case saved: x.json")
    assert _graph_again("graph:float-scale", message, eager, rerun) is True
    replay = f"replay after an eager call with scale x2.0 (the graph must keep its float):\ncase: {eager.to_json()}"
    _graph_again("graph:float-scale", replay, eager, rerun)
    _graph_again("graph:capture", f"failed under CUDA-graph capture:\ncase: {eager.to_json()}", eager, rerun)
    assert rerun.calls == [("float-scale", captured, 0.7), ("float-scale", eager, 2.0), ("capture", eager, None)]


def test_a_graph_failure_that_does_not_repeat_is_no_defect() -> None:
    """Passing when run again: not reproduced (the finding the report treats as such); the card full during the
    repeat: the test's memory ran out, no defect either way."""
    from conformance.diagnosis.classify import OUT_OF_MEMORY, Finding, not_reproduced
    found = Finding("graph", "graph:capture", "CUDA-graph capture fails")
    assert not_reproduced(found, "m", False).key == "unclassified:no-repro"
    assert not_reproduced(found, "m", None).key == OUT_OF_MEMORY


def _padding_to_slot0_when_captured(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                                    use_triton=True, *, recipe="unfused", checked=False):
    """Right eagerly; under a CUDA-graph capture, padding tokens write slot 0 (graph-safe: torch.where)."""
    from kernel import fused_fp8_set_kv_buffer
    if torch.cuda.is_current_stream_capturing():
        cache_loc = torch.where(cache_loc < 0, torch.zeros_like(cache_loc), cache_loc)
    fused_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe,
                            checked=checked)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA-graph capture")
def test_a_replay_wrong_only_under_a_graph_is_keyed_by_its_trigger() -> None:
    """Eager calls of the Case pass; a captured replay fails, and passes once padding is ablated."""
    from conformance.diagnosis.classify import Finding, _graph_on_plain
    device = torch.device("cuda")
    case = _case(cache_loc=(5, -1, 9), recipe="single")
    impl = _impl(_padding_to_slot0_when_captured, recipe="single")
    assert Diagnoser(impl, device).diagnose(case) == []
    message = f"replay 0 after new contents were copied in:\ncase: {case.to_json()}"
    found = _graph_on_plain(Finding("graph", "graph:stale", "stale"), message, impl, device)
    assert found.key == "graph:stale@padding", found.key


class _FloatScaleFails(Diagnoser):
    """A Diagnoser whose float-scale experiment fails where `fails` says (no GPU needed)."""

    def __init__(self, fails):
        super().__init__(_impl(_reference, recipe="single"), CPU)
        self.fails_on, self.ran = fails, []

    def float_scale_fails(self, case, factor):
        self.ran.append(case)
        return self.fails_on(case)


def test_a_float_scale_failure_the_plain_call_passes_is_keyed_by_its_trigger() -> None:
    """Held corpus, H100 2026-12-07: a kernel that rounds fp16 inputs twice failed the float-scale
    experiment's eager call, and a padding write racing onto slot 0 its replay; both were reported as a
    graph keeping a stale float. The experiment passing on the plain call (the Case's floats kept) makes the
    failure a symptom of what its trigger holds; a graph that keeps a stale float fails the plain call too."""
    fp16 = _case(k_scale=Scale("float", 0.6), v_scale=Scale("float", 0.6), input_dtype="float16")
    only_fp16 = _FloatScaleFails(lambda c: c.input_dtype == "float16")
    trigger = only_fp16.float_scale_trigger(fp16, 2.0)
    assert "input-float16" in trigger and not any(t.startswith("scale-kind") for t in trigger), trigger
    assert all("float" in (c.k_scale.kind, c.v_scale.kind) for c in only_fp16.ran)  # no float: no experiment
    assert _FloatScaleFails(lambda c: True).float_scale_trigger(fp16, 2.0) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA-graph capture")
def test_a_float_scale_replay_wrong_only_under_padding_is_keyed_by_padding() -> None:
    """Eager calls pass; the float-scale experiment's replay writes a padding token to slot 0."""
    from conformance.diagnosis.classify import Finding, _graph_on_plain
    device = torch.device("cuda")
    case = _case(cache_loc=(5, -1, 9), recipe="single", k_scale=Scale("float", 0.3))
    impl = _impl(_padding_to_slot0_when_captured, recipe="single")
    message = f"replay after an eager call with scale x2.0 (the graph must keep its float):\ncase: {case.to_json()}"
    found = _graph_on_plain(Finding("graph", "graph:float-scale", "float"), message, impl, device)
    assert found.key == "graph:float-scale@padding", found.key


def test_a_graph_replay_wrong_only_under_a_trigger_joins_that_triggers_defect() -> None:
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_raises
    host, race, stale = "out-of-range:written@out-of-range", "graph:stale@out-of-range", "graph:stale"
    groups = {k: [("t", Finding(k.split(":")[0], k, k))] for k in (host, race, stale)}
    _merge_raises(groups)
    assert sorted(groups) == [stale, host] and len(groups[host]) == 2, sorted(groups)


def test_a_defect_another_defects_effect_also_explains_is_that_defect() -> None:
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_explained
    both = ["rounding:divide@any", "approximate-division@any"]
    divide = Finding("rounding", "rounding:divide@any", "divide", facts={"explanations": both})
    approx = Finding("approximate-division", "approximate-division@any", "approx",
                     facts={"explanations": ["approximate-division@any"]})
    groups = {"rounding:divide@any": [("a", divide)], "approximate-division@any": [("b", approx)]}
    _merge_explained(groups)
    assert list(groups) == ["approximate-division@any"] and len(groups["approximate-division@any"]) == 2


def test_a_defect_whose_case_holds_another_defects_trigger_and_effect_is_that_defect() -> None:
    """Held-out batch 40: a tile of four tokens whose lanes past T write zeros at slot 0. With its one token
    padding, the Case reads as padding's dummy write to slot 0 (moving the padding back, the zeros land on the
    token's own bytes: a wrong value, not a wrong slot); rows past T explain it too, and T = 1 is not a multiple
    of 4: one defect. Where T is a multiple of 4, the trigger is not held, and the two stay apart."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_explained
    padding, rows = "wrong-slot:slot-0-zeroed@padding", "overrun:rows@tokens-not-multiple:4"
    for tokens, merged in ((1, True), (4, False)):
        case = _case(num_tokens=tokens, cache_loc=(-1,) * tokens)
        zeroed = Finding("wrong-slot", padding, "zeroed", facts={"explanations": [padding, "overrun:rows@padding"],
                                                                 "minimal": case.to_dict()})
        past = Finding("overrun", rows, "rows", facts={"explanations": [rows]})
        groups = {padding: [("a", zeroed)], rows: [("b", past)]}
        _merge_explained(groups)
        assert (list(groups) == [rows]) is merged, (tokens, sorted(groups))


def test_an_effect_whose_bound_on_d_moves_with_h_is_one_defect() -> None:
    """Held-out batch 40: a head loop over groups of 256 // pow2(D) heads that steps the input by the cache's
    head stride. H = 3 fails above D = 64, H = 2 above D = 128: three keys of one effect, each trigger implying
    the broadest one, are one defect under it. A bound the other way (below) or another dimension stays apart."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_narrower
    effect = "wrong-bytes:unexplained"
    keys = [f"{effect}@dim-above:64", f"{effect}@dim-above:128+strided-cache", f"{effect}@dim-above:128+strided-input"]
    groups = {k: [("t", Finding("wrong-bytes", k, k))] for k in keys}
    _merge_narrower(groups)
    assert list(groups) == [keys[0]] and len(groups[keys[0]]) == 3, sorted(groups)
    apart = [f"{effect}@dim-above:64", f"{effect}@dim-below:16+strided-cache", f"{effect}@heads-above:128"]
    groups = {k: [("t", Finding("wrong-bytes", k, k))] for k in apart}
    _merge_narrower(groups)
    assert sorted(groups) == sorted(apart)


def test_an_exhaustive_cases_effect_under_a_format_is_the_size_rules_defect_its_case_holds() -> None:
    """Held-out batch 62: a word's halves swapped where D is a multiple of 8, and in an fnuz sweep's Case, whose
    shape no ablation moves (its trigger names the format): one defect where that Case's D is a multiple of 8,
    two where it is not."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_narrower
    effect = "strides:dims-halves-swapped:8"
    sized, fnuz = f"{effect}@dim-multiple:8", f"{effect}@cache-fnuz"
    node = "conformance/test_fnuz.py::test_fnuz_all_patterns[x]"
    for d, merged in ((16, True), (12, False)):
        sweep = Finding("strides", fnuz, "?", facts={"minimal": _case(head_dim=d, cache_dtype="float8_e4m3fnuz",
                                                                       cache_format="fp8_e4m3fnuz").to_dict()})
        groups = {sized: [("t", Finding("strides", sized, "?"))], fnuz: [(node, sweep)]}
        _merge_narrower(groups)
        assert (sorted(groups) == [sized]) is merged, (d, sorted(groups))


def test_value_rules_under_one_trigger_in_other_cache_formats_are_one_defect() -> None:
    """Held-out batch 42: the fix-up skipped for a None scale (torch's raw cast) keeps NaN's sign, and reads as
    another recipe in e5m2 and fnuz caches: one defect under the trigger they share. A trigger of formats alone
    hosts nothing, and a trigger that adds a dimension other than a format stays apart."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_value_trigger
    host = "encoding:nan-sign@scale-kind:none"
    keys = [host, "rounding:unfused-nan@cache-e5m2+scale-kind:none", "rounding:unfused-nan@cache-fnuz+scale-kind:none"]
    groups = {k: [("t", Finding(k.split(":")[0], k, k))] for k in keys}
    _merge_value_trigger(groups)
    assert list(groups) == [host] and len(groups[host]) == 3, sorted(groups)
    apart = ["encoding:nan-sign@cache-e5m2", "rounding:divide@cache-e5m2+cache-uint8",
             "rounding:unfused-nan@input-float32+scale-kind:none", "encoding:nan-sign@scale-kind:none"]
    groups = {k: [("t", Finding(k.split(":")[0], k, k))] for k in apart}
    _merge_value_trigger(groups)
    assert sorted(groups) == sorted(apart)


def test_a_defect_of_a_narrower_class_joins_the_wider_one() -> None:
    """A reciprocal held in bf16 is within two fp32 ulps of the quotient in one Case and only within one
    e4m3 ulp in another: both say "not correctly rounded", one defect (the wider class)."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_wider
    approx = Finding("approximate-division", "approximate-division@any", "approx")
    ulp = Finding("off-by-one-ulp", "off-by-one-ulp@input-float32", "ulp")
    groups = {"approximate-division@any": [("a", approx)], "off-by-one-ulp@input-float32": [("b", ulp)]}
    _merge_wider(groups)
    assert list(groups) == ["off-by-one-ulp@input-float32"] and len(groups["off-by-one-ulp@input-float32"]) == 2
    flush = Finding("flush-to-zero", "flush-to-zero@values", "flush")
    path = Finding("subnormal-path", "subnormal-path@any", "path")
    groups = {"flush-to-zero@values": [("c", flush)], "subnormal-path@any": [("d", path)]}
    _merge_wider(groups)
    assert list(groups) == ["subnormal-path@any"]  # a few subnormals written ±0 by an encoder's subnormal path
    alone = {"approximate-division@any": [("a", approx)]}
    _merge_wider(alone)
    assert list(alone) == ["approximate-division@any"]  # an approximate division alone keeps its name


def test_a_capability_rows_unreproduced_failure_joins_the_defect_its_dimension_triggers() -> None:
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import PROBE_TEST, Node, _attribute_row_findings
    padding, strided = f"{PROBE_TEST}[impl-padding]", f"{PROBE_TEST}[impl-strided-caches]"
    nodes = {padding: Node(padding, "failed", {"row": "padding"}), strided: Node(strided, "failed",
                                                                               {"row": "strided-caches"})}
    outside = Finding("outside", "outside:padding", "writes padding tokens")
    other = Finding("outside", "outside:slots", "writes other slots")
    groups = {"padding:slot-0@padding": [("t", Finding("padding", "padding:slot-0@padding", "slot 0"))],
              "outside:padding": [(padding, outside)], "outside:slots": [(strided, other)]}
    _attribute_row_findings(groups, nodes)
    assert sorted(groups) == ["outside:slots", "padding:slot-0@padding"], sorted(groups)
    assert outside.facts["symptom_of"] == "padding:slot-0@padding"


def test_a_crash_goes_to_the_one_out_of_place_defect_whose_trigger_its_case_has(tmp_path) -> None:
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _attribute_by_case
    differ = tmp_path / "differ.json"
    differ.write_text(_case(v_cache_layout=Layout((0, 1, 2, 3), (0, 0, 1, 0))).to_json())
    crash = Finding("crash", "crash", "crashes", case_file=str(differ))
    unsaved = Finding("crash", "crash", "crashes")
    hosts = ["strides:other-cache@cache-layouts-differ", "strides:inputs-heads-ignored@strided-input"]
    groups = {h: [] for h in hosts} | {"crash": [("a", crash), ("b", unsaved)]}
    _attribute_by_case(groups, hosts)
    assert crash.key == "strides:other-cache@cache-layouts-differ" and groups["crash"] == [("b", unsaved)]


def test_a_crash_beside_a_per_token_head_write_out_of_place_is_its_symptom() -> None:
    """Scale caches written as if contiguous wrote past one (a held-out Triton kernel deriving their page
    stride from their slot stride), and the worker died: the crash is that defect's, the run's one out-of-place
    writer, though per-token-head keys carry no placement class. Beside a value defect alone it stays apart."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _attribute_crashes
    for host, joins in (("per-token-head:scale-caches-as-contiguous", True), ("per-token-head:values", False)):
        crash = Finding("crash", "crash", "crashes")
        groups = {host: [("h", Finding("per-token-head", host, "?"))], "crash": [("c", crash)]}
        _attribute_crashes(groups)
        assert ("crash" not in groups) == joins, (host, sorted(groups))


def test_an_undiagnosed_failure_joins_the_one_defect_only_where_its_case_triggers_it() -> None:
    """A shared slot left unwritten (no replay can diagnose which token's byte belongs there) is the run's one
    value defect's symptom; beside a run's one raise on float scales, with tensor scales in its Case, it is a
    defect of its own (a held-out pair: float scales raise, shared slots dropped)."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _attribute_to_the_one_defect
    shared = _case(cache_loc=(5, 5, 2), k_scale=Scale("tensor1", 0.5), v_scale=Scale("tensor0d", 0.7))
    for host, joins in (("raises:AttributeError@scale-kind:float", False), ("flush-to-zero@any", True)):
        slot = Finding("wrong-slot", "wrong-slot:shared", "?", facts={"case": shared.to_dict()})
        groups = {host: [("h", Finding(class_of(host), host, "?"))], "wrong-slot:shared": [("s", slot)]}
        _attribute_to_the_one_defect(groups)
        assert ("wrong-slot:shared" not in groups) == joins, (host, sorted(groups))


def test_value_rules_under_one_trigger_are_one_defect() -> None:
    """An fp16 widening without subnormals writes zeros an ulp off and NaN saturated, and bytes no model explains,
    each only for float16 input (a held-out kernel): one defect. Two value defects `@any` stay two."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_value_trigger
    keys = ["off-by-one-ulp@input-float16", "encoding:saturates@input-float16",
            "wrong-bytes:unexplained@input-float16+scale-value", "wrong-slot:tokens-moved@padding"]
    groups = {k: [(str(i), Finding(class_of(k), k, "?"))] for i, k in enumerate(keys)}
    groups["off-by-one-ulp@input-float16"].append(("x", Finding("off-by-one-ulp", "off-by-one-ulp@input-float16", "?")))
    _merge_value_trigger(groups)
    assert sorted(groups) == ["off-by-one-ulp@input-float16", "wrong-slot:tokens-moved@padding"], sorted(groups)
    assert len(groups["off-by-one-ulp@input-float16"]) == 4
    apart = {k: [("a", Finding(class_of(k), k, "?"))] for k in ("flush-to-zero@any", "encoding:nan-sign@any")}
    _merge_value_trigger(apart)
    assert len(apart) == 2, apart


def test_a_defect_merged_from_a_wider_trigger_keeps_its_own_triggers_title() -> None:
    """The exhaustive tests' Cases keep their shape, so they key a head-tile defect `@plain`; merged into
    `@heads-above:4`, their (more numerous) findings must not title it "on the plain call"."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_narrower, _title
    key, plain = "wrong-bytes:unexplained@heads-above:4", "wrong-bytes:unexplained@plain"
    sized = Finding("wrong-bytes", key, "writes wrong bytes, only when H is above 4")
    exhaustive = [(f"test_exhaustive.py::test_all_patterns[{i}]", Finding("wrong-bytes", plain, "writes wrong "
                   "bytes, on the plain call")) for i in range(3)]
    groups = {key: [("test_bit_exact.py::test_bit_exact", sized)], plain: exhaustive}
    _merge_narrower(groups)
    assert list(groups) == [key] and len(groups[key]) == 4, groups
    assert _title(key, [f for _, f in groups[key]]) == "writes wrong bytes, only when H is above 4"


def test_the_verdict_says_why_rows_did_not_run() -> None:
    from conformance.diagnosis.report import verdict
    ran = {"status": "conforms"}
    unselected = {"status": "not run", "detail": "family graphs not selected"}
    cut = {"status": "not run", "detail": "the run stopped at its budget first"}
    assert verdict([ran, unselected], 0, 5).endswith("1 of 2 rows did not run (families not selected)")
    assert verdict([ran, cut], 1, 5).endswith("1 of 2 rows did not run (raise --budget)")
    assert "raise --budget, or select their families" in verdict([unselected, cut], 0, 5)
    assert verdict([ran], 0, 5) == "conforms" and verdict([ran], 0, 0).startswith("incomplete")
    # a test the GPU's memory stopped (another process held it) is no defect, and no pass either
    assert verdict([ran], 0, 5, starved=1).startswith("incomplete: 0 defects in what ran, and tests the GPU's")


def test_what_a_stray_write_corrupts_goes_to_the_one_defect_that_writes_out_of_place() -> None:
    """A run with a defect that misreads its inputs (reads only) and one that writes past a cache: a crash
    with no Case, an input changed, and bytes no model explains on the plain call after the crash are the
    writer's symptoms."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _attribute_crashes
    reader, writer = "strides:inputs-heads-ignored@strided-input", "strides:other-cache@cache-layouts-differ"
    symptoms = {k: Finding(k.split(":")[0].split("@")[0], k, k) for k in
                ("crash", "input-modified:v_scale", "wrong-slot:unexplained@plain")}
    groups = {reader: [], writer: []} | {k: [("t", f)] for k, f in symptoms.items()}
    _attribute_crashes(groups)
    assert sorted(groups) == sorted([reader, writer]) and len(groups[writer]) == 3, groups
    assert all(f.facts["symptom_of"] == writer for f in symptoms.values())


def _clamped_before_dividing(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                             use_triton=True, *, recipe="divide", checked=False):
    """Clamps each input to ±448 before dividing by its scale (the quotient, not the input, is what the
    recipe clamps): wrong only where |x| > 448 and the scale is above 1."""
    _reference(k.float().clamp(-448, 448), v.float().clamp(-448, 448), k_cache, v_cache, cache_loc, k_scale,
               v_scale, page_size, recipe=recipe, checked=checked)


def _toward_zero_impl(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                      use_triton=True, *, recipe="divide", checked=False):
    """Rounds every quotient toward zero (RNE's byte minus one in magnitude where that overshot)."""
    from kernel.plan import make_plan
    from kernel.reference import _magnitudes, encode_e4m3, scaled
    plan = make_plan(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe)
    for x, cache, scale in ((k, k_cache, plan.k_scale), (v, v_cache, plan.v_scale)):
        y = scaled(x, scale, plan.recipe)
        e = encode_e4m3(y, plan.recipe)
        table = _magnitudes(y.device)
        mag = (e & 0x7F).long()
        over = (mag < 0x7F) & (mag > 0) & (table[mag.clamp(max=0x7E)] > y.abs().double())
        e = torch.where(over, e - 1, e)
        slots = cache_loc.long()
        ok = (slots >= 0) & (slots < cache.shape[0] * page_size)
        cache.view(torch.uint8).view(-1, *cache.shape[2:])[slots[ok]] = e[ok]


def _through_fp16_impl(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                       use_triton=True, *, recipe="divide", checked=False):
    """Rounds every fp32 quotient to fp16 before the e4m3 cast (an encoder that converts through `__half`)."""
    from kernel.plan import make_plan
    from kernel.reference import encode_e4m3, scaled
    plan = make_plan(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe)
    for x, cache, scale in ((k, k_cache, plan.k_scale), (v, v_cache, plan.v_scale)):
        y = scaled(x, scale, plan.recipe)
        e = encode_e4m3(torch.where(y.isnan(), y, y.half().float()), plan.recipe)
        slots = cache_loc.long()
        ok = (slots >= 0) & (slots < cache.shape[0] * page_size)
        cache.view(torch.uint8).view(-1, *cache.shape[2:])[slots[ok]] = e[ok]


def test_a_quotient_rounded_through_fp16_before_the_cast_is_named() -> None:
    """fp32 inputs at a scale of 0.3: quotients within half an fp16 ulp of an e4m3 midpoint land on it and go to
    even. Before the model, what no recipe gives within one e4m3 ulp was `off-by-one-ulp` (a held-out e5m2
    kernel's report)."""
    ties = tuple(Override("k", i, int(torch.tensor((17 + 2 * i) / 16 * 0.3 * (1 + 2**-12), dtype=torch.float32)
                                      .view(torch.int32)), "near-midpoint") for i in range(8))
    case = _case(recipe="divide", input_dtype="float32", k_scale=Scale("tensor1", 0.3), overrides=ties)
    found = {f.key for f in Diagnoser(_impl(_through_fp16_impl, "divide"), CPU).diagnose(case)}
    assert {k.split("@")[0] for k in found} == {"double-rounding:float16"}, found


def _by_chance_cases() -> list[Case]:
    # As test_ties draws them: every element a tie. K's others are 2**-10 after scaling (0 under either
    # rounding), V's are 0.0003 at scale 1: nothing but the 465 tells the recipe's rounding from rounding
    # toward zero, which gives the clamped quotient's byte there.
    bits = lambda x: int(torch.tensor(x, dtype=torch.float32).view(torch.int32))  # noqa: E731
    ties = tuple(Override("k", i, bits(465.0 if i == 5 else 7.5 * 2**-10), "e4m3-tie") for i in range(8)) + \
        tuple(Override("v", i, bits(0.0003), "e4m3-tie") for i in range(8))
    tie = Case(num_tokens=1, num_heads=1, head_dim=8, page_size=16, num_pages=1, cache_loc=(0,),
               input_dtype="float32", k_scale=Scale("tensor1", 7.5), v_scale=Scale("tensor1", 1.0),
               overrides=ties, recipe="divide")
    # A scale of 3.4e38: every byte of V is ±0, as the scale rounded to bf16 (inf) would also give
    # (unfused-tensor0d), whatever the values: only an ordinary scale tells them apart.
    extreme = Case(num_tokens=1, num_heads=1, head_dim=64, page_size=16, num_pages=1, cache_loc=(1,),
                   k_scale=Scale("tensor1", 1.0), v_scale=Scale("tensor1", 3.4028234663852886e38), recipe="divide")
    return [tie, extreme]


@pytest.mark.parametrize("case", _by_chance_cases(), ids=["a-tie-past-448", "an-extreme-scale"])
def test_a_value_model_that_fits_a_minimal_case_by_chance_is_refuted(case: Case) -> None:
    """The clamp-before-dividing kernel's minimal Cases fit a value model by chance (rounding toward zero,
    unfused-tensor0d); the same calls with re-drawn values, and with ordinary scales, refute it, and leave its own
    model (`input-clamped`; before it existed, what nothing explains was said so)."""
    found = {f.key for f in Diagnoser(_impl(_clamped_before_dividing, "divide"), CPU).diagnose(case)}
    assert found == {"input-clamped@any"}, found


def test_a_value_model_that_re_drawn_values_confirm_is_kept() -> None:
    case = _case(recipe="divide", input_dtype="float32")
    found = {f.key for f in Diagnoser(_impl(_toward_zero_impl, "divide"), CPU).diagnose(case)}
    assert found == {"rounds-toward-zero@any"}, found


def _denormals_are_zero(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                        use_triton=True, *, recipe="divide", checked=False):
    """Reads inputs below fp32's smallest normal as zeros of their sign (a denormals-are-zero float mode)."""
    daz = [torch.where(x.float().abs() < 2.0**-126, torch.copysign(torch.zeros_like(x), x), x) for x in (k, v)]
    _reference(*daz, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


@pytest.mark.parametrize("scale", [1e-38, 2.0**-120], ids=["1e-38", "2^-120"])
def test_subnormal_inputs_read_as_zero_are_named_so(scale: float) -> None:
    """At a tiny scale the seeded inputs are bf16 subnormals; reading them as zero writes what ignoring the
    scale would also write there (x / 1 is ±0 in e4m3): denormals-are-zero is tried first, and the telling
    scales, which show no symptom, cannot move it."""
    case = _case(recipe="divide", k_scale=Scale("tensor1", scale), v_scale=Scale("tensor1", scale))
    found = {f.key for f in Diagnoser(_impl(_denormals_are_zero, "divide"), CPU).diagnose(case)}
    assert found == {"flush-to-zero:inputs@any"}, found


def _inf_as_nan(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                *, recipe="divide", checked=False):
    """Writes ±inf as NaN (0x7F); finite values past the range saturate as the recipe says."""
    k, v = (x.masked_fill(x.isinf(), float("nan")) for x in (k, v))
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def _nan_past_464(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                  *, recipe="divide", checked=False):
    """The recipe's bytes but NaN (0x7F of the sign) wherever the quotient is past 464, finite or not."""
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    plan_scales = [1.0 if s is None else float(s) if not isinstance(s, torch.Tensor) else float(s.reshape(-1)[0])
                   for s in (k_scale, v_scale)]
    for x, cache, s in ((k, k_cache, plan_scales[0]), (v, v_cache, plan_scales[1])):
        big = (x.float() / s).abs() > 464
        slots = cache_loc.long()
        b = cache.view(torch.uint8).view(-1, *cache.shape[2:])
        b[slots] = torch.where(big, b[slots] | 0x7F, b[slots])


@pytest.mark.parametrize("fn, key", [(_inf_as_nan, "encoding:inf-nan@any"),
                                     (_nan_past_464, "encoding:nan-past-448@any")], ids=["inf-only", "past-464"])
def test_nan_for_infinity_alone_is_told_from_nan_past_the_range(fn, key) -> None:
    """+inf and a finite 1000 / 0.3 in one call: a kernel that writes NaN for the infinity alone is named so;
    one that writes NaN past 464, finite or not, is named by the range."""
    bits = lambda x: int(torch.tensor(x, dtype=torch.bfloat16).view(torch.int16)) & 0xFFFF  # noqa: E731
    case = _case(recipe="divide", k_scale=Scale("tensor1", 0.3), v_scale=Scale("tensor1", 0.7),
                 overrides=(Override("k", 0, bits(float("inf")), "+inf"), Override("k", 1, bits(1000.0), "past")))
    found = {f.key for f in Diagnoser(_impl(fn, "divide"), CPU).diagnose(case)}
    assert found == {key}, found


def _v_one_token_ahead(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                       use_triton=True, *, recipe="divide", checked=False):
    """Token t's V row read from token t + 1 (the last from token 0): whole V rows at the wrong slots."""
    _reference(k, v.roll(-1, dims=0), k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe,
               checked=checked)


def test_rows_moved_under_an_extreme_scale_are_not_a_sign_rule() -> None:
    """With a v_scale of 1.4e-45 every V byte is ±max or ±0, so V's rows one token off differ in their signs of
    zero alone and fit `zero-sign:minus`; the same call at ordinary scales shows the rows moved."""
    case = Case(num_tokens=2, num_heads=1, head_dim=64, page_size=16, num_pages=2, cache_loc=(0, 16),
                k_scale=Scale("tensor1", 1.0), v_scale=Scale("tensor1", 1.401298464324817e-45), recipe="divide")
    found = {f.key.split("@")[0] for f in Diagnoser(_impl(_v_one_token_ahead, "divide"), CPU).diagnose(case)}
    assert found == {"wrong-slot:tokens-moved"}, found


def _vllm_e4m3_always(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """vLLM's convention, writing e4m3 bytes whatever kv_cache_dtype says (the format argument ignored)."""
    naive_fp8_set_kv_buffer(key, value, key_cache.view(torch.uint8), value_cache.view(torch.uint8), slot_mapping,
                            k_scale, v_scale, key_cache.shape[1], recipe="divide")


@pytest.mark.parametrize("specials", [False, True], ids=["values", "nan-inf"])
@pytest.mark.parametrize("cache_dtype", ["float8_e5m2", "uint8"])
def test_e4m3_bytes_in_an_e5m2_cache_are_one_format_defect(cache_dtype: str, specials: bool) -> None:
    """The vllm convention says kv_cache_dtype="fp8_e5m2" on an e5m2 call; a kernel that ignores it is one
    defect, its effect read against e5m2 bytes (no e4m3 model fits by chance) and its trigger the format. With
    NaN and inf among the inputs too: e5m2's NaN bytes lie past its finite grid (the tie models indexed past it,
    and a held-out kernel's every-pattern failure read `wrong-bytes:values`)."""
    impl = Implementation("e4m3-always", _vllm_e4m3_always, {}, convention=VLLM, recipe="divide")
    over = tuple(Override("k", i, bits, "special") for i, bits in enumerate((0x7FC0, 0xFF80, 0x7F80))) if specials \
        else ()
    case = _case(k_scale=Scale("tensor1", 0.3), v_scale=Scale("tensor0d", 0.7), cache_format="fp8_e5m2",
                 cache_dtype=cache_dtype, recipe="divide", overrides=over)
    assert [f.key for f in Diagnoser(impl, CPU).diagnose(case)] == ["format:e4m3-bytes@cache-e5m2"]
    assert Diagnoser(impl, CPU).diagnose(case.replace(cache_format="fp8_e4m3", cache_dtype="uint8")) == []


def _vllm_e5m2_via_e4m3_view(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """Right e5m2 values, stored into uint8 caches through a view typed e4m3 (`cache.view(fp8_dtype)[i] = q`, a
    value conversion): held-out batch 40's vLLM write."""
    from examples.vllm_divide import reshape_and_cache_flash
    if kv_cache_dtype != "fp8_e5m2" or key_cache.dtype != torch.uint8:
        reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)
        return
    for cache, x, s in ((key_cache, key, k_scale), (value_cache, value, v_scale)):
        q = (x.float() / s.float()).clamp(-57344.0, 57344.0).to(torch.float8_e5m2)
        rows = cache.view(torch.float8_e4m3fn).view(-1, *cache.shape[2:])
        valid = (slot_mapping >= 0) & (slot_mapping < rows.shape[0])
        rows[slot_mapping[valid].long()] = q[valid].float().to(torch.float8_e4m3fn)


def test_e5m2_values_stored_as_e4m3_are_the_e4m3_format_defect() -> None:
    impl = Implementation("e5m2-via-e4m3", _vllm_e5m2_via_e4m3_view, {}, convention=VLLM, recipe="divide")
    case = _case(k_scale=Scale("tensor1", 0.3), v_scale=Scale("tensor0d", 0.7), cache_format="fp8_e5m2",
                 cache_dtype="uint8", recipe="divide")
    assert [f.key for f in Diagnoser(impl, CPU).diagnose(case)] == ["format:e4m3-bytes@cache-e5m2+cache-uint8"]


def _rows_by_repeat(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                    recipe="unfused", checked=False):
    """(token, head) rows r = t x H + h written at slot cache_loc[r mod T]: `slots.repeat(H)` where
    `repeat_interleave` belongs (held-out batch 42's vLLM pair)."""
    t, h = k.shape[0], k_cache.shape[-2]
    scratch = [torch.zeros((t, 1, *c.shape[-2:]), dtype=c.dtype) for c in (k_cache, v_cache)]
    _reference(k, v, *scratch, torch.arange(t), k_scale, v_scale, 1, recipe=recipe, checked=checked)
    rows = [x[:, 0].reshape(t * h, -1).view(torch.uint8) for x in scratch]
    slots = cache_loc.long().repeat(h)
    for cache, row in zip((k_cache, v_cache), rows):
        flat = cache.view(torch.uint8).view(-1, h, cache.shape[-1])
        flat[slots, torch.arange(h).repeat(t)] = row


def test_slots_repeated_for_interleaved_rows_are_named() -> None:
    keys = [f.key for f in Diagnoser(_impl(_rows_by_repeat), CPU).diagnose(_case(num_tokens=3, num_heads=2,
                                                                                 cache_loc=(5, 0, 9)))]
    assert keys == ["wrong-slot:rows-repeated@many-tokens"]


def _fp32_via_bf16(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                   recipe="unfused", checked=False):
    """float32 inputs narrowed to bf16 before the recipe (a kernel that loads every input as bf16)."""
    if k.dtype == torch.float32:
        k, v = k.to(torch.bfloat16), v.to(torch.bfloat16)
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_float32_input_rounded_to_bf16_first_is_named_so() -> None:
    case = _case(input_dtype="float32", recipe="single", head_dim=16, num_tokens=8, cache_loc=tuple(range(8)))
    keys = [f.key for f in Diagnoser(_impl(_fp32_via_bf16, "single"), CPU).diagnose(case)]
    assert keys == ["input-rounded:bfloat16@input-float32"]


def _torch_single(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, encode) -> None:
    """recipe single (x * fp32(1/s)) onto e4m3 by `encode` (fp32 -> float64 grid values), saturated at ±448 before
    the cast (torch 2.11's CPU cast gives NaN past 464, 2.13's saturates), contiguous caches."""
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        s = torch.tensor(1.0 if scale is None else float(scale), dtype=torch.float32)
        y = x.float().reshape(x.shape[0], -1) * (1.0 / s)
        q = encode(y.double()).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
        rows = cache.view(torch.uint8).reshape(-1, q.shape[1])
        for t, slot in enumerate(cache_loc.tolist()):
            if 0 <= slot < rows.shape[0]:
                rows[slot] = q[t]


def _half_away(a: torch.Tensor) -> torch.Tensor:
    """|y| onto the e4m3 grid, ties away from zero (floor(a / q + 0.5) * q), saturating at 448."""
    m = a.abs()
    binade = torch.floor(torch.log2(m.clamp(min=2.0**-30))).clamp(min=-6)
    q = 2.0 ** (binade - 3)
    return torch.copysign(torch.floor(m / q + 0.5).mul(q).clamp(max=448.0), a)


def _half_odd(a: torch.Tensor) -> torch.Tensor:
    """|y| onto the e4m3 grid to nearest, an exact tie to the odd neighbour (a rounding step's arms swapped)."""
    m = a.abs()
    binade = torch.floor(torch.log2(m.clamp(min=2.0**-30))).clamp(min=-6)
    q = 2.0 ** (binade - 3)
    steps = m / q
    low = torch.floor(steps)
    n = torch.where(steps - low == 0.5, torch.where(low % 2 == 1, low, low + 1), torch.floor(steps + 0.5))
    return torch.copysign(n.mul(q).clamp(max=448.0), a)


def _ties_odd_write(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                    *, recipe="single", checked=False):
    _torch_single(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, _half_odd)


def _ties_away_write(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                     *, recipe="single", checked=False):
    _torch_single(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, _half_away)


def _saturates_240_write(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                         use_triton=True, *, recipe="single", checked=False):
    _torch_single(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, lambda y: y.clamp(-240.0, 240.0).float())


@pytest.mark.parametrize("fn, key", [(_ties_away_write, "rounds-ties-away@any"),
                                     (_ties_odd_write, "rounds-ties-to-odd@any"),
                                     (_saturates_240_write, "saturates-low:240@any")])
def test_a_rounding_or_overflow_rule_of_its_own_is_named(fn, key) -> None:
    """Ties rounded away from zero (a software encoder's floor(a / q + 0.5)), and a clamp at e4m3fnuz's 240
    in an e4m3 write: each its own value model, not an approximate division or bytes nothing explains."""
    over = tuple(Override("k", i, bits, "edge") for i, bits in enumerate((0x3F88, 0x3A80, 0x43C0, 0xC3A0)))
    case = _case(recipe="single", num_tokens=4, cache_loc=(0, 1, 2, 5), head_dim=8, overrides=over,
                 k_scale=Scale("tensor1", 1.0), v_scale=Scale("tensor1", 0.03125))
    assert [f.key for f in Diagnoser(_impl(fn, "single"), CPU).diagnose(case)] == [key]


def _sign_negated_in_uint8(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                           use_triton=True, *, recipe="unfused", checked=False):
    """Right bytes, but a uint8 cache's negative ones written as 256 minus their magnitude (the int8 KV path's
    sign by negation, reused for the fp8 bits)."""
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    if k_cache.dtype != torch.uint8:
        return
    for cache in (k_cache, v_cache):
        rows = cache.view(-1, *cache.shape[-2:])
        for slot in cache_loc.tolist():
            if 0 <= slot < rows.shape[0]:
                b = rows[slot].to(torch.int16)
                rows[slot] = torch.where(b >= 0x80, (256 - (b & 0x7F)) % 256, b).to(torch.uint8)


def test_a_sign_applied_by_negation_in_a_uint8_cache_is_named() -> None:
    """-448 as 0x82 and -0 as 0x00 (two's complement of the magnitude byte), only in uint8 caches: one storage
    rule with its trigger (held-out batch forty-three read `wrong-bytes:unexplained@cache-uint8`)."""
    over = tuple(Override("k", i, bits, "edge") for i, bits in enumerate((0xC3E0, 0x8000, 0xBF80, 0x3F80)))
    case = _case(num_tokens=4, cache_loc=(0, 1, 2, 5), overrides=over, cache_dtype="uint8")
    assert [f.key for f in Diagnoser(_impl(_sign_negated_in_uint8), CPU).diagnose(case)] == \
        ["storage:sign-negated@cache-uint8"]


def _toward_zero(a: torch.Tensor) -> torch.Tensor:
    """|y| onto the e4m3 grid toward zero (trunc(a / q) * q), saturating at 448."""
    m = a.abs()
    binade = torch.floor(torch.log2(m.clamp(min=2.0**-30))).clamp(min=-6)
    q = 2.0 ** (binade - 3)
    return torch.copysign(torch.trunc(m / q).mul(q).clamp(max=448.0), a).float()


def _transposed_reshaped(x: torch.Tensor) -> torch.Tensor:
    """A [T, H, D] input's [H, T, D] transpose reshaped to [T, H, D] (where a transpose back was meant)."""
    return x.transpose(0, 1).contiguous().reshape(x.shape)


def _rows_reshaped(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                   recipe="single", checked=False):
    _torch_single(_transposed_reshaped(k), _transposed_reshaped(v), k_cache, v_cache, cache_loc, k_scale, v_scale,
                  lambda y: y.float())


def _rows_reshaped_toward_zero(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                               use_triton=True, *, recipe="single", checked=False):
    _torch_single(_transposed_reshaped(k), _transposed_reshaped(v), k_cache, v_cache, cache_loc, k_scale, v_scale,
                  _toward_zero)


def _toward_zero_write(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                       *, recipe="single", checked=False):
    _torch_single(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, _toward_zero)


def test_rows_permuted_across_tokens_are_named_and_seen_behind_a_value_defect_of_every_call() -> None:
    """A head-major result reshaped where a transpose was meant puts (token, head) rows under other tokens: one
    placement effect. Behind rounding toward zero, which every call shows and so every minimal Case keeps, the
    rows permuted are lost with the dimensions the ablations move back; the bytes the rounding rule leaves
    unexplained are minimized on their own and name the second cause (held-out batch forty-three's pair)."""
    case = _case(recipe="single", num_tokens=4, cache_loc=(0, 1, 2, 5), head_dim=8)
    keys = {fn: {f.key.split("@")[0] for f in Diagnoser(_impl(fn, "single"), CPU).diagnose(case)}
            for fn in (_rows_reshaped, _toward_zero_write, _rows_reshaped_toward_zero)}
    assert keys[_rows_reshaped] == {"strides:rows-permuted"}, keys
    assert keys[_toward_zero_write] == {"rounds-toward-zero"}, keys
    assert keys[_rows_reshaped_toward_zero] == {"strides:rows-permuted", "rounds-toward-zero"}, keys
    # T = 5, H = 4 also moves some rows within their token (row 6 holds row 5). Both causes are found; the
    # zero-sign symptom's minimal Case shows both at once and reads as unexplained, which the Case alone does
    # not attribute (the report's merges do)
    case = _case(recipe="single", num_tokens=5, num_heads=4, cache_loc=(0, 1, 2, 5, 9), head_dim=8)
    keys = {fn: {f.key.split("@")[0] for f in Diagnoser(_impl(fn, "single"), CPU).diagnose(case)}
            for fn in (_rows_reshaped, _rows_reshaped_toward_zero)}
    assert keys[_rows_reshaped] == {"strides:rows-permuted"}, keys
    assert {"strides:rows-permuted", "rounds-toward-zero"} <= keys[_rows_reshaped_toward_zero], keys


def _bf16_read_as_zero(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                       *, recipe="unfused", checked=False):
    """bf16 inputs read as +0 (their bits shifted out of a 16-bit integer before widening); fp16 and fp32 right."""
    if k.dtype == torch.bfloat16:
        k, v = torch.zeros_like(k), torch.zeros_like(v)
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_every_input_read_as_zero_is_named() -> None:
    """The bytes of +0 inputs for every value (0x00, NaN where 1/s is inf): one input misread, not bytes nothing
    explains (held-out batch forty-three's pair read `wrong-bytes:unexplained@plain`)."""
    over = tuple(Override("k", i, bits, "edge") for i, bits in enumerate((0xC3E0, 0x8000, 0x7FC0, 0x3F80)))
    case = _case(num_tokens=4, cache_loc=(0, 1, 2, 5), overrides=over)
    assert [f.key for f in Diagnoser(_impl(_bf16_read_as_zero), CPU).diagnose(case)] == ["input-misread:zeros@any"]


def test_one_effect_whose_cases_each_hold_the_others_trigger_is_one_defect_under_both() -> None:
    """Rows permuted across tokens need T > 1 and H > 1: a Case of two tokens and two heads whose ablation to one
    head made it vanish reads `@heads-above:1`, another whose ablation to one token did reads `@many-tokens`.
    Each Case has the other's trigger: one defect, under both (batch forty-three's reshape). Where one Case
    lacks the other's trigger, two stay."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_joint_triggers
    both = _case(num_tokens=2, num_heads=2, cache_loc=(1, 5)).to_dict()
    one_head = _case(num_tokens=2, num_heads=1, cache_loc=(1, 5)).to_dict()
    heads, tokens = "strides:rows-permuted@heads-above:1", "strides:rows-permuted@many-tokens"
    for other, merged in ((both, True), (one_head, False)):
        groups = {heads: [("a", Finding("strides", heads, "?", facts={"minimal": both}))],
                  tokens: [("b", Finding("strides", tokens, "?", facts={"minimal": other}))]}
        _merge_joint_triggers(groups)
        assert (sorted(groups) == ["strides:rows-permuted@heads-above:1+many-tokens"]) == merged, groups


def test_an_unexplained_diff_whose_trigger_implies_a_hosts_goes_under_that_host() -> None:
    """A ties Case of two tokens and two heads shows a pair's two defects at once (rows permuted, subnormals
    rounded twice) and reads as nothing explained, T = H: that holds more than one token, the rows' trigger
    (held-out batch forty-three's pair had three keys for two causes)."""
    from conformance.diagnosis.report import _attribute_unexplained
    mixed = "wrong-bytes:unexplained@scale-value+special-values+tokens-equal-heads"
    groups = _groups("off-by-one-ulp@any", "strides:rows-permuted@many-tokens", mixed)
    _attribute_unexplained(groups)
    assert sorted(groups) == ["off-by-one-ulp@any", "strides:rows-permuted@many-tokens"], groups
    assert [f.facts.get("symptom_of") for _, f in groups["strides:rows-permuted@many-tokens"]][-1] == \
        "strides:rows-permuted@many-tokens"


def test_wrong_normal_values_are_not_a_subnormal_defects_symptom() -> None:
    """Held-out batch 61's pair: an e5m2 bias constant wrong (every e5m2 byte) beside a flush bound one binade
    high. Its exhaustive e5m2 Cases show both at once and read as nothing explained; a diff that counts wrong
    bytes of normal values stays a defect of its own beside the run's one subnormal defect, and one of
    subnormal bytes alone goes under it."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _attribute_unexplained
    host, e5m2 = "subnormal-path@any", "wrong-bytes:unexplained@cache-e5m2"
    for kinds, apart in ((["normal", "subnormal"], True), (["subnormal", "±0"], False)):
        groups = {host: [("a", Finding("subnormal-path", host, "?"))],
                  e5m2: [("b", Finding("wrong-bytes", e5m2, "?", facts={"value_kinds": kinds}))]}
        _attribute_unexplained(groups)
        assert (e5m2 in groups) == apart, (kinds, sorted(groups))


def _vllm_clamped_at_448(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """vLLM's convention, every quotient clamped to e4m3's ±448, e5m2 writes too (an e4m3-era FP8_MAX)."""
    fmt = torch.float8_e5m2 if kv_cache_dtype == "fp8_e5m2" else torch.float8_e4m3fn
    for x, cache, s in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        q = (x.float() / s.float()).clamp(-448.0, 448.0).to(fmt).view(torch.uint8)
        rows = cache.view(torch.uint8).view(-1, *cache.shape[2:])
        kept = (slot_mapping >= 0) & (slot_mapping < rows.shape[0])
        rows[slot_mapping[kept].long()] = q[kept]


def test_e4m3s_bound_in_an_e5m2_write_is_a_low_saturation() -> None:
    """e5m2 values past ±448 written as ±448: a clamp at another FP8 format's maximum, however far below
    e5m2's own (held-out batch twenty-one read `wrong-bytes:unexplained`); e4m3 calls are right."""
    impl = Implementation("clamped-448", _vllm_clamped_at_448, {}, convention=VLLM, recipe="divide")
    case = _case(k_scale=Scale("tensor1", 0.3), v_scale=Scale("tensor1", 0.001), cache_format="fp8_e5m2",
                 cache_dtype="float8_e5m2", recipe="divide")
    assert [f.key for f in Diagnoser(impl, CPU).diagnose(case)] == ["saturates-low:448@cache-e5m2"]


def test_slots_read_beside_a_swapped_scale_keep_the_scales_equal() -> None:
    """One token past the cache, clamped to its last slot, with k_scale 1.0 and v_scale 0.3, through a kernel
    that also writes V with K's scale: the minimal variant keeps the scales equal (moving one to 1.0 had
    undone `scales-differ`), so the slots are read alone (an H100 run read `wrong-slot:unexplained`)."""
    from conformance.conventions import get_convention
    from conformance.impls import from_spec
    impl = from_spec("examples/defects/torch_vllm_pair_oob_clamped_v_with_k_scale.py:reshape_and_cache_flash", {},
                     get_convention("vllm"))
    case = Case(num_tokens=1, num_heads=1, head_dim=64, page_size=16, num_pages=2, cache_loc=(32,),
                k_scale=Scale("tensor1", 1.0), v_scale=Scale("tensor0d", 0.3), recipe="divide")
    assert [f.key for f in Diagnoser(impl, CPU).diagnose(case)] == ["out-of-range:written@out-of-range"]


def _stray_second_store(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                        use_triton=True, *, recipe="divide", checked=False):
    """Each token at its slot, and again page_size slots on where that is in the cache."""
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    for cache in (k_cache, v_cache):
        rows = cache.view(torch.uint8).view(-1, *cache.shape[-2:])
        for slot in cache_loc.tolist():
            if 0 <= slot and slot + page_size < rows.shape[0]:
                rows[slot + page_size] = rows[slot]


def test_tokens_also_written_at_another_slot_say_so() -> None:
    """A stray second store leaves each token right at its own slot: the moved tokens' detail says they are
    copies (the twelfth session's final check read "whole tokens at wrong slots" alone)."""
    case = _case(num_tokens=2, cache_loc=(1, 2), num_pages=2)
    found = Diagnoser(_impl(_stray_second_store), CPU).diagnose(case)
    assert [f.key.split("@")[0] for f in found] == ["wrong-slot:tokens-moved"], found
    assert "also written at its own slot" in found[0].facts["detail"], found[0].facts


@pytest.mark.parametrize("model", ["_ties_toward_zero", "_sticky_lost"])
def test_the_tie_models_take_e5m2_nan_bytes(model: str) -> None:
    """e5m2's NaN bytes (0x7D-0x7F) lie past its finite grid: the tie models leave them alone instead of indexing
    past the grid (an IndexError a held-out kernel's every-pattern e5m2 failure met, read `wrong-bytes:values`)."""
    from types import SimpleNamespace

    from conformance.diagnosis import effects
    x = torch.tensor([[[float("nan"), 1.0, 1.0625, -float("nan")]]], dtype=torch.bfloat16)
    q = torch.tensor([[[0x7F, 0x3C, 0x3C, 0xFF]]], dtype=torch.uint8)
    rows = SimpleNamespace(x=x, scale=Scale("tensor1", 1.0), case=SimpleNamespace(cache_format="fp8_e5m2"),
                           q=lambda held: q.clone())
    out = getattr(effects, model)(rows, "divide")
    assert out[0, 0, 0] == 0x7F and out[0, 0, 3] == 0xFF, out


def test_defects_right_in_a_fresh_process_are_one_defect_of_the_history(tmp_path) -> None:
    """A kernel that memoizes 1/s by the scale tensor's address fails wherever an earlier call left a stale
    value: its defects, each a chance fit, are right when replayed as a fresh process's first call. Those, and
    the failures no Case was kept for, are one defect; a defect that fails fresh too stays itself."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import HISTORY, _merge_history
    files = {name: tmp_path / f"{name}.json" for name in ("stale", "also-stale", "real")}
    for path in files.values():
        path.write_text("{}")
    groups = {
        "scale:swapped@scales-differ": [("a", Finding("scale", "scale:swapped@scales-differ", "swapped",
                                                      case_file=str(files["stale"])))],
        "scale:ignored@page-size": [("b", Finding("scale", "scale:ignored@page-size", "ignored",
                                                  case_file=str(files["also-stale"])))],
        "padding:slot-0@padding": [("c", Finding("padding", "padding:slot-0@padding", "slot 0",
                                                 case_file=str(files["real"])))],
        "scale:inverted": [("d", Finding("scale", "scale:inverted", "inverted"))],
        "validation:accepted": [("e", Finding("validation", "validation:accepted", "accepts"))],
        # a capability probe whose Case passed on replay (held-out batch 24's memoized reciprocal)
        "unclassified:no-repro": [("f", Finding("unclassified", "unclassified:no-repro", "does not reproduce"))],
        # a capability row read by its text alone (held-out batch 55's stale cache_loc: stray and missing slots)
        "outside:slots": [("g", Finding("outside", "outside:slots", "changes other slots"))],
        "wrong-slot:unwritten": [("g", Finding("wrong-slot", "wrong-slot:unwritten", "leaves a slot unwritten"))],
    }
    asked: list[str] = []

    def fresh(paths: list[str]) -> dict[str, bool | None]:
        asked.extend(paths)
        return {p: not p.endswith("real.json") for p in paths}

    _merge_history(groups, fresh)
    assert sorted(groups) == sorted([HISTORY, "padding:slot-0@padding", "validation:accepted"])
    assert len(groups[HISTORY]) == 6 and sorted(asked) == sorted(map(str, files.values()))
    deterministic = {"padding:slot-0@padding": [("c", Finding("padding", "padding:slot-0@padding", "slot 0",
                                                              case_file=str(files["real"])))]}
    _merge_history(deterministic, fresh)
    assert list(deterministic) == ["padding:slot-0@padding"]


def test_untriggered_graph_and_combined_failures_go_to_the_defects_their_case_triggers() -> None:
    """A stale graph replay no re-capture reproduced (a GPU race between a stray write and a real one), on a
    Case with out-of-range slots, is the run's one out-of-place defect that they trigger; what no model
    explains on a minimal Case holding two defects' triggers is their effects at once."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _attribute_combined, _attribute_graph
    oob = _case(cache_loc=(5, 0, 40))
    graph = Finding("graph", "graph:stale", "stale", facts={"case": oob.to_dict()})
    written = Finding("out-of-range", "out-of-range:written@out-of-range", "written")
    groups = {"graph:stale": [("g", graph)], "out-of-range:written@out-of-range": [("o", written)]}
    _attribute_graph(groups)
    assert list(groups) == ["out-of-range:written@out-of-range"]
    both = _case(v_layout=Layout((0, 1, 2), (0, 0, 0), 2, 0), v_cache_layout=Layout((0, 1, 2, 3), (0, 0, 0, 0), 2, 0))
    unexplained = Finding("wrong-slot", "wrong-slot:unexplained@plain", "?", facts={"minimal": both.to_dict()})
    groups = {"wrong-slot:unexplained@plain": [("u", unexplained)],
              "strides:inputs-ignored@strided-input": [("a", Finding("strides", "strides:inputs-ignored@strided-input",
                                                                      "inputs"))],
              "strides:other-cache@cache-layouts-differ": [("b", Finding("strides", "x", "other"))]}
    _attribute_combined(groups)
    assert sorted(groups) == ["strides:inputs-ignored@strided-input", "strides:other-cache@cache-layouts-differ"]
    # What nothing explains under one defect's trigger is not the narrower trigger's "combined" failure (seen on
    # an H100: it went to @plain and stayed there, a third defect where there were two)
    from conformance.diagnosis.report import _merge_narrower
    under_one = Finding("wrong-slot", "wrong-slot:unexplained@cache-layouts-differ", "?")
    groups = {"wrong-slot:unexplained@plain": [("u", unexplained)],
              "wrong-slot:unexplained@cache-layouts-differ": [("c", under_one)]}
    _merge_narrower(groups)
    assert sorted(groups) == ["wrong-slot:unexplained@cache-layouts-differ", "wrong-slot:unexplained@plain"]


def _bound_heads(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                 recipe="unfused", checked=False):
    """Its bounds check reads the number of slots as pages x H (a [pages, H, page, D] layout's), not pages x
    page_size: in-range slots past it are skipped, and slots past the cache but below it raise."""
    bound = k_cache.shape[0] * k_cache.shape[-2] if k_cache.dim() == 4 else k_cache.shape[0]
    slots = k_cache.shape[0] * (k_cache.shape[1] if k_cache.dim() == 4 else 1)
    if bool(((cache_loc >= slots) & (cache_loc < bound)).any()):
        raise IndexError("index out of range in self")
    loc = torch.where(cache_loc >= bound, torch.full_like(cache_loc, -1), cache_loc)
    _reference(k, v, k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def _stops_at_out_of_range(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                           use_triton=True, *, recipe="unfused", checked=False):
    """A per-token loop that stops at the first out-of-range slot (`break` where `continue` was meant): every
    later token is left unwritten, whatever its slot."""
    slots = k_cache.shape[0] * (k_cache.shape[1] if k_cache.dim() == 4 else 1)
    past = (cache_loc >= slots).nonzero()
    cut = int(past[0]) if past.numel() else cache_loc.shape[0]
    loc = torch.cat([cache_loc[:cut], torch.full_like(cache_loc[cut:], -1)])
    _reference(k, v, k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def _tile_tail(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
               recipe="unfused", checked=False):
    """Tiles of 4 tokens and no tail: the last T % 4 tokens are never written."""
    keep = k.shape[0] - k.shape[0] % 4
    loc = torch.cat([cache_loc[:keep], torch.full_like(cache_loc[keep:], -1)])
    _reference(k, v, k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_a_loop_that_stops_at_an_out_of_range_slot_is_no_wrong_bound() -> None:
    """Slots 32 (past the cache) then 16: the token at 16 is left unwritten, which a bound of 16 slots fits too.
    With the out-of-range token last the same slots are written right, which no bound does (held-out batch 58:
    two keys for this one cause)."""
    case = _case(num_tokens=2, num_pages=2, page_size=16, num_heads=1, cache_loc=(32, 16))
    keys = [f.key for f in Diagnoser(_impl(_stops_at_out_of_range), CPU).diagnose(case)]
    assert keys == ["wrong-slot:unwritten@out-of-range"], keys


def test_a_wrong_number_of_slots_is_told_from_a_tile_tail() -> None:
    """Both leave in-range slots unwritten; a bound of pages x H is the same formula on a cache with more
    pages, where a tile tail's unwritten slots are the same tokens' and line up with no such bound."""
    case = _case(num_tokens=3, num_pages=3, page_size=16, num_heads=2, cache_loc=(5, 0, 9))
    assert [f.key for f in Diagnoser(_impl(_bound_heads), CPU).diagnose(case)] == ["out-of-range:wrong-bound@plain"]
    tail = _case(num_tokens=7, num_pages=3, page_size=16, num_heads=2, cache_loc=(0, 1, 2, 3, 40, 7, 8))
    keys = [f.key for f in Diagnoser(_impl(_tile_tail), CPU).diagnose(tail)]
    assert keys == ["wrong-slot:unwritten@tokens-not-multiple:4"]  # and T's rule named


def _scale_in_fp16(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                   recipe="unfused", checked=False):
    """Holds each scale in float16 before the recipe (a writer storing its scale narrower than the reader)."""
    def narrowed(s):
        if isinstance(s, torch.Tensor):
            return s.half().float()
        return None if s is None else float(torch.tensor(s, dtype=torch.float32).half())
    _reference(k, v, k_cache, v_cache, cache_loc, narrowed(k_scale), narrowed(v_scale), page_size, recipe=recipe,
               checked=checked)


def test_a_scale_held_in_fp16_is_named_so() -> None:
    """fp16(0.3) is 0.3 within 2**-12: one e4m3 byte in a few hundred flips, so the Case holds 16K values."""
    case = _case(recipe="divide", num_tokens=32, num_heads=4, head_dim=64, num_pages=2, page_size=16,
                 cache_loc=tuple(range(32)), k_scale=Scale("tensor1", 0.3), v_scale=Scale("tensor1", 0.7))
    keys = [f.key for f in Diagnoser(_impl(_scale_in_fp16, "divide"), CPU).diagnose(case)]
    assert keys == ["scale:held-float16@any"]


def _overflow_sign_lost(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                        use_triton=True, *, recipe="unfused", checked=False):
    """Saturates |y| > 448 to +448 whatever its sign (torch.where(y.abs() > 448, 448, y))."""
    def flipped(x, s):
        s = 1.0 if s is None else float(s)
        return torch.where(x.float() / s < -448, -x, x)
    _reference(flipped(k, k_scale), flipped(v, v_scale), k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
               recipe=recipe, checked=checked)


def _input_2d_as_dh(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                    *, recipe="unfused", checked=False):
    """Reads a 2-D input [T, H*D] as [T, D, H]."""
    if k.dim() == 2:
        h, d = k_cache.shape[-2], k_cache.shape[-1]
        k, v = (x.reshape(x.shape[0], d, h).transpose(1, 2) for x in (k, v))
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


@pytest.mark.parametrize("fn, case, key", [
    (_overflow_sign_lost, dict(overrides=tuple(Override("k", i, b, "past") for i, b in enumerate((0xC400, 0xFF80)))),
     "encoding:overflow-sign@any"),
    (_input_2d_as_dh, dict(input_rank=2, num_heads=2, head_dim=8), "strides:input-2d-as-dh@input-2d"),
])
def test_a_lost_overflow_sign_and_a_swapped_2d_layout_are_named(fn, case, key) -> None:
    keys = [f.key for f in Diagnoser(_impl(fn, "single"), CPU).diagnose(_case(recipe="single", **case))]
    assert keys == [key]


def _v_with_k_input_strides(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                            use_triton=True, *, recipe="unfused", checked=False):
    """One stride set passed for both inputs: V read at K's strides from V's own start."""
    v = v.as_strided(v.shape, k.stride(), v.storage_offset())
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def _v_strides_ignored(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                       use_triton=True, *, recipe="unfused", checked=False):
    """V read as if contiguous (K's strides honoured)."""
    v = v.as_strided(v.shape, v.contiguous().stride(), v.storage_offset())
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


_HEADS_PADDED, _DIM_PADDED = Layout((0, 1, 2), (0, 1, 0)), Layout((0, 1, 2), (0, 0, 3))


@pytest.mark.parametrize("fn, key", [(_v_with_k_input_strides, "strides:other-input@input-layouts-differ"),
                                     (_v_strides_ignored, "strides:inputs-ignored@strided-input")],
                         ids=["k-strides", "contiguous"])
@pytest.mark.parametrize("layouts", [(Layout.contiguous(3), _HEADS_PADDED), (_DIM_PADDED, _HEADS_PADDED)],
                         ids=["k-contiguous", "both-strided"])
def test_v_read_with_k_strides_is_told_from_v_read_contiguous(fn, key, layouts) -> None:
    """Where K is contiguous the two read the same bytes; giving both inputs V's layout tells them apart (the
    first then passes, the second still fails), so each is one defect of its own cause."""
    case = _case(k_layout=layouts[0], v_layout=layouts[1])
    assert {f.key for f in Diagnoser(_impl(fn), CPU).diagnose(case)} == {key}


def _vllm_fp8_only(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """vLLM's convention, refusing "fp8_e4m3", vLLM's other name for "fp8"."""
    if kv_cache_dtype != "fp8":
        raise ValueError(f"unsupported kv_cache_dtype {kv_cache_dtype!r}")
    naive_fp8_set_kv_buffer(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, key_cache.shape[1],
                            recipe="divide")


def test_a_refused_format_alias_is_one_defect_of_its_trigger() -> None:
    impl = Implementation("fp8-only", _vllm_fp8_only, {}, convention=VLLM, recipe="divide")
    case = _case(k_scale=Scale("tensor1", 0.3), v_scale=Scale("tensor0d", 0.7), recipe="divide", format_alias=True)
    assert [f.key for f in Diagnoser(impl, CPU).diagnose(case)] == ["raises:ValueError@format-alias"]
    assert Diagnoser(impl, CPU).diagnose(case.replace(format_alias=False)) == []


def _caches_swapped(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                    recipe="unfused", checked=False):
    """K written into value_cache and V into key_cache (a K-first / V-first layout confused)."""
    _reference(k, v, v_cache, k_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_caches_swapped_is_named_so() -> None:
    keys = [f.key for f in Diagnoser(_impl(_caches_swapped), CPU).diagnose(_case())]
    assert keys == ["kv-mixed:caches-swapped@plain"]


def _stored_through(into: str):
    """One store's base pointer passed for both: K's bytes (into="v_cache") or V's (into="k_cache") written
    through the other cache's pointer at their own cache's offsets and strides, K first."""
    def impl(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
             recipe="unfused", checked=False):
        caches = {"k_cache": k_cache, "v_cache": v_cache}
        redirected = "v_cache" if into == "k_cache" else "k_cache"  # the side whose store takes `into`'s pointer
        for side, other in (("k_cache", "v_cache"), ("v_cache", "k_cache")):
            mine = caches[side]
            target = (torch.as_strided(caches[into], mine.shape, mine.stride(), mine.storage_offset())
                      if side == redirected else mine)
            _reference(k, v, **{side: target, other: caches[other].clone()}, cache_loc=cache_loc, k_scale=k_scale,
                       v_scale=v_scale, page_size=page_size, recipe=recipe, checked=checked)
    return impl


@pytest.mark.parametrize("into, key", [("k_cache", "kv-mixed:v-into-k-cache@plain"),
                                       ("v_cache", "wrong-slot:unwritten@plain")], ids=["v-into-k", "k-into-v"])
def test_a_store_through_the_other_caches_pointer_is_named_by_what_it_leaves(into, key) -> None:
    """V stored through key_cache's pointer (a Triton launch passing key_cache for both stores' bases) is one
    defect by cause, not wrong bytes no model explains (held-out batch 54's `_only2` twin). K stored through
    value_cache's pointer leaves nothing of K where the layouts agree (V's bytes follow): key_cache unwritten,
    which is all the bytes can say."""
    keys = [f.key for f in Diagnoser(_impl(_stored_through(into)), CPU).diagnose(_case())]
    assert keys == [key]


def _scatter_misread(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe, checked,
                     strides_of) -> None:
    """Each token's reference bytes scattered through each cache viewed with strides_of(cache): a plain-torch
    write wherever that view points, overlapping pages included (the reference refuses such a view)."""
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        one = torch.zeros((x.shape[0], 1, *cache.shape[2:]), dtype=cache.dtype)
        _reference(x, x, one, one.clone(), torch.arange(x.shape[0]), scale, scale, 1, recipe=recipe, checked=checked)
        view = cache.as_strided(cache.shape, strides_of(cache), cache.storage_offset())
        for t, s in enumerate(cache_loc.tolist()):
            if 0 <= s < cache.shape[0] * page_size:
                view[s // page_size, s % page_size] = one[t, 0]


def _page_stride_from_shape(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                            use_triton=True, *, recipe="unfused", checked=False):
    """Each cache's page stride taken as page_size * H * D, its other strides its own."""
    _scatter_misread(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe, checked,
                     lambda c: (page_size * c.shape[2] * c.shape[3], *c.stride()[1:]))


@pytest.mark.parametrize("layout", [Layout((0, 2, 1, 3), (0, 0, 1, 0)), Layout((0, 1, 2, 3), (0, 0, 0, 4))],
                         ids=["head-major-padded", "dim-padded"])
def test_a_page_stride_from_the_shape_is_named_so(layout: Layout) -> None:
    """A dim-padded cache read with a page stride of page_size * H * D overlaps its own pages: the reference
    refuses such a view, so the model writes it token by token."""
    case = _case(v_cache_layout=layout, cache_loc=(5, 0, 9))
    keys = [f.key for f in Diagnoser(_impl(_page_stride_from_shape), CPU).diagnose(case)]
    assert keys == ["strides:cache-page-stride@strided-cache"]


def _head_stride_as_head_dim(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                             use_triton=True, *, recipe="unfused", checked=False):
    """Each cache's head stride taken as head_dim (`h * D`, not `h * stride(2)`), its other strides its own
    (held-out batch 24's vLLM write)."""
    _scatter_misread(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe, checked,
                     lambda c: (*c.stride()[:2], c.shape[3], c.stride(3)))


@pytest.mark.parametrize("layout", [Layout((0, 2, 1, 3), (0, 0, 0, 0)), Layout((0, 1, 2, 3), (0, 0, 0, 4))],
                         ids=["head-major", "dim-padded"])
def test_a_head_stride_from_the_shape_is_named_so(layout: Layout) -> None:
    case = _case(v_cache_layout=layout, cache_loc=(5, 0, 9))
    found = Diagnoser(_impl(_head_stride_as_head_dim), CPU).diagnose(case)
    assert [f.key for f in found] == ["strides:cache-inner-stride@strided-cache"], [f.key for f in found]
    assert "the head stride as head_dim" in found[0].facts["detail"], found[0].facts


def _dim_tail_dropped(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                      *, recipe="unfused", checked=False):
    """Each head written 8 dims at a time with no tail: the last D % 8 dims keep their old bytes."""
    old = [c.clone() for c in (k_cache, v_cache)]
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    tail = k_cache.shape[-1] - k_cache.shape[-1] % 8
    for cache, before in zip((k_cache, v_cache), old):
        cache[..., tail:] = before[..., tail:]


@pytest.mark.parametrize("head_dim", [4, 12, 20])
def test_a_head_size_rule_is_found_by_probing_sizes(head_dim: int) -> None:
    """D of 4 (a power of two: no ablation moves it) and D of 12 or 20 are one defect: D not a multiple of 8."""
    keys = [f.key for f in Diagnoser(_impl(_dim_tail_dropped), CPU).diagnose(_case(head_dim=head_dim))]
    assert keys == ["wrong-slot:unwritten@dim-not-multiple:8"]


def _raises_at_one_dim(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                       *, recipe="unfused", checked=False):
    """A tile of D // 2 lanes, two dims each, never raised to one lane: D = 1 raises, odd D above it is right."""
    if k.shape[-1] == 1:
        raise ValueError("arange's range must be greater than 0")
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_a_raise_at_d_1_alone_is_not_read_as_odd_d() -> None:
    """Held-out batch 37: every probed D was even, so D = 1's raise read as "D not a multiple of 2"; D = 3 passes."""
    keys = [f.key for f in Diagnoser(_impl(_raises_at_one_dim), CPU).diagnose(_case(head_dim=1))]
    assert keys == ["raises:ValueError@dim-below:2"], keys


def test_a_raise_only_in_a_shared_buffer_joins_the_diagnosed_raise_of_its_type() -> None:
    """Inputs sliced from one qkv buffer are strided: a kernel refusing strided inputs raises there too, and its
    saved Case (rebuilt in separate buffers) passes. The raise's type ties it to the diagnosed one."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_same_exception
    shared = Finding("raises", "raises:shared-memory", "shared", facts={"exception": "ValueError"})
    diagnosed = Finding("raises", "raises:ValueError@strided-input", "strided")
    groups = {"raises:ValueError@strided-input": [("a", diagnosed)], "raises:shared-memory": [("b", shared)]}
    _merge_same_exception(groups)
    assert list(groups) == ["raises:ValueError@strided-input"] and len(groups["raises:ValueError@strided-input"]) == 2
    other = Finding("raises", "raises:shared-memory", "shared", facts={"exception": "RuntimeError"})
    groups = {"raises:ValueError@strided-input": [("a", diagnosed)], "raises:shared-memory": [("b", other)]}
    _merge_same_exception(groups)
    assert sorted(groups) == ["raises:ValueError@strided-input", "raises:shared-memory"]


def test_a_failure_hypothesis_could_not_repeat_is_the_implementations_state() -> None:
    """Hypothesis raises FlakyFailure when an example fails and then passes on its second run: the suite's tensors
    come from seeds, so the implementation gave other bytes for the same call, one defect of its state."""
    from hypothesis.errors import FlakyFailure

    from conformance.diagnosis.classify import classify_failure
    from conformance.diagnosis.recorder import leaves
    from conformance.harness import ConformanceFailure, _failure_kind
    failure = _failure_kind("bytes")("impl: cache dtype float8_e4m3fn vs uint8 changes the k_cache bytes it writes:")
    group = FlakyFailure("Failed on the first call but did not on a subsequent one", [failure])
    assert type(group).__name__ == "FlakyFailure" and leaves(group) == [failure]
    found = classify_failure(failure, "test_fp8_and_uint8_caches_agree", "test_equivalence", {}, None, None,
                             unrepeatable=True)
    assert [f.key for f in found] == ["state:unrepeatable"]
    assert isinstance(failure, ConformanceFailure)
    other = classify_failure(failure, "test_fp8_and_uint8_caches_agree", "test_equivalence", {}, None, None)
    assert [f.key for f in other] != ["state:unrepeatable"]


def test_a_capture_the_card_being_full_spoiled_is_no_defect_even_when_hypothesis_could_not_repeat_it() -> None:
    """torch.cuda.graph's exit fails with "operation failed due to a previous error during capture" after any
    error inside the capture; the capture's failure names that earlier error first, so an allocation that found
    the card full (other reports held it, seen on an H100 with 8 reports at a time) reads as the machine's, not
    as `state:unrepeatable`, when the repeat then passed."""
    from conformance.diagnosis.classify import classify_failure
    from conformance.harness import _failure_kind
    from conformance.test_graphs import capture_error
    try:
        try:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                               "79.18 GiB of which 1.00 GiB is free.")
        except RuntimeError:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture") from None
    except RuntimeError as exc:
        assert exc.__cause__ is None and exc.__suppress_context__
        ended = exc
    try:
        try:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                               "79.18 GiB of which 1.00 GiB is free.")
        except RuntimeError:
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")  # noqa: B904
    except RuntimeError as exc:
        chained = exc
    text = capture_error(chained)
    assert text.index("CUDA out of memory") < text.index("then RuntimeError: CUDA error: operation failed")
    assert capture_error(ended).startswith("RuntimeError: CUDA error: operation failed")  # its only error
    failure = _failure_kind("capture")(f"impl: failed under CUDA-graph capture:\n{text}")
    found = classify_failure(failure, "test_replay_new_contents", "test_graphs", {}, None, None, unrepeatable=True)
    assert [f.key for f in found] == ["unclassified:out-of-memory"]
    plain = _failure_kind("capture")(f"impl: failed under CUDA-graph capture:\n{capture_error(ended)}")
    found = classify_failure(plain, "test_replay_new_contents", "test_graphs", {}, None, None, unrepeatable=True)
    assert [f.key for f in found] == ["state:unrepeatable"]


def _written_then(edit):
    """A kernel that writes as the reference does, then edits the caches: edit(k_cache, v_cache, cache_loc, page)."""
    def fn(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
           recipe="unfused", checked=False):
        _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
        edit(k_cache.view(torch.uint8), v_cache.view(torch.uint8), cache_loc, page_size)
    return fn


def _zero_page_rest(kc, vc, loc, page):
    named = {s for s in loc.tolist() if 0 <= s < kc.shape[0] * page}
    for s in {x for p in {s // page for s in named} for x in range(p * page, (p + 1) * page)} - named:
        kc[s // page, s % page] = 0
        vc[s // page, s % page] = 0


def _e5m2_into_e4m3(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                    recipe="unfused", checked=False):
    """A uint8 cache taken to hold e5m2."""
    fmt = "fp8_e5m2" if k_cache.dtype == torch.uint8 else "fp8_e4m3"
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe,
                            checked=checked, cache_dtype=fmt)


def _loc_words(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
               recipe="unfused", checked=False):
    """cache_loc read through an int32 pointer."""
    loc = cache_loc.contiguous().view(torch.int32)[:cache_loc.numel()] if cache_loc.dtype == torch.int64 else cache_loc
    _reference(k, v, k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def _fp16_as_bf16(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                  recipe="unfused", checked=False):
    """Every 2-byte input sent down the bf16 path."""
    if k.dtype == torch.float16:
        k, v = k.view(torch.bfloat16), v.view(torch.bfloat16)
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def _fnuz_own_nan(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                  recipe="unfused", checked=False):
    """e4m3fnuz bytes (a ROCm format table copied for "fp8"), the NaN still the explicit 0x7F of e4m3."""
    kc, vc = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    naive_fp8_set_kv_buffer(k, v, kc, vc, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked,
                            cache_dtype="fp8_e4m3fnuz")
    for c in (kc, vc):
        for row in _written_bytes(c, cache_loc, page_size):
            row[row == 0x80] = 0x7F  # fnuz's NaN byte; fnuz has no -0, so nothing else is 0x80


def test_bytes_of_another_format_keep_the_explicit_nan_byte() -> None:
    """Another format's bytes with the cache's own NaN byte are that format's bytes (the NaN set by hand)."""
    specials = tuple(Override(t, i, bits, label) for t in "kv" for i, (bits, label) in enumerate(
        ((0x0000, "+0"), (0x8000, "-0"), (0x7F80, "+inf"), (0xFF80, "-inf"), (0x7FC0, "+nan"), (0xFFC0, "-nan"))))
    one = Scale("tensor1", 1.0)
    case = Case(num_tokens=1, num_heads=1, head_dim=8, page_size=16, num_pages=1, cache_loc=(0,), k_scale=one,
                v_scale=one, overrides=specials, recipe="divide")
    keys = [f.key for f in Diagnoser(_impl(_fnuz_own_nan, "divide"), CPU).diagnose(case)]
    assert keys == ["format:e4m3fnuz-bytes@any"], keys


@pytest.mark.parametrize("fn, changes, key", [
    (_written_then(_zero_page_rest), {}, "wrong-slot:page-rest-zeroed@plain"),
    (_e5m2_into_e4m3, {"cache_dtype": "uint8"}, "format:e5m2-bytes@cache-uint8"),
    (_loc_words, {}, "wrong-slot:loc-int32-words@many-tokens"),
    (_fp16_as_bf16, {"input_dtype": "float16"}, "input-misread:bfloat16@input-float16"),
], ids=["page-rest-zeroed", "e5m2-in-uint8", "loc-int32-words", "fp16-as-bf16"])
def test_blind_batch_classes_are_one_defect_each(fn, changes, key) -> None:
    """Classes the second blind batch showed (docs/results/heldout-cpu-2026-12-04.md), each one defect."""
    keys = [f.key for f in Diagnoser(_impl(fn), CPU).diagnose(_case(**changes))]
    assert keys == [key]


def _head_tile_of_4(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                    recipe="unfused", checked=False):
    """Heads past the fourth never written (a head tile capped at 4, no loop over further tiles)."""
    old = [c.clone() for c in (k_cache, v_cache)]
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    for cache, before in zip((k_cache, v_cache), old):
        cache[..., 4:, :] = before[..., 4:, :]


@pytest.mark.parametrize("heads", [5, 8])
def test_heads_past_a_tile_unwritten_are_one_defect_of_h(heads: int) -> None:
    """Old bytes left in heads 4.. read as signs or overflows by chance; they are one slot left unwritten, and H of
    8 (a power of two: no ablation moves it) is named by probing sizes: above 4."""
    keys = [f.key for f in Diagnoser(_impl(_head_tile_of_4), CPU).diagnose(_case(num_heads=heads))]
    assert keys == ["wrong-slot:unwritten@heads-above:4"]


@pytest.mark.parametrize("fn, key", [("_head_tile_of_4", "wrong-slot:unwritten@heads-above:4"),
                                     ("_inf_as_nan", "encoding:inf-nan@any")], ids=["head-tile", "fill-only"])
def test_an_exhaustive_case_probes_its_sizes_without_its_fill(fn: str, key: str) -> None:
    """The exhaustive patterns fill a Case of one shape, so no size of it can be probed with them: where the
    Case fails alike without the fill (heads past a tile left unwritten), its sizes are probed so and the
    trigger names H; a symptom only the patterns show (an infinity written as NaN) gets no rule from that."""
    from conformance import test_exhaustive as ex

    case = ex.pattern_case("bfloat16", Scale("float", 0.30000001192092896), Scale("tensor0d", 2.0**-5), "unfused")
    found = Diagnoser(_impl(globals()[fn]), CPU, ex.fill_patterns).diagnose(case)
    assert [f.key for f in found] == [key]


def test_a_raise_tied_between_two_hosts_joins_them_once_they_are_one() -> None:
    """A kernel addressing pages with a stride from the shape raises where that view leaves the storage; its wrong
    bytes read as the cache ignored in one Case and as the page stride in another, one defect once explained
    (_merge_explained), and only then can the raise join it (defects_from merges raises again after)."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_explained, _merge_raises
    ignored, page = "strides:cache-ignored@strided-cache", "strides:cache-page-stride@strided-cache"
    raised = "raises:RuntimeError@strided-cache"
    groups = {raised: [("r", Finding("raises", raised, "raises"))],
              ignored: [("a", Finding("strides", ignored, "ignored", facts={"explanations": [ignored, page]}))],
              page: [("b", Finding("strides", page, "page", facts={"explanations": [page]}))]}
    _merge_raises(groups)
    assert raised in groups  # two hosts of one trigger: a tie
    _merge_explained(groups)
    _merge_raises(groups)
    assert list(groups) == [page]


def _tile_slots(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True):
    """SGLang's convention; token t >= 8 written to cache_loc[t % 8] (a tile's slots loaded from the first tile)."""
    loc = cache_loc.clone()
    if loc.numel() > 8:
        loc[8:] = cache_loc[torch.arange(8, loc.numel()) % 8]
    _reference(k, v, k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe="single")


def test_a_placement_defect_of_big_batches_does_not_hide_the_recipe() -> None:
    """The identification sweep writes 128 tokens a call; where that matches no recipe, it is run again one token
    a call, and the recipe found there is held (the placement defect is the properties' to name)."""
    from conformance.conventions import SGLANG
    from conformance.diagnosis.identification import identify_robustly, sweep_points
    impl = Implementation("tile-slots", _tile_slots, {}, convention=SGLANG)
    recipe, note = identify_robustly(impl, sweep_points(["bfloat16"], full=False, convention=SGLANG), CPU)
    assert recipe == "single" and "one token a call" in note, note


def _refuses_one_element_scales(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """examples/vllm_divide.py behind a rank dispatch: a 1-D scale taken for a per-head one, so a valid [1] scale
    raises ValueError where H > 1 (held-out batch 57's ph_scale_rank_dispatch)."""
    from examples.vllm_divide import reshape_and_cache_flash
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s.dim() == 1 and s.numel() != key.shape[1]:
            raise ValueError(f"{name} must be 0-d or [{key.shape[1]}], got shape {tuple(s.shape)}")
    reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def test_a_refused_scale_form_does_not_hide_the_recipe() -> None:
    """Where every sweep point raised with the plain call's scale form, the sweep runs again in the convention's
    other forms, and a recipe found there is held (the refusal is the properties' to name): held to unfused,
    the kernel above got three rounding keys besides its raise."""
    from conformance.conventions import VLLM
    from conformance.diagnosis.identification import identify_robustly, sweep_points
    impl = Implementation("refuses-1", _refuses_one_element_scales, {}, convention=VLLM)
    recipe, note = identify_robustly(impl, sweep_points(["bfloat16"], full=False, convention=VLLM), CPU)
    assert recipe == "divide" and "0-d tensor" in note and "raised on every sweep point" in note, note


def _bf16_staged_nan_signed(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                            use_triton=True):
    """SGLang's division of a copy (recipe unfused-tensor1 for a [1] scale), its quotient staged in bf16 whatever
    the input's dtype, and torch's cast keeping a NaN's sign (held-out batch forty-seven's pair on its base)."""
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        y = x.to(torch.bfloat16) if scale is None else torch.div(x, scale).to(torch.bfloat16)
        q = y.float().clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
        q = torch.where(y.isnan(), torch.where(y.float().signbit(), 0xFF, 0x7F), q).to(torch.uint8)
        rows = cache.view(torch.uint8).reshape(-1, q[0].numel())
        for t, slot in enumerate(cache_loc.tolist()):
            if 0 <= slot < rows.shape[0]:
                rows[slot] = q[t].reshape(-1)


def test_a_nan_sign_every_recipe_misses_does_not_choose_the_recipe() -> None:
    """A kernel that keeps NaN's sign misses every recipe on the plain dtype's NaN bytes, so no recipe matched bf16
    and the fp16 bytes (double-rounded through bf16) decided: the nearest IEEE division was held, and its
    report was off on every Case. NaN's sign aside (an encoding rule the properties key apart), bf16 picks the
    recipe the kernel computes."""
    from conformance.conventions import SGLANG
    from conformance.diagnosis.identification import identify_robustly, sweep_points
    impl = Implementation("bf16-staged", _bf16_staged_nan_signed, {}, convention=SGLANG)
    recipe, note = identify_robustly(impl, sweep_points(["bfloat16", "float16"], full=False, convention=SGLANG), CPU)
    assert recipe == "unfused-tensor1", note


def _rounds_toward_zero(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                        use_triton=True, *, recipe="unfused", checked=False):
    """Recipe `single`, each nonzero byte one e4m3 step toward zero where the reference rounded away from it."""
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe="single", checked=checked)
    for cache in (k_cache, v_cache):
        b = cache.view(torch.uint8)
        b.sub_(((b & 0x7F) % 3 == 1).to(torch.uint8))  # a value defect: some bytes one step lower, every call


def test_a_value_defect_is_not_swept_again_one_token_a_call_at_every_point() -> None:
    """Where the batch sweep matches no recipe, the one-token retry is tried first at each recipe's worst point:
    a value defect shows there again, so the retry of every point (a call per token: minutes on a GPU) is not
    run, and the recipe held and its residual are those of the batch sweep."""
    from conformance.conventions import SGLANG
    from conformance.diagnosis.identification import held_recipe, identify, identify_robustly, sweep_points
    calls = []
    impl = Implementation("toward-zero", lambda *a, **kw: calls.append(1) or _rounds_toward_zero(*a, **kw), {},
                          convention=SGLANG)
    points = sweep_points(["bfloat16", "float16"], full=False, convention=SGLANG)
    batch = held_recipe(identify(impl, points, CPU))
    calls.clear()
    assert identify_robustly(impl, points, CPU) == batch
    assert len(calls) < len(points) * (1 + 128), len(calls)  # the batch sweep, then fewer than a retry of it all


def _page_offset_swapped(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                         use_triton=True, *, recipe="unfused", checked=False):
    """page, offset = slot % page_size, slot // page_size: an offset past the page raises IndexError."""
    ps = k_cache.shape[1]
    page, offset = cache_loc % ps, cache_loc // ps
    if bool(((cache_loc >= 0) & ((offset >= ps) | (page >= k_cache.shape[0]))).any()):
        raise IndexError("index out of bounds for dimension 1")
    _reference(k, v, k_cache, v_cache, torch.where(cache_loc >= 0, page * ps + offset, cache_loc), k_scale, v_scale,
               page_size, recipe="single", checked=checked)


def test_a_kernel_that_raises_on_the_sweeps_layouts_is_identified_one_token_at_slot_0() -> None:
    """Page and offset swapped raise for every slot past the first page's in the sweep's layouts (pages of one
    slot, of 16): each token alone at slot 0 of a one-slot cache shows the recipe."""
    from conformance.conventions import SGLANG
    from conformance.diagnosis.identification import identify_robustly, sweep_points
    impl = Implementation("page-offset-swapped", _page_offset_swapped, {}, convention=SGLANG)
    recipe, note = identify_robustly(impl, sweep_points(["bfloat16"], full=False, convention=SGLANG), CPU)
    assert recipe == "single" and "alone at slot 0" in note, note


def _head_major(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                recipe="unfused", checked=False):
    """Pages addressed as [H, page_size, D] in a [page_size, H, D] cache (HND for NHD)."""
    def hnd(c):
        return c.as_strided(c.shape, (c.stride(0), c.stride(2), c.shape[1] * c.stride(2), c.stride(3)),
                            c.storage_offset())
    _reference(k, v, hnd(k_cache), hnd(v_cache), cache_loc, k_scale, v_scale, page_size, recipe=recipe,
               checked=checked)


def _compacted_padding(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                       use_triton=True, *, recipe="unfused", checked=False):
    """Padding dropped from cache_loc, not from the inputs: token i written to the i-th real slot."""
    real = cache_loc[cache_loc >= 0]
    loc = torch.full_like(cache_loc, -1)
    loc[:real.numel()] = real
    _reference(k, v, k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def _compacted_in_range(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                        use_triton=True, *, recipe="unfused", checked=False):
    """Every slot that writes nothing dropped from cache_loc, not the inputs (`masked_scatter_` filling the valid
    rows from the tokens in order): token i written to the i-th slot in range."""
    slots = k_cache.shape[0] * k_cache.shape[1]
    real = cache_loc[(cache_loc >= 0) & (cache_loc < slots)]
    loc = torch.full_like(cache_loc, -1)
    loc[:real.numel()] = real
    _reference(k, v, k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_slots_compacted_past_the_end_is_the_padding_defect() -> None:
    """A held-out kernel (batch 49) dropped padding and out-of-range slots alike: under out-of-range it is the
    slots-compacted model too (not tokens moved), and the report joins it to the same effect under padding."""
    from conformance.diagnosis.report import _merge_skipped_tokens
    case = _case(cache_loc=(12, 5, 0), checked=False)  # 12 slots: the first token's is out of range
    keys = [f.key for f in Diagnoser(_impl(_compacted_in_range), CPU).diagnose(case)]
    assert keys == ["padding:slots-compacted@out-of-range"], keys
    groups = _groups("padding:slots-compacted@padding", "padding:slots-compacted@out-of-range+slots-unsorted")
    _merge_skipped_tokens(groups)
    assert list(groups) == ["padding:slots-compacted@padding"], list(groups)


def _fp32_as_bf16(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                  recipe="unfused", checked=False):
    """A float32 input read through a bfloat16 pointer (element i from byte 2i)."""
    if k.dtype == torch.float32:
        k, v = (x.contiguous().reshape(-1).view(torch.bfloat16)[:x.numel()].reshape(x.shape) for x in (k, v))
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


_ZEROS = tuple(Override("k", i, 0x80000000 if i % 2 else 0, "zero") for i in range(8))  # fp32 ±0


@pytest.mark.parametrize("fn, changes, key", [
    (_head_major, {}, "strides:cache-head-major@heads-above:1"),
    (_compacted_padding, {"cache_loc": (-1, 5, 0)}, "padding:slots-compacted@padding"),
    (_fp32_as_bf16, {"input_dtype": "float32"}, "input-misread:bfloat16@input-float32"),
    (_fp32_as_bf16, {"input_dtype": "float32", "overrides": _ZEROS}, "input-misread:bfloat16@input-float32"),
], ids=["head-major", "compacted-padding", "fp32-as-bf16", "fp32-as-bf16-zeros"])
def test_third_blind_batch_classes_are_one_defect_each(fn, changes, key) -> None:
    """The zeros Case: where the misread input's only wrong bytes are zero signs, a sign rule fits by chance;
    re-drawn values write wrong values, which it does not explain, and the misread does."""
    keys = [f.key for f in Diagnoser(_impl(fn), CPU).diagnose(_case(**changes))]
    assert keys == [key]


def _scale_floor(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                 recipe="unfused", checked=False):
    """A guard under the scale: `max(s, 1e-12)`, which a legal tiny scale meets."""
    floor = (lambda s: s if s is None else max(float(s), 1e-12) if not isinstance(s, torch.Tensor)
             else s.clamp(min=1e-12))
    _reference(k, v, k_cache, v_cache, cache_loc, floor(k_scale), floor(v_scale), page_size, recipe=recipe,
               checked=checked)


def test_a_floor_under_the_scale_is_not_read_as_the_scale_ignored() -> None:
    """At a scale of 1e-30 the floored scale writes ±0 for the Case's tiny inputs, as ignoring the scale does;
    at the telling scales (0.3, 1.7) the call is right, which refutes the scale ignored, and the floor fits."""
    case = _case(k_scale=Scale("tensor1", 1e-30), v_scale=Scale("float", 0.7))
    assert [f.key for f in Diagnoser(_impl(_scale_floor), CPU).diagnose(case)] == ["scale:floored:1e-12@any"]


def _pack_order(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                recipe="unfused", checked=False):
    """A 4-byte vector store packing its bytes in the wrong order, taken only where D is a multiple of 4."""
    d = k.shape[-1]
    if d % 4 == 0:
        k, v = (x.reshape(*x.shape[:-1], d // 4, 4).flip(-1).reshape(x.shape) for x in (k, v))
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_dims_reversed_in_fours_is_one_defect_of_d() -> None:
    """Bytes moved within a row fall into other symptom classes (a sign, an overflow) as the values move: one
    defect, named by the rule on D that probing other sizes finds (a multiple of 4: D = 2 and 6 are right)."""
    keys = [f.key for f in Diagnoser(_impl(_pack_order), CPU).diagnose(_case())]
    assert keys == ["strides:dims-reversed:4@dim-multiple:4"]


def _word_halves_swapped(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                         use_triton=True, *, recipe="unfused", checked=False):
    """An 8-byte store built as `(lo << 32) | hi` where D is a multiple of 8: in each group of 8 dims, dims 0..3
    and 4..7 trade places (held-out batch 62)."""
    d = k.shape[-1]
    if d % 8 == 0:
        k, v = (x.reshape(*x.shape[:-1], d // 8, 2, 4).flip(-2).reshape(x.shape) for x in (k, v))
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_a_words_halves_swapped_is_named_so_on_one_row() -> None:
    """A single row of 8 dims, values repeated, tells no permutation by itself; the model of the store does."""
    one_row = tuple(Override("k", i, _bf16(x), "small") for i, x in enumerate((1.0, -2.5, -2.5, 96.0, 0.375, 3.0)))
    keys = [f.key for f in Diagnoser(_impl(_word_halves_swapped), CPU).diagnose(
        _case(num_tokens=1, num_heads=1, cache_loc=(5,), overrides=one_row))]
    assert keys == ["strides:dims-halves-swapped:8@dim-multiple:8"], keys


def _pid_mod_heads(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                   recipe="unfused", checked=False):
    """A (head, K or V) grid axis of 2 H programs decomposed as head = pid % H, half = pid % 2: for even H, K's odd
    heads and V's even heads are never written (held-out batch 62)."""
    h = k.shape[-2]
    old = (k_cache.clone(), v_cache.clone())
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    if h % 2 == 0:
        k_cache[..., 1::2, :] = old[0][..., 1::2, :]
        v_cache[..., 0::2, :] = old[1][..., 0::2, :]


def test_heads_left_unwritten_for_even_h_are_named_by_parity() -> None:
    keys = [f.key for f in Diagnoser(_impl(_pid_mod_heads), CPU).diagnose(_case())]
    assert keys == ["wrong-slot:unwritten@heads-multiple:2"], keys


def test_an_exception_in_the_suites_own_frames_is_never_the_implementations() -> None:
    """A diagnosis bug (a KeyError in the suite's code, say) that escapes a probe is a suite error, not a raise
    of the implementation under test."""
    from conformance.conventions import get_convention
    from conformance.diagnosis.classify import classify_failure
    try:
        get_convention("no-such-convention")  # raises in conformance/conventions.py: the suite's own frame
    except ValueError as exc:
        found = classify_failure(exc, "test_capability", "capability_probes", {}, None, None)
    assert [f.key for f in found] == ["unclassified:suite"]


def test_a_raise_joins_the_one_unexplained_diff_of_its_exact_trigger() -> None:
    """A page size taken as a power of two writes wrong slots on some Cases and indexes past the cache on
    others, both only for some page sizes: with no model for it, one unexplained defect, the raise its symptom."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_raises
    wrong, raised = "wrong-slot:unexplained@page-size", "raises:IndexError@page-size"
    groups = {wrong: [("a", Finding("wrong-slot", wrong, "wrong"))], raised: [("b", Finding("raises", raised, "r"))]}
    _merge_raises(groups)
    assert list(groups) == [wrong]
    other = "raises:IndexError@page-size+padding"
    groups = {wrong: [("a", Finding("wrong-slot", wrong, "wrong"))], other: [("b", Finding("raises", other, "r"))]}
    _merge_raises(groups)
    assert sorted(groups) == sorted([wrong, other])


def _heads_reversed(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                    recipe="unfused", checked=False):
    """Head h of each token written where head H-1-h belongs (a head index counted from the wrong end)."""
    k, v = (x.flip(-2) if x.dim() == 3 else x for x in (k, v))
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def _dims_deinterleaved(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                        use_triton=True, *, recipe="unfused", checked=False):
    """Each head's even dims first, then its odd ones (a rotary-style lane order where none belongs)."""
    def order(x):
        d = x.shape[-1]
        return x if x.dim() != 3 else x[..., [2 * i if i < d // 2 else 2 * (i - d // 2) + 1 for i in range(d)]]
    _reference(order(k), order(v), k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe,
               checked=checked)


def _slot_plus_one(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                   recipe="unfused", checked=False):
    """Each token written one slot past its own (an index off by one), the last slot's token skipped."""
    n = k_cache.shape[0] * (page_size if k_cache.dim() == 4 else 1)
    loc = torch.where((cache_loc >= 0) & (cache_loc < n - 1), cache_loc + 1, torch.full_like(cache_loc, -1))
    _reference(k, v, k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def _tokens_reversed(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                     *, recipe="unfused", checked=False):
    """Token t's bytes at token T-1-t's slot (the batch read from the wrong end)."""
    _reference(k.flip(0), v.flip(0), k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe,
               checked=checked)


@pytest.mark.parametrize(("fn", "key", "words"), [
    (_heads_reversed, "strides:heads-permuted@heads-above:1", "heads in reverse order"),
    (_dims_deinterleaved, "strides:dims-permuted@plain", "even dims first, then odd ones"),
    (_slot_plus_one, "wrong-slot:tokens-moved@plain", "1 slot past its own"),
    (_tokens_reversed, "wrong-slot:tokens-moved@many-tokens", "token 0 at token 2's slot"),
])
def test_the_references_own_bytes_in_other_places_are_one_moved_defect(fn, key, words) -> None:
    """Bytes that are all the reference's, moved (heads or dims in another order, tokens at other slots), are
    one defect that says how they moved, whatever symptom classes the moved values fall into."""
    found = Diagnoser(_impl(fn), CPU).diagnose(_case())
    assert [f.key for f in found] == [key]
    assert words in found[0].facts["detail"], found[0].facts["detail"]


def test_a_raise_on_a_layout_is_the_defect_that_misreads_that_argument() -> None:
    """`loc.view(torch.int32)` reads a contiguous int64 cache_loc's words as slots and raises on a strided one:
    the raise, triggered by cache_loc's layout alone, joins the one defect that misreads cache_loc."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_misread_raise
    raised = Finding("raises", "raises:RuntimeError@strided-loc", "raises RuntimeError")
    other = Finding("raises", "raises:ValueError@strided-input", "raises ValueError")
    groups = {"wrong-slot:loc-int32-words@plain": [("a", Finding("wrong-slot", "wrong-slot:loc-int32-words@plain",
                                                                 "reads words"))],
              raised.key: [("b", raised)], other.key: [("c", other)]}
    _merge_misread_raise(groups)
    assert sorted(groups) == [other.key, "wrong-slot:loc-int32-words@plain"], sorted(groups)
    assert raised.facts["symptom_of"] == "wrong-slot:loc-int32-words@plain"


def _written_bytes(cache: torch.Tensor, cache_loc: torch.Tensor, page_size: int) -> Iterator[torch.Tensor]:
    """Each in-range slot's row of a cache, as uint8 (a view to rewrite)."""
    rows = cache.view(torch.uint8)
    n = rows.shape[0] * (page_size if rows.dim() == 4 else 1)
    for s in cache_loc.tolist():
        if 0 <= s < n:
            yield rows[s // page_size, s % page_size] if rows.dim() == 4 else rows[s]


def _subnormal_sign_dropped(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                            use_triton=True, *, recipe="unfused", checked=False):
    """An encoder whose subnormal branch forgets the sign: -subnormal results written positive."""
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    for cache in (k_cache, v_cache):
        for row in _written_bytes(cache, cache_loc, page_size):
            negative_subnormal = ((row & 0x78) == 0) & ((row & 0x07) != 0) & ((row & 0x80) != 0)
            row.copy_(torch.where(negative_subnormal, row & 0x7F, row))


def _head0_scaled(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                  recipe="unfused", checked=False):
    """One scale read as a per-head vector padded with 1.0: heads past the first written unscaled."""
    unscaled = [k_cache.clone(), v_cache.clone()]
    _reference(k, v, *unscaled, cache_loc, None, None, page_size, recipe=recipe, checked=checked)
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    for cache, other in zip((k_cache, v_cache), unscaled):
        for row, plain in zip(_written_bytes(cache, cache_loc, page_size), _written_bytes(other, cache_loc, page_size)):
            row[1:] = plain[1:]


@pytest.mark.parametrize(("fn", "key", "words"), [
    (_subnormal_sign_dropped, "sign:dropped@any", "subnormal"),
    (_head0_scaled, "scale:ignored@any", "only on heads 1 (heads 0 right)"),
])
def test_a_value_rule_on_some_bytes_alone_is_named_with_them(fn, key, words) -> None:
    """A sign bit lost on one kind of value, or a rule applied to some heads alone: one defect, its detail saying
    which values or heads."""
    found = Diagnoser(_impl(fn), CPU).diagnose(_case())
    assert [f.key for f in found] == [key]
    assert words in found[0].facts["detail"], found[0].facts["detail"]


def _v_cache_from_storage_start(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                                use_triton=True, *, recipe="unfused", checked=False):
    """value_cache addressed from its storage's start (a storage pointer taken for the view's)."""
    v_cache = torch.as_strided(v_cache, v_cache.shape, v_cache.stride(), 0)
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def _k_from_storage_start(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                          use_triton=True, *, recipe="unfused", checked=False):
    """key read from its storage's start."""
    k = torch.as_strided(k, k.shape, k.stride(), 0)
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


@pytest.mark.parametrize(("fn", "detail"), [(_v_cache_from_storage_start, "v_cache"), (_k_from_storage_start, "k")])
def test_a_tensor_addressed_from_its_storage_start_is_one_offset_defect(fn, detail) -> None:
    """Every tensor the suite builds sits past a guard band: a dropped storage offset shows on every call, as
    writes before the cache view (or reads of the poison before an input) and slots left unwritten."""
    found = Diagnoser(_impl(fn), CPU).diagnose(_case())
    assert [(f.key, f.facts["detail"]) for f in found] == [("strides:offset-ignored@plain", detail)]


def _tokens_in_fours(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                     recipe="unfused", checked=False):
    """A grid of T // 4 blocks of four tokens (a floor where a ceiling belongs): the last T % 4 tokens unwritten."""
    loc = cache_loc.clone()
    loc[k.shape[0] // 4 * 4:] = -1
    _reference(k, v, k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_a_failure_that_needs_some_numbers_of_tokens_is_named_by_t() -> None:
    """Probing other numbers of tokens names T's rule, as H's and D's are named (T = 4 and 8 are right)."""
    keys = [f.key for f in Diagnoser(_impl(_tokens_in_fours), CPU).diagnose(_case())]
    assert keys == ["wrong-slot:unwritten@tokens-not-multiple:4"]


def _padding_ends_the_batch(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                            use_triton=True, *, recipe="unfused", checked=False):
    """Padding taken to sit only at the tail: every token after the first negative slot dropped too."""
    valid = (cache_loc >= 0).to(torch.int64).cumprod(0).bool()
    _reference(k, v, k_cache, v_cache, torch.where(valid, cache_loc, -1), k_scale, v_scale, page_size, recipe=recipe,
               checked=checked)


def test_a_placement_model_a_larger_call_refutes_is_not_the_effect() -> None:
    """On (-1, 0), int64 slots read as int32 words give (-1, -1): both tokens padding, as a kernel that drops
    every token after the first padding gives. Two more tokens tell them apart: the words model is refuted,
    and the effect is the slots left unwritten."""
    found = Diagnoser(_impl(_padding_ends_the_batch), CPU).diagnose(_case(num_tokens=2, cache_loc=(-1, 0)))
    assert [f.key for f in found] == ["wrong-slot:unwritten@padding"]


def test_bytes_wrong_only_in_a_shared_buffer_join_the_one_defect_strided_caches_trigger() -> None:
    """A shared K/V buffer makes each cache a strided view: a kernel that writes nothing to a cache whose pages
    cannot be flattened fails there too, and that is the strided-cache defect, not a second one."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _attribute_shared_memory
    shared = Finding("wrong-bytes", "wrong-bytes:shared-memory", "writes wrong bytes when its tensors share a buffer")
    groups = {"wrong-slot:unwritten@strided-cache": [("a", Finding("wrong-slot", "wrong-slot:unwritten@strided-cache",
                                                                   "leaves slots unwritten"))],
              shared.key: [("b", shared)]}
    _attribute_shared_memory(groups)
    assert sorted(groups) == ["wrong-slot:unwritten@strided-cache"]


def test_inputs_wrong_only_when_k_and_v_share_a_buffer_join_the_one_strided_input_defect() -> None:
    """Held-out batch 41: a token stride taken as H x D. k and v as the halves of one buffer are strided views, so
    that failure is the strided-input defect; where no defect is triggered by strided inputs it stays its own."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _attribute_shared_memory
    host = "strides:inputs-ignored@strided-input"
    for hosts, merged in (([host], True), (["wrong-slot:unwritten@strided-cache"], False)):
        key = "wrong-bytes:inputs-shared"
        shared = Finding("wrong-bytes", key, "writes wrong bytes when k and v share memory")
        groups = {h: [("a", Finding(h.split(":")[0], h, h))] for h in hosts} | {key: [("b", shared)]}
        _attribute_shared_memory(groups)
        assert (key not in groups) is merged, sorted(groups)


def _overflow_to_zero(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                      *, recipe="unfused", checked=False):
    """An encoder whose exponent field wraps for quotients of 1024 and more: ±0 where ±448 belongs."""
    def wrapped(x, s):
        s = 1.0 if s is None else float(s)
        return torch.where((x.float() / s).abs() >= 1024, x * 0, x)
    _reference(wrapped(k, k_scale), wrapped(v, v_scale), k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
               recipe=recipe, checked=checked)


def test_zero_where_the_recipe_saturates_is_an_overflow_rule() -> None:
    big = _case(overrides=(Override("k", 1, 0x4700, "32768"), Override("k", 2, 0xC700, "-32768")))
    keys = [f.key for f in Diagnoser(_impl(_overflow_to_zero), CPU).diagnose(big)]
    assert keys == ["encoding:overflow-zero@any"], keys


def _slots_sorted_not_rows(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                           use_triton=True, *, recipe="unfused", checked=False):
    """cache_loc sorted (to group writes by page) and the rows not gathered with it: row t to the t-th slot."""
    _reference(k, v, k_cache, v_cache, cache_loc.sort(stable=True).values, k_scale, v_scale, page_size,
               recipe=recipe, checked=checked)


def test_tokens_moved_by_their_order_are_one_defect_of_the_order() -> None:
    """Slots sorted without their rows: on (0, -1) padding lands on slot 0 (a padding model fits, and two tokens
    put before refute it); on more tokens, tokens land on each other's slots. Both are whole tokens at other
    slots, which the tokens in slot order get right: one defect, triggered by the order (the padding only one way
    of making the slots unsorted: moved off slot 0, the real token still lands on the padding's place)."""
    d = Diagnoser(_impl(_slots_sorted_not_rows), CPU)
    padded = [f.key for f in d.diagnose(_case(num_tokens=2, cache_loc=(0, -1)))]
    assert padded == ["wrong-slot:tokens-moved@slots-unsorted"]
    assert [f.key for f in d.diagnose(_case(cache_loc=(9, 5, 0)))] == ["wrong-slot:tokens-moved@slots-unsorted"]


def test_encoding_defects_that_share_a_rule_are_one() -> None:
    """A NaN check that spreads over a vector's lanes writes NaN past the range in one Case, for a finite byte in
    another, and both in a third: one defect. A rule of its own (the sign of NaN) stays apart."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_encoding
    keys = ["encoding:inf-nan@any", "encoding:nan-past-448+nan-produced@any", "encoding:nan-past-448@any",
            "encoding:nan-produced@any", "encoding:nan-sign@any"]
    groups = {k: [(str(i), Finding("encoding", k, k))] for i, k in enumerate(keys)}
    groups["encoding:nan-past-448@any"].append(("x", Finding("encoding", "encoding:nan-past-448@any", "again")))
    _merge_encoding(groups)
    assert sorted(groups) == ["encoding:nan-past-448+nan-produced@any", "encoding:nan-sign@any"], sorted(groups)


def test_what_no_replay_diagnosed_joins_the_runs_one_defect() -> None:
    """A scale overwritten in place shows as wrong bytes where the tensors share a buffer (not replayed): in a
    run whose one diagnosed defect is that input modification, it is that defect's symptom."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _attribute_to_the_one_defect
    groups = {"input-modified@scale-value": [("a", Finding("input-modified", "input-modified@scale-value", "x"))],
              "wrong-bytes:shared-memory": [("b", Finding("wrong-bytes", "wrong-bytes:shared-memory", "y"))],
              "validation:accepted": [("c", Finding("validation", "validation:accepted", "z"))]}
    _attribute_to_the_one_defect(groups)
    assert sorted(groups) == ["input-modified@scale-value", "validation:accepted"], sorted(groups)


def test_what_nothing_explains_joins_the_runs_one_defect_on_the_plain_call() -> None:
    """A slot read from a tile's first token shows on the plain call; in other Cases nothing explains the bytes
    and ablations of the page size or the values made them vanish by chance: one defect."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _attribute_to_plain_call
    keys = ["wrong-slot:tokens-moved@plain", "wrong-slot:unexplained@page-size+values",
            "wrong-bytes:unexplained@scale-value", "validation:accepted"]
    groups = {k: [(str(i), Finding(k.split(":")[0], k, k))] for i, k in enumerate(keys)}
    _attribute_to_plain_call(groups)
    assert sorted(groups) == ["validation:accepted", "wrong-slot:tokens-moved@plain"], sorted(groups)


def test_one_effect_under_padding_and_under_out_of_range_alone_is_one_defect() -> None:
    """Padding and out-of-range tokens both write nothing: a kernel that carries the wrong bytes for one does
    so for the other. A padding or out-of-range rule of its own (wraps, written) stays apart."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_skipped_tokens
    keys = ["wrong-slot:unexplained@padding", "wrong-slot:unexplained@out-of-range", "padding:wraps-to-end@padding",
            "out-of-range:written@out-of-range",
            # held-out batch 26: padding and out-of-range tokens sent to slot 0 with its old bytes
            "wrong-slot:unwritten@first-slot+out-of-range", "wrong-slot:unwritten@first-slot+padding",
            # held-out batch 33: an invalid entry before a valid one; sorted, out-of-range entries go last
            "wrong-slot:tokens-moved@padding", "wrong-slot:tokens-moved@out-of-range+slots-unsorted"]
    groups = {k: [(str(i), Finding(k.split(":")[0], k, k))] for i, k in enumerate(keys)}
    _merge_skipped_tokens(groups)
    assert sorted(groups) == ["out-of-range:written@out-of-range", "padding:wraps-to-end@padding",
                              "wrong-slot:tokens-moved@padding", "wrong-slot:unexplained@padding",
                              "wrong-slot:unwritten@first-slot+padding"], sorted(groups)


def _pair_skips_after_even_padding(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                                   use_triton=True, *, recipe="unfused", checked=False):
    """Two tokens a program, and `if slot < 0: return` on the first: a padding token at an even index leaves
    the next token unwritten, wherever its slot lies."""
    old = [c.clone() for c in (k_cache, v_cache)]
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    loc = cache_loc.tolist()
    for t in range(0, len(loc) - 1, 2):
        if loc[t] < 0 and 0 <= loc[t + 1] < k_cache.shape[0] * k_cache.shape[1]:
            for cache, before in zip((k_cache, v_cache), old):
                flat, was = cache.view(-1, *cache.shape[2:]), before.view(-1, *before.shape[2:])
                flat[loc[t + 1]] = was[loc[t + 1]]


def test_a_token_left_unwritten_past_a_bound_by_chance_is_no_bound() -> None:
    """Slot 48 of four pages left unwritten, the only named slot past "pages": the bound fits, and fits again
    with more pages where the slot stays past it. Moved below the larger cache's bound, the token stays
    unwritten (its place in the batch is the cause): the slots left unwritten, under padding (batch 33)."""
    case = Case(num_tokens=4, num_heads=1, head_dim=64, page_size=16, num_pages=4, cache_loc=(1, -1, -1, 48),
                k_scale=Scale("float", 1.0), v_scale=Scale("float", 1.0), recipe="unfused")
    found = {f.key for f in Diagnoser(_impl(_pair_skips_after_even_padding), CPU).diagnose(case)}
    assert found == {"wrong-slot:unwritten@padding"}, found


def _v_rows_after_compaction(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                             use_triton=True, *, recipe="unfused", checked=False):
    """The invalid entries filtered inside the loop over K and V, the slots rebound: V's pass filters the
    compacted slots and takes rows 0..n-1, not the valid tokens' (held-out batch 33)."""
    loc = cache_loc.to(torch.int64)
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    rows_of = {}
    for name in ("k", "v"):
        keep = ((loc >= 0) & (loc < num_slots)).nonzero().squeeze(1)
        loc = loc.index_select(0, keep)
        rows_of[name] = keep
    k_rows, v_rows = k.index_select(0, rows_of["k"]), v.index_select(0, rows_of["v"])
    _reference(k_rows, v_rows, k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_a_row_from_the_wrong_token_that_differs_in_one_byte_is_placement() -> None:
    """Two tokens whose values nearly agree (e4m3 ties): V's row taken from the padding token differs in one
    subnormal byte, which a scale ignored fits. The same call with re-drawn values shows whole tokens out of
    place, and that placement explains the one byte too: the cause (batch 33's minimal Case)."""
    tie, other = 966367642, 979789415
    over = tuple(Override(t, i, other if (t, i) == ("v", 3) else tie, "e4m3-tie") for t in "kv" for i in range(4))
    case = Case(num_tokens=2, num_heads=2, head_dim=1, page_size=16, num_pages=2, cache_loc=(-1, 1),
                input_dtype="float32", k_scale=Scale("tensor1", 0.30000001192092896),
                v_scale=Scale("float", 0.30000001192092896), overrides=over, recipe="single")
    found = {f.key.split("@")[0] for f in Diagnoser(_impl(_v_rows_after_compaction, "single"), CPU).diagnose(case)}
    assert found == {"wrong-slot:tokens-moved"}, found


def _overflow_as_448(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                     recipe="unfused", checked=False, cache_dtype=None):
    """An e5m2 write whose saturation step replaces the cast's ±inf with e4m3's ±448 (0x5F/0xDF)."""
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe,
                            checked=checked, cache_dtype=cache_dtype)
    for x, cache, s in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        y = x.float() / (1.0 if s is None else float(s))
        flat = cache.view(torch.uint8).view(-1, *cache.shape[2:])
        for t, slot in enumerate(cache_loc.tolist()):
            if 0 <= slot < flat.shape[0]:
                over = y[t].abs() >= 61440  # torch's e5m2 cast rounds these to inf
                flat[slot][over] = torch.where(y[t][over] < 0, 0xDF, 0x5F).to(torch.uint8)


def test_e5m2_overflow_written_as_e4m3s_largest_value_is_named() -> None:
    """e4m3's 448 kept in an e5m2 path's saturation (batch 33): the cast's overflow written as ±448, values up to
    ±57344 right, which a clamp at 448 (saturates-low) would not leave."""
    over = [Override("k", i, bits, "") for i, bits in enumerate((0x7F80, 0xFF80, 0x4780, 0x4760))]  # ±inf, 65536
    case = _case(cache_dtype="float8_e5m2", cache_format="fp8_e5m2", input_dtype="bfloat16", overrides=tuple(over),
                 k_scale=Scale("float", 1.0), v_scale=Scale("float", 1.0))
    found = {f.key for f in Diagnoser(_impl(_overflow_as_448), CPU).diagnose(case)}
    assert {k.split("@")[0] for k in found} == {"encoding:overflow-at:448"}, found


def _bf16_through_fp16(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                       use_triton=True, *, recipe="unfused", checked=False):
    """bf16 inputs converted to fp16 first (a kernel built for fp16 only): past ±65504 they become ±inf."""
    k, v = (x.half().bfloat16() if x.dtype == torch.bfloat16 else x for x in (k, v))
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_bf16_inputs_converted_to_fp16_are_one_input_rounding_defect() -> None:
    case = _case(k_scale=Scale("tensor1", 1000.0), overrides=(Override("k", 1, 0x47C3, "99840"),))
    keys = [f.key for f in Diagnoser(_impl(_bf16_through_fp16), CPU).diagnose(case)]
    assert keys == ["input-rounded:float16@any"], keys


def test_a_raise_in_the_per_head_tests_is_classified_as_the_implementations_raise() -> None:
    """The classifier's branches that read a raise from the text (per-head, per-token-head, big caches) must
    not trip over a name another branch binds: an UnboundLocalError there was the suite's, on the H200."""
    from conformance.diagnosis.classify import classify_failure
    from conformance.harness import ConformanceFailure
    message = ("impl.py:fn: raises on a valid call:\nimpl.py:fn raised IndexError: index 5 is out of bounds\n"
               "Traceback (most recent call last): ...")
    found = classify_failure(ConformanceFailure(message), "test_per_head_scales_are_bit_exact", "test_per_head", {},
                             _impl(_reference), CPU)
    assert [f.key.split(":", 2)[:2] for f in found] == [["raises", "IndexError"]], [f.key for f in found]


def _none_scale_dynamic(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                        use_triton=True, *, recipe="unfused", checked=False):
    """A None scale made from the data, amax(|x|) / 448 (a dynamic quantizer's scale=None, carried into a
    static write where None means 1.0)."""
    def own(x, s):
        return (x.float().abs().amax() / 448.0).reshape(()) if s is None else s
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, own(k, k_scale), own(v, v_scale), page_size,
                            recipe=recipe, checked=checked)


@pytest.mark.parametrize("overrides", [
    (), (Override("k", 0, 0x7F81, "signalling NaN"), Override("k", 1, 0x7F80, "+inf")),
], ids=["ordinary", "nan-and-inf"])
def test_a_scale_made_from_the_data_is_one_defect(overrides) -> None:
    """A scale computed from the tensor's absolute maximum is one defect, also where a NaN makes every byte
    0x7F: inputs read from the poisoned bytes around a tensor give the same 0x7F, so a placement model that
    fits such a Case must also fit it with its values re-drawn."""
    case = _case(k_scale=Scale("none"), overrides=overrides)
    keys = [f.key for f in Diagnoser(_impl(_none_scale_dynamic), CPU).diagnose(case)]
    assert keys == ["scale:dynamic@scale-kind:none"], keys


def _padding_first_wins(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                        use_triton=True, *, recipe="unfused", checked=False):
    """Padding written to slot 0, the first padding token landing last (as a GPU may order racing writes)."""
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    pad = [t for t, s in enumerate(cache_loc.tolist()) if s < 0]
    for t in reversed(pad):
        naive_fp8_set_kv_buffer(k[t:t + 1], v[t:t + 1], k_cache, v_cache, torch.zeros_like(cache_loc[:1]),
                                k_scale, v_scale, page_size, recipe=recipe)


def test_padding_tokens_own_bytes_at_slot_0_are_the_padding_defect() -> None:
    """Padding tokens at slot 0 in another order than the padding model's (which racing write lands is
    undefined on a GPU) are whole tokens moved, all of them padding, all to slot 0: the padding defect."""
    from conformance.diagnosis.classify import run_case
    from conformance.diagnosis.effects import explain
    case = _case(num_tokens=4, cache_loc=(5, -1, 9, -3))
    expected, actual, error, before, _ = run_case(case, _impl(_padding_first_wins), CPU)
    moved = explain(case, expected, actual, before, lambda: build(case, CPU), placement=False)
    assert error is None and [e.key for e in moved] == ["padding:slot-0"], moved
    keys = [f.key for f in Diagnoser(_impl(_padding_first_wins), CPU).diagnose(case)]
    assert keys == ["padding:slot-0@padding"], keys


def test_what_the_h200_showed_beside_one_misread_joins_it() -> None:
    """Beside the one defect that misreads an argument's strides: what no model explains under that argument's
    layout, a view past its storage raised on a call no replay tied to a trigger, and an example that failed
    then passed (out-of-place memory changes between calls) are that defect."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import (
        _attribute_unrepeatable,
        _merge_misread_raise,
        _merge_misread_unexplained,
        _merge_storage_raise,
    )
    host = "strides:cache-page-stride@strided-cache"
    keys = [host, "wrong-bytes:unexplained@cache-layouts-differ+page-size+values", "state:unrepeatable",
            "raises:RuntimeError: setStorage: sizes [N], strides [N] are out of bounds for storage of size N",
            "raises:ValueError@heads-not-pow2"]
    groups = {k: [(str(i), Finding(k.split(":")[0], k, k))] for i, k in enumerate(keys)}
    for merge in (_merge_misread_raise, _merge_misread_unexplained, _merge_storage_raise, _attribute_unrepeatable):
        merge(groups)
    assert sorted(groups) == ["raises:ValueError@heads-not-pow2", host], sorted(groups)
    two = {k: [(k, Finding(k.split(":")[0], k, k))] for k in ("strides:other-cache@cache-layouts-differ",
                                                             "strides:inputs-ignored@strided-input",
                                                             "wrong-bytes:unexplained@cache-layouts-differ+"
                                                             "strided-input", "state:unrepeatable")}
    for merge in (_merge_misread_raise, _merge_misread_unexplained, _merge_storage_raise, _attribute_unrepeatable):
        merge(two)
    assert len(two) == 4, sorted(two)  # two hosts: nothing to choose between


def test_an_example_that_failed_then_passed_joins_a_scale_read_past_its_buffer() -> None:
    """V's [H] scale read with K's larger stride reads past its buffer, whatever memory follows: batch 51's
    report named the reading and, apart, `state:unrepeatable` for the same cause."""
    from conformance.diagnosis.report import _attribute_unrepeatable
    groups = _groups("scale:per-head-other-stride", "state:unrepeatable")
    _attribute_unrepeatable(groups)
    assert list(groups) == ["scale:per-head-other-stride"], list(groups)


def test_an_input_changed_between_calls_joins_the_one_defect_that_writes_out_of_place() -> None:
    """An input changed by an example that then passed (a stray write that lands elsewhere on the next call) was
    written: with one defect reading inputs without their strides and one writing V with K's, it is the writer's
    (an H100 corpus run)."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import ISOLATION_TEST, _attribute_unrepeatable
    writer, reader = "strides:other-cache@cache-layouts-differ", "strides:inputs-heads-ignored@strided-input"
    node = f"{ISOLATION_TEST}test_inputs_are_left_unmodified[impl]"
    groups = {writer: [("a", Finding("strides", writer, writer))], reader: [("b", Finding("strides", reader, reader))],
              "state:unrepeatable": [(node, Finding("state", "state:unrepeatable", "flaky"))]}
    _attribute_unrepeatable(groups)
    assert sorted(groups) == sorted([writer, reader]) and len(groups[writer]) == 2, groups


def test_a_reference_on_memory_an_earlier_call_corrupted_is_that_implementations_crash(monkeypatch) -> None:
    """The reference (plain torch ops) meeting an illegal address means an earlier call of the implementation
    wrote over memory the suite uses: a crash of the implementation, never `unclassified:suite`; and the worker's
    crash in that big-cache test is the same crash, not 32-bit offsets (an H100 corpus run)."""
    from conformance import harness
    from conformance.diagnosis.classify import classify_failure
    from conformance.diagnosis.report import Node, _unread
    case = _case()

    def corrupted(**_):
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(harness, "naive_fp8_set_kv_buffer", corrupted)
    with pytest.raises(harness.MemoryCorrupted) as raised:
        harness.run_reference(case, torch.device("cuda"), build(case, CPU))
    with pytest.raises(harness.SuiteError):  # on the CPU, or any other error: the suite's own
        harness.run_reference(case, CPU, build(case, CPU))
    found = classify_failure(raised.value, "test_cache_past_2_31_bytes", "test_bigcache", {}, None, None)
    assert [(f.cls, f.key) for f in found] == [("crash", "crash")], found
    node = Node("conformance/test_bigcache.py::test_cache_past_2_31_bytes[x]", findings=found)
    assert _unread(node, "worker 'gw1' crashed while running 'x'", None).key == "crash"
    alone = Node("conformance/test_bigcache.py::test_cache_past_2_31_bytes[x]")
    assert _unread(alone, "worker 'gw1' crashed while running 'x'", None).key == "big-cache:wrong-offsets@big-cache"


def test_a_probe_failure_that_passes_on_replay_is_one_finding(tmp_path, monkeypatch) -> None:
    """A capability probe's byte classes (sign of zero, encoding, outside) from a call that passes when
    replayed are one failure no replay explains, which the report can give to the run's one defect."""
    from conformance.artifacts import save_failure
    from conformance.diagnosis.classify import SAVED, Finding, classify_failure
    monkeypatch.chdir(tmp_path)
    impl = _impl(_reference)
    saved = SAVED.search(save_failure(_case(), impl, "a race", final=True)).group(1)
    exc = AssertionError("probe")
    exc.kvfp8_findings = [Finding(c, k, k, case_file=saved).to_dict() for c, k in
                          (("zero-sign", "zero-sign:minus"), ("encoding", "encoding:overflow-sign"),
                           ("outside", "outside:padding"))]
    found = classify_failure(exc, "test_capability", "capability_probes", {}, impl, CPU)
    assert [f.key for f in found] == ["unclassified:no-repro"], [f.key for f in found]


def test_one_effect_under_two_scale_kinds_is_one_defect() -> None:
    """A kernel that takes V's scale kind from K's raises, or ignores V's scale, where the kinds differ: under a
    float scale in one Case, a None one in another (held-out batch twenty-eight). One exception type, or one
    effect on one cache, is one defect; another type, or the other cache's scale, stays apart."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_scale_kinds
    details = {"scale:ignored@scale-kind:float": "v_cache, tensor1 scale", "scale:ignored@scale-kind:none":
               "v_cache, float scale", "scale:ignored@scale-kind:tensor0d": "k_cache, tensor0d scale"}
    keys = ["raises:InterpreterError@scale-kind:float", "raises:InterpreterError@scale-kind:none",
            "raises:TypeError@scale-kind:tensor0d", *details]
    groups = {k: [(str(i), Finding(k.split(":")[0], k, k, facts={"detail": details.get(k, "")}))]
              for i, k in enumerate(keys)}
    _merge_scale_kinds(groups)
    assert sorted(groups) == ["raises:InterpreterError@scale-kind:float", "raises:TypeError@scale-kind:tensor0d",
                              "scale:ignored@scale-kind:float", "scale:ignored@scale-kind:tensor0d"]


def test_one_effect_for_float16_and_for_float32_input_is_one_defect() -> None:
    """A quotient staged in a bf16 buffer whatever the input dtype double-rounds fp16 and fp32 inputs alike; each
    minimal Case names its own dtype (held-out batch forty-seven's pair). One effect, the rest of the trigger the
    same, is one defect; another effect, or another trigger beside the dtype, stays apart."""
    from conformance.diagnosis.report import _merge_input_dtypes
    groups = _groups("double-rounding:bfloat16@input-float16", "double-rounding:bfloat16@input-float32",
                     "double-rounding:float16@input-float32", "scale:ignored@input-float16",
                     "scale:ignored@input-float32+strided-input")
    _merge_input_dtypes(groups)
    assert sorted(groups) == ["double-rounding:bfloat16@input-float16", "double-rounding:float16@input-float32",
                              "scale:ignored@input-float16", "scale:ignored@input-float32+strided-input"]
    assert len(groups["double-rounding:bfloat16@input-float16"]) == 2


def _bf16(x: float) -> int:
    return int(torch.tensor(x, dtype=torch.bfloat16).view(torch.int16)) & 0xFFFF


def _scale_to_pow2(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                   recipe="unfused", checked=False):
    """Each scale rounded up to a power of two first (a UE8M0 scale's ceil, applied to a per-tensor scale), by a
    bit trick on the exponent field: a subnormal scale becomes 2**-126."""
    def up(s):
        value = 1.0 if s is None else float(s)
        return max(2.0 ** math.ceil(math.log2(value)), 2.0**-126)
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, up(k_scale), up(v_scale), page_size, recipe=recipe,
                            checked=checked)


def _e5m2_unsaturated(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                      *, recipe="unfused", checked=False):
    """e5m2 written by a cast without saturation: ±inf past 57344 where the recipe saturates."""
    from kernel.reference import quantize
    fmt = "fp8_e5m2" if k_cache.dtype == torch.float8_e5m2 else "fp8_e4m3"
    nosat = dataclasses.replace(get_recipe(recipe), overflow="nan") if fmt == "fp8_e5m2" else get_recipe(recipe)
    ps = page_size if k_cache.dim() == 4 else 1
    for x, cache, s in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        value = 1.0 if s is None else float(s)
        q = quantize(x.reshape(x.shape[0], cache.shape[-2], cache.shape[-1]), ScaleArg("float", value, None), nosat,
                     fmt)
        out = cache.view(torch.uint8)
        for t, slot in enumerate(cache_loc.tolist()):
            if 0 <= slot < cache.shape[0] * ps:
                out[slot // ps, slot % ps] = q[t]


def _or_into_old(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                 recipe="unfused", checked=False):
    """The new bytes ORed into the slot's old ones (a packed-bits store reused on a cache never zeroed)."""
    old = [c.view(torch.uint8).clone() for c in (k_cache, v_cache)]
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    for cache, before in zip((k_cache, v_cache), old):
        b = cache.view(torch.uint8)
        b.copy_(b | before)  # outside the written slots b is before: a no-op there


def _added_into_old(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                    *, recipe="unfused", checked=False):
    """The new bytes added (mod 256) to the slot's old ones (a scatter with accumulate=True)."""
    paged = [c.view(torch.uint8) if c.dim() == 4 else c.view(torch.uint8).unsqueeze(1) for c in (k_cache, v_cache)]
    old = [p.clone() for p in paged]
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    ps = page_size if k_cache.dim() == 4 else 1
    for rows, before in zip(paged, old):
        for slot in set(cache_loc.tolist()):
            if 0 <= slot < rows.shape[0] * ps:
                at = (slot // ps, slot % ps)
                rows[at] = ((rows[at].to(torch.int64) + before[at].to(torch.int64)) & 0xFF).to(torch.uint8)


def _fnuz_nan_fixed_up(byte: int):
    """An e4m3fnuz cache's NaN byte 0x80 written as `byte`: 0x7F, every NaN fixed up as e4m3fn's (+240 in fnuz;
    nothing else there is 0x80, it has no -0), or 0x00, a "no -0" sanitize run after the NaN select (held-out batch
    52: its NaN read as a sign dropped)."""
    def fixed_up(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                 recipe="unfused", checked=False, cache_dtype=None):
        _fnuz_nan_written(byte, k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe, checked,
                          cache_dtype)
    return fixed_up


def _fnuz_nan_written(byte, k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe, checked,
                      cache_dtype):
    fnuz = k_cache.dtype == torch.float8_e4m3fnuz
    scratch = [torch.zeros_like(c) for c in (k_cache, v_cache)] if fnuz else [k_cache, v_cache]
    naive_fp8_set_kv_buffer(k, v, *scratch, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked,
                            cache_dtype=cache_dtype)
    if fnuz:  # the NaN byte fixed up in a scratch copy (the same shape, contiguous), then the rows stored
        ps = page_size if k_cache.dim() == 4 else 1
        for cache, rows in zip((k_cache, v_cache), scratch):
            b = rows.view(torch.uint8)
            b.masked_fill_(b == 0x80, byte)
            paged = [t if t.dim() == 4 else t.unsqueeze(1) for t in (cache.view(torch.uint8), b)]
            for slot in cache_loc.tolist():
                if 0 <= slot < cache.shape[0] * ps:
                    paged[0][slot // ps, slot % ps] = paged[1][slot // ps, slot % ps]


@pytest.mark.parametrize("fn, changes, key", [
    (_fnuz_nan_fixed_up(0x7F), {"cache_dtype": "float8_e4m3fnuz", "cache_format": "fp8_e4m3fnuz", "recipe": "divide",
                                "overrides": (Override("v", 3, 0x7FC0, "nan"),)}, "encoding:e4m3-nan-byte@cache-fnuz"),
    (_fnuz_nan_fixed_up(0x00), {"cache_dtype": "float8_e4m3fnuz", "cache_format": "fp8_e4m3fnuz", "recipe": "divide",
                                "overrides": (Override("v", 3, 0x7FC0, "nan"),)}, "encoding:nan-lost@cache-fnuz"),
    (_scale_to_pow2, {}, "scale:power-of-two@any"),
    (_scale_to_pow2, {"v_scale": Scale("tensor1", 1e-40)}, "scale:power-of-two@any"),
    (_e5m2_unsaturated, {"cache_dtype": "float8_e5m2", "cache_format": "fp8_e5m2", "recipe": "divide",
                         "overrides": (Override("k", 1, _bf16(30000.0), "past"),)}, "encoding:overflow-inf@cache-e5m2"),
    (_or_into_old, {}, "storage:or-old@any"),
    (_added_into_old, {}, "storage:added-to-old@any"),
], ids=["fnuz-nan-as-e4m3", "fnuz-nan-as-zero", "scale-power-of-two", "subnormal-scale-power-of-two",
        "e5m2-overflow-inf", "or-old", "added-to-old"])
def test_blind_batch_eleven_and_twelve_classes_are_one_defect_each(fn, changes, key) -> None:
    """Classes the eighth session's blind batches showed (docs/results/heldout-cpu-2026-12-05-b.md)."""
    case = _case(**changes)
    keys = [f.key for f in Diagnoser(_impl(fn, case.recipe), CPU).diagnose(case)]
    assert keys == [key], keys


def _frexp_exponent(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                    *, recipe="unfused", checked=False):
    """A float scale applied as 2**-e with (m, e) = frexp(s): frexp's m lies in [0.5, 1), so that is 1/(2s) for a
    power of two (any other float goes the right way)."""
    def scaled(s):
        if isinstance(s, float) and math.frexp(s)[0] == 0.5:
            return 2 * s
        return s
    _reference(k, v, k_cache, v_cache, cache_loc, scaled(k_scale), scaled(v_scale), page_size, recipe=recipe,
               checked=checked)


def test_a_scale_exponent_off_by_one_is_named() -> None:
    """Held-out batch thirty-one's frexp kernel: the bytes are the recipe's at twice the scale."""
    case = _case(k_scale=Scale("float", 0.5), v_scale=Scale("float", 0.75))
    keys = [f.key for f in Diagnoser(_impl(_frexp_exponent), CPU).diagnose(case)]
    assert [k.split("@")[0] for k in keys] == ["scale:exponent-off-by-one"], keys


def test_what_nothing_explains_joins_the_runs_one_explained_defect_whatever_its_trigger() -> None:
    """A new class shows as its nearest model under one trigger and as nothing explained under another (bytes
    ORed into the old ones read as slots left unwritten where the old bytes were zero): one defect. A raise is
    not counted as a host, and two explained defects keep what nothing explains apart."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _attribute_unexplained

    def after(keys: list[str]) -> list[str]:
        groups = {k: [(str(i), Finding(k.split(":")[0], k, k))] for i, k in enumerate(keys)}
        _attribute_unexplained(groups)
        return sorted(groups)
    one = ["wrong-slot:unwritten@scale-value+values", "wrong-bytes:unexplained@plain", "raises:IndexError@padding",
           "validation:accepted"]
    assert after(one) == ["raises:IndexError@padding", "validation:accepted", "wrong-slot:unwritten@scale-value+values"]
    assert after(["wrong-slot:unexplained@out-of-range+padding", "wrong-slot:unexplained@padding"]) == [
        "wrong-slot:unexplained@padding"]
    exhaustive = {"wrong-bytes:unexplained@plain": "conformance/test_exhaustive.py::test_all_patterns[x]",
                  "wrong-bytes:unexplained@dim-above:128": "conformance/test_bit_exact.py::test_bit_exact[x]"}
    groups = {k: [(t, Finding("wrong-bytes", k, k))] for k, t in exhaustive.items()}
    _attribute_unexplained(groups)  # an exhaustive Case's sizes are not probed: the other one is the host
    assert sorted(groups) == ["wrong-bytes:unexplained@dim-above:128"], sorted(groups)
    two = ["scale:ignored@scale-kind:float", "wrong-slot:tokens-moved@plain", "wrong-bytes:unexplained@values"]
    assert after(two) == sorted(two)


def _chunk_rows_not_advanced(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                             use_triton=True, *, recipe="unfused", checked=False):
    """A loop over chunks of 256 tokens that advances the slots and not the rows: token t >= 256 writes the
    row of token t % 256 (the rows of the first chunk, again)."""
    rows = torch.arange(k.shape[0]) % 256
    _reference(k[rows], v[rows], k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe,
               checked=checked)


@settings(max_examples=1, deadline=None, database=None)
@given(data=st.data())
def test_the_many_tokens_row_finds_a_chunk_past_256_and_names_t(data) -> None:
    """The properties draw T <= 16 on the CPU: the many-tokens row's Case (528 tokens) shows a chunk loop's
    defect, and probing T names it (256 and fewer tokens right)."""
    from conformance.diagnosis.capabilities import MANY_TOKENS, ROWS
    row = next(r for r in ROWS if r.id == "many-tokens")
    case = row.transform(_case(), data.draw)
    assert case.num_tokens == MANY_TOKENS
    keys = [f.key for f in Diagnoser(_impl(_chunk_rows_not_advanced), CPU).diagnose(case)]
    assert len(keys) == 1 and keys[0].endswith("@tokens-above:256"), keys


def test_a_per_head_failure_no_reading_explains_joins_the_one_that_names_it() -> None:
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_per_head
    keys = ["scale:per-head", "scale:per-head-first", "validation:accepted"]
    groups = {k: [(str(i), Finding(k.split(":")[0], k, k))] for i, k in enumerate(keys)}
    _merge_per_head(groups)
    assert sorted(groups) == ["scale:per-head-first", "validation:accepted"], sorted(groups)


def test_an_exhaustive_tests_trigger_without_sizes_joins_the_same_effect_under_a_size_rule() -> None:
    """An exhaustive test's Case keeps its shape (its values fill it): no size of it is probed, so its trigger
    lacks the size rule the properties' Cases found (D above 128). Not the narrower trigger: the same defect."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_narrower
    tests = {"wrong-bytes:unexplained@plain": "conformance/test_exhaustive.py::test_all_patterns[x]",
             "wrong-bytes:unexplained@dim-above:128": "conformance/test_bit_exact.py::test_bit_exact[x]"}
    groups = {k: [(t, Finding("wrong-bytes", k, k))] for k, t in tests.items()}
    _merge_narrower(groups)
    assert sorted(groups) == ["wrong-bytes:unexplained@dim-above:128"], sorted(groups)


def _bound_pages_band_zero(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                           use_triton=True, *, recipe="unfused", checked=False):
    """Two defects: the slot bound read as the number of pages (slots past it skipped), and quotients below
    2**-9 (which round to e4m3's smallest subnormal) written as zero."""
    loc = torch.where(cache_loc >= k_cache.shape[0], torch.full_like(cache_loc, -1), cache_loc)

    def band(x, s):
        y = x.float() / (s.float() if isinstance(s, torch.Tensor) else 1.0 if s is None else float(s))
        return torch.where(y.abs() < 2.0**-9, x * 0, x)
    _reference(band(k, k_scale), band(v, v_scale), k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe=recipe,
               checked=checked)


def test_two_defects_each_keep_their_own_trigger() -> None:
    """The value defect touches one band of values: ablated variants that hold none of them pass by chance, and
    re-drawn calls with more tokens show the bound defect too. Neither is evidence: the value defect is @any,
    and the bound is confirmed with ordinary values in its added token. The band, one subnormal step, is a
    wrong subnormal path (one ulp off too, the wider class it is tried before)."""
    case = _case(recipe="divide", page_size=4, num_pages=3, cache_loc=(5, 0, 9), k_scale=Scale("tensor1", 1.0),
                 v_scale=Scale("tensor1", 1.0))
    keys = [f.key for f in Diagnoser(_impl(_bound_pages_band_zero, "divide"), CPU).diagnose(case)]
    assert keys == ["out-of-range:wrong-bound@plain", "subnormal-path@any"], keys


def test_defects_on_the_plain_call_are_one() -> None:
    """A slot split with the wrong page size (the number of pages read as the page size) moves some tokens,
    leaves some slots unwritten, skips slots past a bound and raises for others, each on the plain call: one
    defect, under the model most findings show. A graph defect and a value effect stay apart."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_plain_call
    counts = {"wrong-slot:tokens-moved@plain": 1, "wrong-slot:unexplained@plain": 1, "wrong-slot:unwritten@plain": 3,
              "raises:IndexError@plain": 2, "out-of-range:wrong-bound@plain": 2, "graph:sync@plain": 1,
              "flush-to-zero@any": 1}
    groups = {k: [(f"{k}{i}", Finding(class_of(k), k, k)) for i in range(n)] for k, n in counts.items()}
    _merge_plain_call(groups)
    assert sorted(groups) == ["flush-to-zero@any", "graph:sync@plain", "out-of-range:wrong-bound@plain"], sorted(groups)


def _scaled_twice(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                  recipe="unfused", checked=False):
    """The inputs divided by their scale before a write that divides again (x / s / s)."""
    def once(x, s):
        return x if s is None else x.float() / (s.float() if isinstance(s, torch.Tensor) else float(s))
    _reference(once(k, k_scale), once(v, v_scale), k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
               recipe="divide", checked=checked)


def test_a_scale_applied_twice_is_named() -> None:
    case = _case(recipe="divide", k_scale=Scale("tensor1", 0.3), v_scale=Scale("tensor1", 0.3))
    keys = [f.key for f in Diagnoser(_impl(_scaled_twice, "divide"), CPU).diagnose(case)]
    assert keys == ["scale:applied-twice@any"], keys


def _fp16_zero_as_2_15(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                       *, recipe="unfused", checked=False):
    """float16 zeros widened as 2**-15 (a bit trick without the exponent-0 case)."""
    def widened(x):
        return torch.where(x == 0, torch.full_like(x, 2**-15), x) if x.dtype == torch.float16 else x
    _reference(widened(k), widened(v), k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe,
               checked=checked)


def test_rows_made_alike_by_a_value_defect_are_not_tokens_moved() -> None:
    """K's token 0 all zeros, token 1 all ones, k_scale 1e-30: every K byte the defect writes is 448, so token 1's
    bytes sit at token 0's slot, which fits "tokens moved"; the same call at ordinary scales passes, which no
    misplaced write does."""
    bits = lambda x: int(torch.tensor(x, dtype=torch.float16).view(torch.int16)) & 0xFFFF  # noqa: E731
    rows = tuple(Override("k", i, bits(0.0 if i < 8 else 1.0), "row") for i in range(16)) + \
        tuple(Override("v", i, bits(1.0), "row") for i in range(16))
    case = Case(num_tokens=2, num_heads=1, head_dim=8, page_size=16, num_pages=1, cache_loc=(0, 1),
                input_dtype="float16", k_scale=Scale("tensor1", 1e-30), v_scale=Scale("tensor1", 1.0),
                overrides=rows, recipe="unfused")
    found = {f.key for f in Diagnoser(_impl(_fp16_zero_as_2_15), CPU).diagnose(case)}
    assert found and not any(k.startswith("wrong-slot:tokens-moved") for k in found), found


def test_asking_only_some_value_models_answers_as_the_whole_reading_does() -> None:
    """The corroboration asks whether its keys fit a re-drawn call again (effects.explain's `only`): the keys it
    asks about that fit are those the whole reading names, and a key that fits nowhere leaves the whole reading."""
    from conformance.diagnosis.effects import explain

    d = Diagnoser(_impl(_flush_and_pad), CPU)
    for case in (_case(cache_loc=(5, 2, 9)), _case(cache_loc=(1, 3, 2), seed=8, num_tokens=3)):
        r = d.replay(case)
        whole = explain(case, r.expected, r.actual, r.before, d._fresh(case))
        named = {k for e in whole for k in (e.key, *e.alternatives)}
        assert "flush-to-zero" in named, named
        for asked in ({"flush-to-zero"}, {"flush-to-zero", "scale:inverted"}, {"scale:inverted"}):
            some = explain(case, r.expected, r.actual, r.before, d._fresh(case), only=frozenset(asked))
            answered = {k for e in some for k in (e.key, *e.alternatives)}
            assert answered & asked == named & asked, (asked, answered, named)
        nothing = explain(case, r.expected, r.actual, r.before, d._fresh(case), only=frozenset({"scale:inverted"}))
        assert [(e.key, e.alternatives) for e in nothing] == [(e.key, e.alternatives) for e in whole]


def _v_heads_from_k(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                    *, recipe="unfused", checked=False):
    """A head-tiled write whose second tile of V takes K's base: V's heads from 2 on hold K's values."""
    v = v.clone()
    if v.dim() == 3:
        v[:, 2:] = k[:, 2:]
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


@pytest.mark.parametrize("heads", [4, 8])
def test_a_misread_argument_on_some_heads_is_that_misread_there(heads: int) -> None:
    """One placement model on some heads, the reference's bytes on the rest, is named by that model (of the
    models that fit so, the one fewest heads contradict: K and V swapped fits V's heads too, and every head of
    K's cache is against it), and says which heads."""
    [found] = Diagnoser(_impl(_v_heads_from_k), CPU).diagnose(_case(num_heads=heads))
    assert found.key == "kv-mixed:k-for-v@plain", found
    assert "some heads" in found.title, found
    assert f"v_cache only on heads {', '.join(map(str, range(2, heads)))} (" in found.facts["detail"], found


def _edge_slot_skipped(first: bool):
    def write(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
              recipe="unfused", checked=False):
        n = k_cache.shape[0] * (page_size if k_cache.dim() == 4 else 1)
        skipped = torch.where(cache_loc == (0 if first else n - 1), torch.full_like(cache_loc, -1), cache_loc)
        _reference(k, v, k_cache, v_cache, skipped, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    write.__name__ = f"_{'first' if first else 'last'}_slot_skipped"
    return write


@pytest.mark.parametrize("first", [True, False])
def test_a_bound_off_by_one_at_either_end_of_the_cache_is_that_slot_unwritten(first: bool) -> None:
    """`cache_loc > 0` for `>= 0` (slot 0 taken for SGLang's padding slot) and `< n - 1` for `< n` leave one slot
    unwritten: keyed by the end it is at, not by the plain call, a page size (which moves the last slot) or a
    bound on the number of slots (which a single slot past it fits)."""
    case = _case(page_size=4, num_pages=3, cache_loc=(5, 0 if first else 11, 9))
    found = {f.key for f in Diagnoser(_impl(_edge_slot_skipped(first)), CPU).diagnose(case)}
    assert found == {f"wrong-slot:unwritten@{'first' if first else 'last'}-slot"}, found


def _page_written_back(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                       *, recipe="unfused", checked=False):
    """Each token stages its whole page as it was before the call, patches its row and stores the page back: of
    the tokens of one page, the last one's row alone lands."""
    old = [c.clone() for c in (k_cache, v_cache)]
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    if k_cache.dim() != 4:
        return
    last = {int(s) // page_size: int(s) for s in cache_loc.tolist() if 0 <= s < k_cache.shape[0] * page_size}
    for cache, before in zip((k_cache, v_cache), old):
        for s in cache_loc.tolist():
            if 0 <= s < cache.shape[0] * page_size and last[s // page_size] != s:
                cache[s // page_size, s % page_size] = before[s // page_size, s % page_size]


def test_rows_lost_where_tokens_share_a_page_are_keyed_by_the_sharing() -> None:
    """A page written back whole by each of its tokens loses all but one row: slots left unwritten only when
    several tokens write one page (one token alone, or each on a page of its own, is right)."""
    from conformance.diagnosis.ablation import BY_NAME
    # tokens sharing one slot share its page too: that is duplicate-slots' dimension, not this one's
    assert not list(BY_NAME["shared-page"].variants(_case(page_size=4, cache_loc=(5, 5, 9)), "tensor1"))
    d = Diagnoser(_impl(_page_written_back), CPU)
    for locs in ((5, 4, 9), (1, 2, 3)):
        found = {f.key for f in d.diagnose(_case(page_size=4, num_pages=3, cache_loc=locs))}
        assert found == {"wrong-slot:unwritten@shared-page"}, (locs, found)


def test_a_cache_of_one_slot_is_both_ends_and_keeps_the_other() -> None:
    """A minimal Case may shrink the cache to one slot, both its first and its last: each end's ablation keeps the
    other end named, so a last slot left unwritten is `@last-slot`, not the page size that made the slot last."""
    case = _case(num_tokens=1, page_size=1, num_pages=1, cache_loc=(0,))
    for first in (True, False):
        found = {f.key for f in Diagnoser(_impl(_edge_slot_skipped(first)), CPU).diagnose(case)}
        assert found == {f"wrong-slot:unwritten@{'first' if first else 'last'}-slot"}, (first, found)


def test_what_nothing_explains_at_some_values_joins_the_one_value_defect_on_every_input() -> None:
    """An input narrowed to fp16 first, at a scale of 1e-40: a value flushed to 0 times 1/s = inf is NaN where the
    recipe saturates, which no model reads; under value dimensions alone, it is the run's one value defect on
    every input (a pair's other defect, out of place, does not count). Two such value defects: no host."""
    from conformance.diagnosis.report import _merge_value_trigger

    one = _groups("input-rounded:float16@any", "wrong-bytes:unexplained@scale-value+values",
                 "wrong-slot:unwritten@last-slot")
    _merge_value_trigger(one)
    assert sorted(one) == ["input-rounded:float16@any", "wrong-slot:unwritten@last-slot"], sorted(one)
    two = _groups("flush-to-zero@any", "rounds-toward-zero@any", "wrong-bytes:unexplained@values")
    _merge_value_trigger(two)
    assert "wrong-bytes:unexplained@values" in two, sorted(two)


def test_an_input_clamped_to_the_range_before_the_scale_is_named() -> None:
    """Past ±448, with a scale above 1, x/s is ±448/s where the recipe saturates at ±448 (and ±inf likewise)."""
    for bits, label in ((0x447A, "1000"), (0x7F80, "inf")):
        case = _case(recipe="divide", k_scale=Scale("tensor1", 4.0), overrides=(Override("k", 1, bits, label),))
        found = {f.key for f in Diagnoser(_impl(_clamped_before_dividing, "divide"), CPU).diagnose(case)}
        assert found == {"input-clamped@any"}, (label, found)


def _inf_clamped_to_dtype_max(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                              use_triton=True, *, recipe="divide", checked=False):
    """Clamps each input to its dtype's largest finite value first (an inf guard): only ±inf changes."""
    top = torch.finfo(k.dtype).max
    _reference(k.clamp(-top, top), v.clamp(-top, top), k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
               recipe=recipe, checked=checked)


def test_an_inf_clamped_to_the_input_dtypes_largest_value_is_named() -> None:
    """fp16's 65504 / 200 is 327.5, inside e4m3's range: inf is written 320 where the recipe saturates at 448.
    Every differing byte is also the format's one value below 448 that it reaches: `saturates-low` fit it too,
    before this model existed (a held-out kernel's report). A bf16 input's largest value saturates like inf, so
    the trigger is the fp16 input."""
    case = _case(recipe="divide", input_dtype="float16", k_scale=Scale("tensor1", 200.0),
                 overrides=(Override("k", 1, 0x7C00, "inf"), Override("k", 2, 0xFC00, "-inf")))
    found = {f.key for f in Diagnoser(_impl(_inf_clamped_to_dtype_max, "divide"), CPU).diagnose(case)}
    assert found == {"input-clamped:dtype-max@input-float16"}, found


def _nan_to_num_first(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                      use_triton=True, *, recipe="divide", checked=False):
    """`torch.nan_to_num` on the widened inputs first (a guard against NaN activations): NaN -> 0, and, its
    default, ±inf -> ±fp32's largest value."""
    _reference(torch.nan_to_num(k.float()), torch.nan_to_num(v.float()), k_cache, v_cache, cache_loc, k_scale,
               v_scale, page_size, recipe=recipe, checked=checked)


def test_nan_to_num_before_the_scale_is_one_defect() -> None:
    """A fresh check kernel of the thirtieth session: both of `torch.nan_to_num`'s rules in one Case are one
    model (before it, nothing explained such a Case), and either rule seen alone beside another is that defect."""
    from conformance.diagnosis.report import _merge_nan_to_num
    case = _case(recipe="divide", k_scale=Scale("tensor1", 1e38),
                 overrides=(Override("k", 1, 0x7FC0, "nan"), Override("k", 2, 0x7F80, "inf")))
    found = _groups(*{f.key for f in Diagnoser(_impl(_nan_to_num_first, "divide"), CPU).diagnose(case)})
    assert any(k.startswith("input-clamped:nan-to-num") for k in found), sorted(found)
    _merge_nan_to_num(found)
    assert [k.split("@")[0] for k in found] == ["input-clamped:nan-to-num"], sorted(found)
    groups = _groups("encoding:nan-lost@any", "input-clamped:dtype-max@any", "input-clamped:nan-to-num@any",
                     "wrong-slot:unwritten@last-slot")
    _merge_nan_to_num(groups)
    assert sorted(groups) == ["input-clamped:nan-to-num@any", "wrong-slot:unwritten@last-slot"], sorted(groups)
    groups = _groups("encoding:nan-lost@any", "input-clamped:dtype-max@input-float16")
    _merge_nan_to_num(groups)
    assert sorted(groups) == ["input-clamped:dtype-max@input-float16"], sorted(groups)
    alone = _groups("encoding:nan-lost@any", "rounds-toward-zero@any")
    _merge_nan_to_num(alone)
    assert sorted(alone) == ["encoding:nan-lost@any", "rounds-toward-zero@any"], sorted(alone)


def _k_cache_head_stride_from_input(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                                    use_triton=True, *, recipe="unfused", checked=False):
    """K's cache addressed with K's input head stride (one stride argument passed for both); bytes that land
    past the cache's storage are dropped."""
    scratch = torch.zeros(k_cache.shape, dtype=k_cache.dtype)
    naive_fp8_set_kv_buffer(k, v, scratch, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe)
    flat = torch.tensor([], dtype=torch.uint8).set_(k_cache.untyped_storage())
    strides = list(k_cache.stride())
    strides[-2] = k.stride(1) if k.dim() == 3 else k.stride(1) * k_cache.shape[-1]
    rows = scratch.view(torch.uint8).reshape(-1, *k_cache.shape[-2:])
    size = page_size if k_cache.dim() == 4 else 1
    heads, dims = torch.meshgrid(torch.arange(k_cache.shape[-2]), torch.arange(k_cache.shape[-1]), indexing="ij")
    for slot in cache_loc.tolist():
        if 0 <= slot < rows.shape[0]:
            outer = (slot // size) * strides[0] + (slot % size) * strides[1] if size > 1 else slot * strides[0]
            at = k_cache.storage_offset() + outer + heads * strides[-2] + dims * strides[-1]
            ok = at < flat.numel()
            flat[at[ok]] = rows[slot][ok]


def test_a_cache_addressed_with_its_inputs_stride_is_one_defect_under_either_layout() -> None:
    """Seen in a held-out pair: K's cache head stride taken from K's input. It fails with a strided input (the
    cache's heads land at the input's stride) and with a strided cache (the contiguous input's stride is the one
    computed from the shape); no ablation names the either-or, so the two keys are joined in the report."""
    from conformance.diagnosis.report import _merge_stride_source
    impl = _impl(_k_cache_head_stride_from_input)
    strided_input = {f.key for f in Diagnoser(impl, CPU).diagnose(_case(k_layout=_DIM_PADDED))}
    assert strided_input == {"strides:cache-from-input@strided-input"}, strided_input
    strided_cache = {f.key for f in Diagnoser(impl, CPU).diagnose(
        _case(k_cache_layout=Layout((0, 1, 2, 3), (0, 0, 0, 4))))}
    assert len(strided_cache) == 1 and next(iter(strided_cache)).endswith("@strided-cache"), strided_cache
    groups = _groups(*strided_input, *strided_cache)
    _merge_stride_source(groups)
    assert sorted(groups) == ["strides:cache-from-input@strided-input"], sorted(groups)


def _loc_words_read(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                    *, recipe="unfused", checked=False):
    """An int64 cache_loc read through an int32 pointer: token t takes the t-th 32-bit word."""
    loc = cache_loc.contiguous().view(torch.int32)[:cache_loc.numel()].long() if cache_loc.dtype == torch.int64 \
        else cache_loc
    _reference(k, v, k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_a_lone_padding_token_read_as_its_low_word_is_the_int32_words_misread() -> None:
    """A minimal Case of one padding token of -2**63 writes slot 0 (its low word): the same misread as the plain
    call's tokens on each other's slots, not tokens moved of their own."""
    d = Diagnoser(_impl(_loc_words_read), CPU)
    lone = {f.key.split("@")[0] for f in d.diagnose(_case(num_tokens=1, cache_loc=(-2**63,)))}
    assert lone == {"wrong-slot:loc-int32-words"}, lone
    assert {f.key for f in d.diagnose(_case())} == {"wrong-slot:loc-int32-words@many-tokens"}


def test_what_nothing_explains_under_a_shape_of_its_own_is_a_defect_of_its_own() -> None:
    """The run's one explained defect takes what nothing explains (a new class reads as its nearest model under
    one trigger and as nothing under another), but not where both are triggered by the call's shape and share
    no dimension of it: held-out batch eighteen's pair, offsets masked for a power-of-two page size and a head
    tiled by 128 that reloads its first tile, read as one defect."""
    from conformance.diagnosis.report import _attribute_unexplained

    apart = _groups("wrong-slot:tokens-moved@page-size", "wrong-bytes:unexplained@dim-above:128")
    _attribute_unexplained(apart)
    assert sorted(apart) == ["wrong-bytes:unexplained@dim-above:128", "wrong-slot:tokens-moved@page-size"]
    for unexplained in ("wrong-bytes:unexplained@page-size+dim-above:128", "wrong-bytes:unexplained@values",
                        "wrong-bytes:unexplained@plain"):
        joined = _groups("wrong-slot:tokens-moved@page-size", unexplained)
        _attribute_unexplained(joined)
        assert sorted(joined) == ["wrong-slot:tokens-moved@page-size"], (unexplained, sorted(joined))


def test_what_nothing_explains_under_a_bound_on_d_joins_the_one_defect_under_a_bound_on_h() -> None:
    """Held-out batch 40: a head loop over groups of 256 // pow2(D) heads fails above H = 4 at D = 64 and above
    D = 64 at H = 3: bounds on H and on D of one tile are one shape dimension, so what nothing explains under one
    joins the run's one defect under the other."""
    from conformance.diagnosis.report import _attribute_unexplained

    host = "strides:inputs-heads-ignored@heads-above:4+strided-input"
    joined = _groups(host, "wrong-bytes:unexplained@dim-above:64")
    _attribute_unexplained(joined)
    assert sorted(joined) == [host]


def test_what_nothing_explains_beside_several_defects_goes_to_the_one_sharing_its_shape() -> None:
    """Held-out batch thirty's pair: a recipe of e5m2 caches alone and a NaN sign of fp8 caches; an e5m2 fp8 cache
    at a tiny scale shows both, which nothing explains. It goes under the defect whose trigger shares its e5m2
    cache; sharing no shape dimension with any, or as many with two, it stays a defect of its own."""
    from conformance.diagnosis.report import _attribute_unexplained

    pair = _groups("rounding:single@cache-e5m2+cache-uint8", "encoding:nan-sign@any",
                  "wrong-bytes:unexplained@cache-e5m2+scale-value")
    _attribute_unexplained(pair)
    assert sorted(pair) == ["encoding:nan-sign@any", "rounding:single@cache-e5m2+cache-uint8"], sorted(pair)
    for alone in ("wrong-slot:unexplained@cache-e5m2+values", "wrong-bytes:unexplained@strided-input"):
        apart = _groups("strides:cache-inner-stride@strided-cache", "rounding:single@cache-uint8", alone)
        _attribute_unexplained(apart)
        assert alone in apart, (alone, sorted(apart))
    tied = _groups("rounding:single@cache-e5m2", "zero-sign:plus@cache-e5m2", "wrong-bytes:unexplained@cache-e5m2")
    _attribute_unexplained(tied)
    assert "wrong-bytes:unexplained@cache-e5m2" in tied, sorted(tied)


def _skipped_zero_slot_0(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                         use_triton=True, *, recipe="unfused", checked=False):
    """Tokens that write nothing store zeros at slot 0 (an unpredicated store of `where(valid, q, 0)`)."""
    n = k_cache.shape[0] * (page_size if k_cache.dim() == 4 else 1)
    skip = (cache_loc < 0) | (cache_loc >= n)
    k, v = k.clone(), v.clone()
    k[skip], v[skip] = 0, 0
    _reference(k, v, k_cache, v_cache, torch.where(skip, 0, cache_loc), k_scale, v_scale, page_size, recipe=recipe)


def test_tokens_that_write_nothing_zeroing_slot_0_are_named() -> None:
    """Held-out batch thirty's SGLang Triton write: padding rows sent to a dummy slot 0 with an unpredicated store
    of zeros. Before the model, the tile model of rows past the batch stored as zeros at slot 0 fit it."""
    case = _case(cache_loc=(5, -1, 9))
    found = [f.key for f in Diagnoser(_impl(_skipped_zero_slot_0), CPU).diagnose(case)]
    assert found == ["wrong-slot:slot-0-zeroed@padding"], found


def _e5m2_inf_kept(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                   recipe="unfused", checked=False, cache_dtype=None):
    """e5m2 with infinite quotients kept as ±inf (0x7C, 0xFC), finite overflow saturated."""
    from kernel.plan import make_plan
    from kernel.reference import scaled
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe)
    plan = make_plan(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe)
    for x, cache, scale in ((k, k_cache, plan.k_scale), (v, v_cache, plan.v_scale)):
        if cache.dtype != torch.float8_e5m2:  # e4m3 has no inf: its path is right
            continue
        y = scaled(x, scale, plan.recipe)
        rows = cache.view(torch.uint8).view(-1, *cache.shape[-2:])
        for t, slot in enumerate(cache_loc.tolist()):
            if 0 <= slot < rows.shape[0]:
                inf = y[t].isinf()
                rows[slot][inf] = torch.where(y[t][inf] < 0, 0xFC, 0x7C).to(torch.uint8)


def test_an_infinite_quotient_kept_as_e5m2_inf_is_named() -> None:
    """Held-out batch thirty's vLLM Triton write kept e5m2's inf for an infinite quotient and saturated finite
    overflow; 0x7C is one step past 0x7B, so approximate-division read it before the model. A Case whose only
    overflow is infinite cannot tell it from a cast without saturation (encoding:overflow-inf, tried first)."""
    case = _case(recipe="divide", cache_dtype="float8_e5m2", cache_format="fp8_e5m2", k_scale=Scale("tensor1", 1.0),
                 overrides=(Override("k", 1, 0x7F80, "inf"), Override("k", 2, 0xFF80, "-inf"),
                            Override("k", 3, 0x476A, "59904")))  # a finite quotient past 57344, saturated
    found = [f.key for f in Diagnoser(_impl(_e5m2_inf_kept, "divide"), CPU).diagnose(case)]
    assert [k.split("@")[0] for k in found] == ["encoding:inf-kept"], found


def _e5m2_top_finite(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                     *, recipe="unfused", checked=False, cache_dtype=None):
    """e5m2 rounded on through its reserved top exponent, as if finite (65536, 81920, 98304 at 0x7C..0x7E), and
    saturated at 98304: a largest value derived by e4m3fn's rule (held-out batch 36)."""
    from kernel.plan import make_plan
    from kernel.reference import scaled
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe)
    plan = make_plan(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe)
    for x, cache, scale in ((k, k_cache, plan.k_scale), (v, v_cache, plan.v_scale)):
        if cache.dtype != torch.float8_e5m2:
            continue
        y = scaled(x, scale, plan.recipe)
        mag = y.abs()  # ties at 73728 and 90112 go to the even mantissa: 0x7C and 0x7E
        top = torch.where(mag <= 73728, 0x7C, torch.where(mag < 90112, 0x7D, 0x7E)) | torch.signbit(y) * 0x80
        rows = cache.view(torch.uint8).view(-1, *cache.shape[-2:])
        for t, slot in enumerate(cache_loc.tolist()):
            if 0 <= slot < rows.shape[0]:
                past = mag[t] >= 61440
                rows[slot][past] = top[t][past].to(torch.uint8)


def test_e5m2_rounded_onto_its_reserved_exponent_is_named() -> None:
    case = _case(recipe="divide", cache_dtype="float8_e5m2", cache_format="fp8_e5m2", k_scale=Scale("tensor1", 1.0),
                 overrides=(Override("k", 1, 0x4770, "61440"), Override("k", 2, 0x479C, "79872"),
                            Override("k", 3, 0xC7C3, "-99840"), Override("k", 4, 0x7F80, "inf")))
    found = [f.key for f in Diagnoser(_impl(_e5m2_top_finite, "divide"), CPU).diagnose(case)]
    assert [k.split("@")[0] for k in found] == ["encoding:e5m2-top-exponent-finite"], found


def _wraps_written_first(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                         use_triton=True, *, recipe="unfused", checked=False):
    """Out-of-range slots wrapped modulo the number of slots, those tokens written before the in-range ones: where a
    wrapped token and a real one share a slot, the real one lands (the reference's one order lands the later)."""
    slots = k_cache.shape[0] * (page_size if k_cache.dim() == 4 else 1)
    wrapped = torch.where(cache_loc >= slots, cache_loc % slots, torch.full_like(cache_loc, -1))
    for loc in (wrapped, torch.where(cache_loc >= slots, torch.full_like(cache_loc, -1), cache_loc)):
        _reference(k, v, k_cache, v_cache, loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_tokens_a_slot_model_sends_to_one_slot_may_land_in_any_order() -> None:
    """On a GPU which of several writes to one byte lands is undefined: a wrapped out-of-range token and the real
    token of its slot race. The wrap model holds whichever lands (seen on an H100, where it read as tokens moved
    and as what no model explains)."""
    case = _case(num_tokens=5, cache_loc=(1, 13, 6, 2, 20), num_pages=3)  # 13 wraps to a real token's slot, 20 to 8
    d = Diagnoser(_impl(_wraps_written_first), CPU)
    assert [e.key for e in d.effects(case, "placement")] == ["out-of-range:written"]  # the Case itself, not minimized
    found = {f.key for f in d.diagnose(case)}
    assert found == {"out-of-range:written@out-of-range"}, found


def _rows_from_zero_past_2(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                           use_triton=True, *, recipe="divide", checked=False):
    """Token t >= 2 quantized from row t % 2: past two tokens, whole tokens' bytes at other tokens' slots."""
    rows = torch.arange(k.shape[0], device=k.device) % 2
    _reference(k[rows], v[rows], k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe,
               checked=checked)


def test_one_effect_under_two_symptoms_has_the_trigger_that_makes_the_whole_failure_vanish() -> None:
    """At a v_scale of 1e38 every V byte is ±0, so V's rows moved differ in their signs alone: a sign symptom,
    which an ordinary scale turns into moved values, the failure kept. Its ablation trigger (the scale) is not the
    effect's; the number of tokens is (seen on an H100 for rows chunked from zero past 256 tokens)."""
    case = Case(num_tokens=4, num_heads=1, head_dim=16, page_size=4, num_pages=2, cache_loc=(0, 1, 2, 3),
                input_dtype="float16", k_scale=Scale("tensor1", 1.0), v_scale=Scale("tensor1", 1e38), recipe="divide",
                seed=5)
    found = {f.key for f in Diagnoser(_impl(_rows_from_zero_past_2, "divide"), CPU).diagnose(case)}
    assert len(found) == 1 and next(iter(found)).startswith("wrong-slot:tokens-moved@"), found
    assert "scale-value" not in next(iter(found)), found


def _last_head_skipped(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                       use_triton=True, *, recipe="unfused", checked=False):
    """A head loop that stops one short: the last head of every written slot keeps its old bytes."""
    old = [c.view(torch.uint8)[..., -1, :].clone() for c in (k_cache, v_cache)]
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    for c, o in zip((k_cache, v_cache), old):
        c.view(torch.uint8)[..., -1, :] = o


def test_what_stays_unwritten_is_said_by_slots_heads_and_dims() -> None:
    found = Diagnoser(_impl(_last_head_skipped), CPU).diagnose(_case(num_heads=3))
    assert [f.key.split("@")[0] for f in found] == ["wrong-slot:unwritten"], [f.key for f in found]
    m = re.fullmatch(r"unwritten: head (\d+) of (\d+)", found[0].facts["detail"])  # of the minimal Case's heads
    assert m and int(m[1]) == int(m[2]) - 1, found[0].facts["detail"]


def _ties_away(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True):
    """SGLang's convention, recipe single, but each e4m3 tie rounded away from zero (an encoder's floor(t + 0.5))."""
    keep = cache_loc >= 0
    for x, cache, s in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        y = x.reshape(x.shape[0], *cache.shape[-2:]).float() * (1.0 / torch.tensor(1.0 if s is None else float(s)))
        q = y.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
        mag = q & 0x7F
        lo, hi = (m.view(torch.float8_e4m3fn).float() for m in (mag, (mag + 1).clamp(max=0x7E)))
        q = torch.where((mag < 0x7E) & (y.abs() * 2 == lo + hi), q + 1, q)  # the tie's upper neighbour
        q = torch.where(y.isnan(), torch.full_like(q, 0x7F), q)
        c = cache.view(torch.uint8)
        c = c if c.dim() == 4 else c.unsqueeze(1)
        c[cache_loc[keep] // c.shape[1], cache_loc[keep] % c.shape[1]] = q[keep]


def test_the_identification_names_ties_rounded_away_from_zero() -> None:
    from conformance.conventions import SGLANG
    from conformance.diagnosis.identification import identify_robustly, sweep_points
    impl = Implementation("ties-away", _ties_away, {}, convention=SGLANG)
    recipe, note = identify_robustly(impl, sweep_points(["bfloat16"], full=False, convention=SGLANG), CPU)
    assert recipe == "single" and "class: ties rounded away from zero" in note, note


def _inputs_flushed(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True):
    """SGLang's convention on the CPU (unfused-tensor1: x / [1]-tensor scale), but subnormal inputs set to +0 first
    (held-out batch 50's `x.abs() < tiny` flush): at a tiny scale they should have saturated, and -0 loses its sign."""
    keep = cache_loc >= 0
    for x, cache, s in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        x = x.reshape(x.shape[0], *cache.shape[-2:])
        x = torch.where(x.abs() < torch.finfo(x.dtype).tiny, torch.zeros_like(x), x)
        scale = torch.tensor([1.0 if s is None else float(s)], dtype=torch.float32)
        y = x.clone().div_(scale).float()  # k.div_(scale): the quotient rounded to k's dtype first
        q = y.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
        q = torch.where(y.isnan(), torch.full_like(q, 0x7F), q)
        c = cache.view(torch.uint8)
        c = c if c.dim() == 4 else c.unsqueeze(1)
        c[cache_loc[keep] // c.shape[1], cache_loc[keep] % c.shape[1]] = q[keep]


def test_the_identification_names_subnormal_inputs_read_as_zero() -> None:
    """The flush fits no rounding class, and the zero-sign rule alone explains it against `unfused` (whose 1/s is
    inf at the tiniest scale): the recipe held is the one the bytes fit as an input flush."""
    from conformance.conventions import SGLANG
    from conformance.diagnosis.identification import identify_robustly, sweep_points
    impl = Implementation("inputs-flushed", _inputs_flushed, {}, convention=SGLANG)
    recipe, note = identify_robustly(impl, sweep_points(["bfloat16", "float16"], full=False, convention=SGLANG), CPU)
    assert recipe == "unfused-tensor1" and "class: subnormal inputs read as zero" in note, note


def _sticky_dropped(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True):
    """SGLang's convention, recipe single, but every quotient past a halfway point rounded as that tie, to even
    (an encoder that drops its sticky bits): one step low where nearest-even went up to an odd magnitude."""
    keep = cache_loc >= 0
    for x, cache, s in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        y = x.reshape(x.shape[0], *cache.shape[-2:]).float() * (1.0 / torch.tensor(1.0 if s is None else float(s)))
        q = y.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
        mag = q & 0x7F
        lo, hi = (m.view(torch.float8_e4m3fn).float() for m in ((mag.to(torch.int16) - 1).clamp(min=0).to(torch.uint8),
                                                                 mag))
        past = (mag > 0) & (mag < 0x7F) & (y.abs() * 2 > lo + hi) & (y.abs() < hi) & (mag % 2 == 1)
        q = torch.where(past, q - 1, q)
        q = torch.where(y.isnan(), torch.full_like(q, 0x7F), q)
        c = cache.view(torch.uint8)
        c = c if c.dim() == 4 else c.unsqueeze(1)
        c[cache_loc[keep] // c.shape[1], cache_loc[keep] % c.shape[1]] = q[keep]


def test_rounding_without_sticky_bits_is_named_so() -> None:
    """Held-out batch twenty's Triton encoder read `off-by-one-ulp` (within one e4m3 ulp): true, not the cause."""
    from conformance.conventions import SGLANG
    impl = Implementation("sticky-dropped", _sticky_dropped, {}, recipe="single", convention=SGLANG)
    case = Case(num_tokens=4, num_heads=2, head_dim=16, page_size=4, num_pages=2, cache_loc=(5, 0, 2, 7),
                k_scale=Scale("tensor1", 0.3), v_scale=Scale("float", 0.7), seed=3, recipe="single")
    found = {f.key for f in Diagnoser(impl, CPU).diagnose(case)}
    assert found == {"rounds-sticky-lost@any"}, found


def _product_in_float64(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                        use_triton=True):
    """SGLang's convention, recipe single, but x * fl32(1/s) kept exact in float64 and rounded once to e4m3 by a
    nearest-value search (held-out batch 51's float64 software encoder): fp32's rounding of the product skipped."""
    keep = cache_loc >= 0
    magnitudes = torch.arange(0x7F, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).double()
    for x, cache, s in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        r = torch.tensor(1.0) / torch.tensor(1.0 if s is None else float(s), dtype=torch.float32)
        y = x.reshape(x.shape[0], *cache.shape[-2:]).double() * r.double()
        d = (magnitudes - y.abs().clamp(max=448).unsqueeze(-1)).abs()
        nearest = d == d.min(-1, keepdim=True).values
        even = nearest & (torch.arange(0x7F) % 2 == 0)  # a tie goes to the even code
        code = torch.where(even.any(-1), even.int().argmax(-1), nearest.int().argmax(-1)).to(torch.uint8)
        q = torch.where(torch.signbit(y), code | 0x80, code)
        q = torch.where(y.isnan(), torch.full_like(q, 0x7F), q)
        c = cache.view(torch.uint8)
        c = c if c.dim() == 4 else c.unsqueeze(1)
        c[cache_loc[keep] // c.shape[1], cache_loc[keep] % c.shape[1]] = q[keep]


def test_a_product_not_rounded_to_fp32_is_named_so() -> None:
    """An encoder in float64 rounds x * fl32(1/s) once: only where fp32's rounding of the product lands on an e4m3
    tie does it differ (an fp32 input one ulp above 1.0625 * 0.3). Read on a few bytes, `rounding:divide` fit too
    and came first (batch 51: two defects for this one cause); re-drawn values leave the unrounded product."""
    from conformance.conventions import SGLANG
    from strategies.case import Override
    impl = Implementation("product-in-float64", _product_in_float64, {}, recipe="single", convention=SGLANG)
    case = Case(num_tokens=2, num_heads=1, head_dim=8, page_size=4, num_pages=1, cache_loc=(0, 1),
                k_scale=Scale("tensor1", 0.3), v_scale=Scale("tensor1", 0.3), seed=3, recipe="single",
                input_dtype="float32", overrides=(Override("k", 0, 0x3EA33334), Override("k", 9, 0x3F233334)))
    found = {f.key for f in Diagnoser(impl, CPU).diagnose(case)}
    assert {k.split("@")[0] for k in found} == {"rounding:unrounded"}, found


def test_slots_left_unwritten_under_a_moving_defects_trigger_are_that_defect() -> None:
    """A slot computed with a hard-coded page size of 16 moves the tokens it keeps in the cache and skips those it
    sends past it: a one-token Case shows only the unwritten slot, under the same trigger (a final check's kernel
    read two keys for one). Under another trigger, or beside two such defects, it stays its own."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_unwritten_into_moved

    def groups_of(*keys: str) -> dict:
        return {k: [(k, Finding(k.split(":")[0], k, k))] for k in keys}
    groups = groups_of("wrong-slot:tokens-moved@page-size", "wrong-slot:unwritten@page-size")
    _merge_unwritten_into_moved(groups)
    assert list(groups) == ["wrong-slot:tokens-moved@page-size"]
    for keys in (("wrong-slot:tokens-moved@page-size", "wrong-slot:unwritten@dim-not-multiple:8"),
                 ("wrong-slot:tokens-moved@page-size", "strides:cache-page-stride@page-size",
                  "wrong-slot:unwritten@page-size")):
        groups = groups_of(*keys)
        _merge_unwritten_into_moved(groups)
        assert sorted(groups) == sorted(keys)


def test_a_raise_and_a_shared_buffer_beside_slots_moved_and_unwritten_are_that_one_defect(tmp_path) -> None:
    """Held-out batch 58: tokens a block computed from the cache's strides (`stride(0) // stride(1)`) lands wrong
    on a strided cache, in another slot or past the cache (IndexError), and a K/V pool's halves are such caches.
    A raise could not choose between the moved and the unwritten slots of one trigger; once the unwritten join
    the moved, the raise and the shared buffer's wrong bytes join them too: one defect, not three."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import Node, defects_from

    def node(name: str, *keys: str) -> Node:
        return Node(f"conformance/{name}[impl]", "failed", findings=[Finding(class_of(k), k, "?") for k in keys])
    nodes = {n.nodeid: n for n in (
        node("test_bit_exact.py::test_bit_exact", "wrong-slot:unwritten@strided-cache",
             "raises:IndexError@strided-cache"),
        node("test_isolation.py::test_duplicate_slots", "wrong-slot:tokens-moved@strided-cache",
             "raises:IndexError@strided-cache"),
        node("test_isolation.py::test_guard_bands", "raises:IndexError@strided-cache"),
        node("test_overlap.py::test_shared_but_disjoint_memory_is_accepted", "wrong-bytes:shared-memory"))}
    keys = [d.key for d in defects_from(nodes, tmp_path, {"args": ""})]
    assert keys == ["wrong-slot:tokens-moved@strided-cache"], keys


def test_tokens_moved_only_with_padding_beside_its_padding_rule_are_that_rule() -> None:
    """Padding tested as `!= -1` (held-out batch 50's pair, beside a flush of subnormal inputs): wraps -2 to the
    end, raises on -7, and in a Case where the flush changed bytes too, the wrap's model missed and the move read
    as whole tokens moved. One defect under the padding rule; beside two padding rules, or under another trigger,
    the move stays its own."""
    from conformance.diagnosis.report import _merge_moved_padding, _merge_raises
    groups = _groups("padding:wraps-to-end@padding", "wrong-slot:tokens-moved@padding", "raises:IndexError@padding")
    _merge_moved_padding(groups)
    _merge_raises(groups)
    assert list(groups) == ["padding:wraps-to-end@padding"], list(groups)
    for keys in (("padding:wraps-to-end@padding", "padding:slot-0@padding", "wrong-slot:tokens-moved@padding"),
                 ("padding:wraps-to-end@padding", "wrong-slot:tokens-moved@padding+page-size")):
        groups = _groups(*keys)
        _merge_moved_padding(groups)
        assert sorted(groups) == sorted(keys)


def test_slots_left_unwritten_under_a_wrong_bounds_trigger_are_that_bound() -> None:
    """A 3-D pool bounded a page short (held-out batch 51's pair) skips the last page's slots: a Case naming the last
    slot reads as that slot unwritten. One defect under the wrong bound; under a trigger without the bound's, or
    without the last slot, it stays its own."""
    from conformance.diagnosis.report import _merge_wrong_bound
    groups = _groups("out-of-range:wrong-bound@cache-3d", "wrong-slot:unwritten@cache-3d+last-slot")
    _merge_wrong_bound(groups)
    assert list(groups) == ["out-of-range:wrong-bound@cache-3d"], list(groups)
    for keys in (("out-of-range:wrong-bound@cache-3d", "wrong-slot:unwritten@page-size+last-slot"),
                 ("out-of-range:wrong-bound@padding", "wrong-slot:unwritten@padding")):  # not the top of the cache
        groups = _groups(*keys)
        _merge_wrong_bound(groups)
        assert sorted(groups) == sorted(keys)


def test_wrong_values_of_no_named_rule_join_the_value_rule_beside_a_placement() -> None:
    """Batch 50's pair (cache_loc read as contiguous, one amax over a token's heads): its exhaustive test, with a
    contiguous cache_loc and no Case to replay, reads `per-token-head:values`; it is the amax rule's, not the
    placement's. Beside two value rules it stays apart."""
    from conformance.diagnosis.report import _merge_per_head
    groups = _groups("per-token-head:amax-over-heads", "per-token-head:cache-loc-stride-ignored",
                     "per-token-head:values")
    _merge_per_head(groups)
    assert sorted(groups) == ["per-token-head:amax-over-heads", "per-token-head:cache-loc-stride-ignored"]
    keys = ("per-token-head:amax-over-heads", "per-token-head:amax-signed", "per-token-head:values")
    groups = _groups(*keys)
    _merge_per_head(groups)
    assert sorted(groups) == sorted(keys)


@pytest.mark.parametrize("what", ("raises on a second per-token-head call of one layout",
                                  "raises on a call of padding and out-of-range slots",
                                  "raises on all bfloat16 patterns (inline)"))
def test_every_raise_of_the_per_token_head_family_is_a_raise(what: str) -> None:
    """Held-out batch 58: a kernel that refuses strided scale caches raised in tests whose messages say "raises
    on a second call" or "on a call of padding slots", not "on a valid call", and those were read as wrong
    bytes (`per-token-head:values`), a second key for the one refusal."""
    from conformance.diagnosis.classify import classify_failure
    from conformance.harness import _failure_kind
    failure = _failure_kind("raises")(f"impl: {what} (per-token-head-vllm, separate; T=2 H=1 D=64):\n"
                                      "ValueError: v_scale_cache must be contiguous, got strides (2, 2, 1)")
    found = classify_failure(failure, "test_a_second_call_of_a_layout_is_bit_exact", "test_per_token_head", {},
                             _impl(_reference), CPU)
    assert [f.key for f in found] == ["raises:ValueError: v_scale_cache must be contiguous, got strides (N, …)"], found


def test_an_exhaustive_per_token_head_failure_is_no_rows_rule() -> None:
    """Batch 52's pair (a key of zeros taken for padding; NaN left out of a head's scale): the exhaustive test,
    every token at its own slot and no key of zeros, failed on the NaN heads alone; it is not the rows left
    unwritten, the one rule named. Another test's unnamed failure still is."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_per_head
    exhaustive = "conformance/test_per_token_head.py::test_every_input_pattern[impl-bfloat16]"
    second = "conformance/test_per_token_head.py::test_a_second_call_of_a_layout_is_bit_exact[impl]"
    groups = {"per-token-head:unwritten": [("a", Finding("per-token-head", "per-token-head:unwritten", "u"))],
              "per-token-head:values": [(exhaustive, Finding("per-token-head", "per-token-head:values", "v")),
                                        (second, Finding("per-token-head", "per-token-head:values", "v"))]}
    _merge_per_head(groups)
    assert [n for n, _ in groups["per-token-head:values"]] == [exhaustive], groups
    assert [n for n, _ in groups["per-token-head:unwritten"]] == ["a", second], groups


def test_a_diagnosis_that_fails_says_so_beside_the_failures_text(monkeypatch) -> None:
    """When every replay of a failure's diagnosis raises (a bug of this suite's), the failure is read from its
    text alone, and its finding says why: the suite's own error is not left to pass for the implementation's."""
    from types import SimpleNamespace

    from conformance.diagnosis import classify, recorder
    real = classify.classify_failure

    def flaky(exc, test, module, params, impl, device, unrepeatable=False):
        if impl is not None:
            raise IndexError("index 126 is out of bounds for dimension 0 with size 124")
        return real(exc, test, module, params, impl, device, unrepeatable)

    monkeypatch.setattr(classify, "classify_failure", flaky)
    item = SimpleNamespace(module=SimpleNamespace(__name__="conformance.test_e5m2"), originalname="test_x",
                           name="test_x", callspec=None, funcargs={"impl": object(), "device": CPU})
    found = recorder._classified(item, AssertionError("k_cache: 3 of 8 bytes differ"))
    assert found and all("diagnosis's replays failed (IndexError" in f["facts"]["detail"] for f in found), found


def test_a_per_token_slot_rule_triggered_by_several_tokens_fit_by_chance() -> None:
    """A grid that skips some tokens' programs leaves a slot unwritten that a wrong bound also explains; but a
    bound acts on each token by its own slot, and every token of the minimal Case, alone, is right (held-out
    batch 24's Triton write): that model is refuted, not reported."""
    from conformance.diagnosis.diagnose import consistent
    from conformance.diagnosis.effects import Effect
    bound = Effect("out-of-range:wrong-bound", "skips in-range slots")
    assert consistent(bound, ["many-tokens"], tokens=3).key == "wrong-slot:unexplained"
    assert consistent(bound, ["many-tokens"], tokens=9).key == bound.key  # tokens past the fourth were not tried
    assert consistent(bound, ["out-of-range"], tokens=3).key == bound.key


def _inverts_its_scale_in_place(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                                use_triton=True):
    """Recipe `single` (SGLang's signature), but each tensor scale is inverted in place (`s.reciprocal_()`):
    right bytes on the first call of a fresh tensor, its caller's scale changed."""
    values = []
    for s in (k_scale, v_scale):
        values.append(1.0 if s is None else float(s))
        if isinstance(s, torch.Tensor):
            s.reciprocal_()
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, *values, page_size, recipe="single")


def test_a_kernel_that_writes_its_scale_is_still_identified() -> None:
    """The sweep gives each call, and K and V, scale tensors of their own: one tensor for both (and for every
    call) let a kernel that inverts its scale in place divide V by 1/s, and the sweep held it to no recipe
    (held-out batch 25's SGLang write was held to `divide` and reported as rounding `single`)."""
    from conformance.conventions import detect
    from conformance.diagnosis.identification import held_recipe, identify, sweep_points
    impl = Implementation("inverts", _inverts_its_scale_in_place, convention=detect(_inverts_its_scale_in_place))
    res = identify(impl, sweep_points(["bfloat16"], full=False, convention=impl.convention), CPU)
    assert not res.errors and res.matches() == ["single"], held_recipe(res)


def _unmasked_dim_tail(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                       use_triton=True, *, recipe="unfused", checked=False):
    """Contiguous [T, H, D] inputs and caches only: each head written as a tile of the next power of two dims,
    the lanes past D unmasked (they load the input's next elements and store them past the head's row), heads
    and tokens in order, so a later head's real bytes land over an earlier head's tail."""
    from kernel.reference import quantize
    tokens, heads, dim = k.shape
    width = 1 << (dim - 1).bit_length()
    for x, cache, s in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        value = 1.0 if s is None else float(s)
        flat_x = x.as_strided((tokens * heads * dim + width - dim,), (1,), x.storage_offset())
        flat_c = cache.view(torch.uint8)
        flat_c = flat_c.as_strided((flat_c.numel() + width - dim,), (1,), flat_c.storage_offset())
        for t, slot in enumerate(cache_loc.tolist()):
            if not 0 <= slot < cache.shape[0] * page_size:
                continue
            for h in range(heads):
                src, dst = (t * heads + h) * dim, (slot * heads + h) * dim
                q = quantize(flat_x[src:src + width].reshape(1, 1, -1), ScaleArg("float", value, None),
                             get_recipe(recipe), "fp8_e4m3")
                flat_c[dst:dst + width] = q.reshape(-1)


def test_a_tile_of_unmasked_dims_is_named_so() -> None:
    """Held-out batch 24's Triton write took its mask-free path where D is a multiple of 16 but not the tile's
    width: the lanes past D store the input's next elements past each head's row (read as bytes in the wrong
    places, nothing explained)."""
    found = Diagnoser(_impl(_unmasked_dim_tail), CPU).diagnose(_case(head_dim=12))
    assert [f.key for f in found] == ["overrun:tile@dim-not-pow2"], [f.key for f in found]


def _scale_stride_one(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                      *, recipe="unfused", checked=False):
    """Each tensor scale read once per head with a stride of 1 (an [H] scale's indexing applied to a [1] one):
    head h uses the h-th float32 word from the scale's start."""
    heads = k.shape[1]
    per_head = [s.as_strided((heads,), (1,), s.storage_offset()).tolist() if isinstance(s, torch.Tensor)
                else [s] * heads for s in (k_scale, v_scale)]
    for h in range(heads):
        _reference(k[:, h:h + 1], v[:, h:h + 1], k_cache[..., h:h + 1, :], v_cache[..., h:h + 1, :], cache_loc,
                   per_head[0][h], per_head[1][h], page_size, recipe=recipe, checked=checked)


def test_a_scale_read_past_its_one_element_is_named_so() -> None:
    """Held-out batch 24's Triton write read a [1] scale with a stride of 1 across heads: past the tensor it read
    whatever memory followed (seven keys, unrepeatable). The suite's scale buffers now hold fixed words after the
    element (strategies.build.SCALE_GUARD), so the reads repeat and one model names them."""
    found = Diagnoser(_impl(_scale_stride_one), CPU).diagnose(_case(k_scale=Scale("tensor1", 0.3)))
    assert [f.key for f in found] == ["scale:read-past-tensor@heads-above:1"], [f.key for f in found]


def test_a_scale_ignored_where_the_other_is_one_is_the_swapped_scale() -> None:
    """K's odd heads divided by V's scale (`repeat` for `repeat_interleave`) read as an ignored scale in a Case
    whose v_scale was 1.0 and as a swapped one in another: one defect, the swapped scale's. An ignored scale in
    a Case of two scales other than 1.0 stays apart."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_ignored_into_swapped

    def finding(key: str, k: float, v: float) -> Finding:
        minimal = _case(k_scale=Scale("tensor1", k), v_scale=Scale("tensor1", v)).to_dict()
        return Finding("scale", key, key, facts={"minimal": minimal})
    groups = {"scale:ignored@any": [("a", finding("scale:ignored@any", 0.3, 1.0))],
              "scale:swapped@scales-differ": [("b", finding("scale:swapped@scales-differ", 0.3, 0.7))]}
    _merge_ignored_into_swapped(groups)
    assert list(groups) == ["scale:swapped@scales-differ"] and len(groups["scale:swapped@scales-differ"]) == 2
    apart = {"scale:ignored@any": [("a", finding("scale:ignored@any", 0.3, 0.7))],
             "scale:swapped@scales-differ": [("b", finding("scale:swapped@scales-differ", 0.3, 0.7))]}
    _merge_ignored_into_swapped(apart)
    assert sorted(apart) == ["scale:ignored@any", "scale:swapped@scales-differ"]


def test_a_probe_row_reports_at_most_a_few_sets_of_defects_apart() -> None:
    """Held-out batch 25's accumulating scatter gave 40 to 48 sets of keys a capability row, each shrunk and
    diagnosed (about 150 s a row): past ROW_FAILURE_TYPES a row's new sets share its last type, stably."""
    from conformance.diagnosis.capabilities import ROW_FAILURE_TYPES, _failure_type
    sets = [(f"wrong-bytes:k{i}",) for i in range(ROW_FAILURE_TYPES + 3)]
    types = [_failure_type(keys, "meta:row") for keys in sets]
    assert len(set(types)) == ROW_FAILURE_TYPES
    assert [_failure_type(keys, "meta:row") for keys in sets] == types  # a replayed example: the same type
    assert _failure_type(sets[-1], "meta:other-row") is not types[-1]  # another row's sets are its own


def test_a_tiles_lanes_under_two_triggers_are_one_defect() -> None:
    """A mask `|` for `&` leaves the lanes past D unmasked where H is a power of two and those past H where D is:
    one mask, one defect, under the key of the fewest trigger dimensions."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_overrun
    keys = ["overrun:tile@dim-not-pow2", "overrun:tile@heads-not-pow2+page-size", "scale:swapped@scales-differ"]
    groups = {k: [(str(i), Finding(k.split(":")[0], k, k))] for i, k in enumerate(keys)}
    _merge_overrun(groups)
    assert sorted(groups) == ["overrun:tile@dim-not-pow2", "scale:swapped@scales-differ"]


def _e5m2_binade_floored_at_e4m3s(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                                  use_triton=True, *, recipe="unfused", checked=False, cache_dtype=None):
    """Recipe divide; in an e5m2 cache, values below 2**-6 (e4m3's smallest normal) rounded to multiples of 2**-8
    first, as an encoder that floors the binade at e4m3's -6 does."""
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe="divide",
                            checked=checked, cache_dtype=cache_dtype)
    if k_cache.dtype != torch.float8_e5m2:
        return
    for x, cache, s in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        y = x.float() / (1.0 if s is None else float(s))
        small = y.abs() < 2.0**-6
        q = (torch.round(y * 256.0) / 256.0).to(torch.float8_e5m2).view(torch.uint8)
        rows = cache.view(torch.uint8)
        for t, slot in enumerate(cache_loc.tolist()):
            if 0 <= slot < cache.shape[0] * page_size:
                row = rows[slot // page_size, slot % page_size]
                row[small[t]] = q[t][small[t]]


def test_subnormals_on_another_formats_grid_are_named_so() -> None:
    """Held-out batch 25's e5m2 encoder floored its binade at e4m3's -6, not -14 (read as nothing explained)."""
    small = tuple(Override("k", i, _bf16(value), "small") for i, value in enumerate((0.005, -0.0031, 0.0009, 0.011)))
    case = _case(cache_dtype="float8_e5m2", cache_format="fp8_e5m2", recipe="divide", overrides=small,
                 k_scale=Scale("tensor1", 1.0), v_scale=Scale("tensor1", 1.0))
    found = Diagnoser(_impl(_e5m2_binade_floored_at_e4m3s, "divide"), CPU).diagnose(case)
    assert [f.key for f in found] == ["subnormal-grid:-6@cache-e5m2"], [f.key for f in found]


def _subnormal_path_bug(rule, normal_path=None):
    """Recipe divide (or `normal_path`'s write), with each nonzero quotient below the format's smallest normal
    written by `rule(y, fp8)` (bytes): a software encoder whose subnormal path is wrong (held-out batch 61)."""
    def write(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
              recipe="unfused", checked=False, cache_dtype=None):
        if normal_path is not None:
            normal_path(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, checked=checked,
                        cache_dtype=cache_dtype)
        else:
            naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe="divide",
                                    checked=checked, cache_dtype=cache_dtype)
        fp8 = torch.float8_e5m2 if k_cache.dtype == torch.float8_e5m2 else torch.float8_e4m3fn
        emin = -14 if fp8 == torch.float8_e5m2 else -6
        for x, cache, s in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
            y = x.float() / (1.0 if s is None else float(s))
            small = (y.abs() < 2.0**emin) & (y != 0)
            q = rule(y, fp8)
            rows = cache.view(torch.uint8)
            for t, slot in enumerate(cache_loc.tolist()):
                if 0 <= slot < cache.shape[0] * page_size:
                    row = rows[slot // page_size, slot % page_size]
                    row[small[t]] = q[t][small[t]]
    write.__name__ = rule.__name__
    return write


def _implicit_bit_dropped(y: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """The leading 1 left out: a normal fp32 quotient rounded from its fraction bits alone."""
    lead = torch.where(y == 0, 0.0, 2.0 ** torch.floor(torch.log2(y.abs())))
    return (y.sign() * (y.abs() - lead)).to(fp8).view(torch.uint8)


def _tiny_to_smallest_subnormal(y: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """A shift clamped one short: a nonzero quotient below half the smallest subnormal rounds up to it."""
    smallest = 2.0**-16 if fp8 == torch.float8_e5m2 else 2.0**-9
    up = torch.where(y.abs() < smallest / 2, y.sign() * smallest, y)
    return up.to(fp8).view(torch.uint8)


def _doubled(y: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    """A denormalizing shift one bit short: a quotient below the smallest normal written at twice its value."""
    return (2 * y).to(fp8).view(torch.uint8)


def test_subnormals_shifted_one_bit_short_are_named_so_not_a_scale_off_by_a_binade() -> None:
    """Held-out batch 61: a minimal Case of one tie at 2**-10 (written 0x01 for 0x00) also fits half the scale;
    the encoder's shift, right on every normal value, is the cause, whatever the scale."""
    tie = (Override("k", 0, _bf16(0.3 * 2.0**-10), "small"),)
    for case in (_case(recipe="divide", overrides=tie),
                 _case(recipe="divide", k_scale=Scale("tensor1", 1.0), v_scale=Scale("tensor1", 1.0),
                       overrides=tuple(Override("k", i, _bf16(x), "small")
                                       for i, x in enumerate((0.005, -0.0031, 0.0009, 0.011, 3.0))))):
        keys = [f.key for f in Diagnoser(_impl(_subnormal_path_bug(_doubled), "divide"), CPU).diagnose(case)]
        assert [k.split("@")[0] for k in keys] == ["subnormal-shift"], keys


def test_an_encoders_wrong_subnormal_path_is_one_named_defect() -> None:
    """Held-out batch 61: subnormal rules the suite has no model for (an implicit bit dropped, a shift clamped one
    short) are named by where they lie, every normal value right, not left unexplained."""
    small = tuple(Override("k", i, _bf16(x), "small") for i, x in enumerate((0.0051, -0.0031, 0.0009, 0.00011, 3.0)))
    for rule in (_implicit_bit_dropped, _tiny_to_smallest_subnormal):
        case = _case(recipe="divide", k_scale=Scale("tensor1", 1.0), v_scale=Scale("tensor1", 1.0), overrides=small)
        keys = [f.key for f in Diagnoser(_impl(_subnormal_path_bug(rule), "divide"), CPU).diagnose(case)]
        assert [k.split("@")[0] for k in keys] == ["subnormal-path"], (rule.__name__, keys)


def _e5m2_rebiased_by_e4m3s(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                            use_triton=True, *, recipe="unfused", checked=False, cache_dtype=None):
    """Recipe divide; an e5m2 cache's bytes rebiased with e4m3's 7, not 15: each the e5m2 byte of the quotient
    / 256 (held-out batch 61's launch that left the bias at its e4m3 default)."""
    if k_cache.dtype != torch.float8_e5m2:
        naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe="divide",
                                checked=checked, cache_dtype=cache_dtype)
        return
    down = [None if s is None else float(s) * 256.0 for s in (k_scale, v_scale)]
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, down[0] or 256.0, down[1] or 256.0, page_size,
                            recipe="divide", checked=checked, cache_dtype=cache_dtype)


def _nan_sign_kept(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                   recipe="unfused", checked=False, cache_dtype=None):
    """Recipe divide, with a negative NaN written with its sign (0xFF), as a raw cast does, in any format."""
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe="divide",
                            checked=checked, cache_dtype=cache_dtype)
    for x, cache in ((k, k_cache), (v, v_cache)):
        rows = cache.view(torch.uint8)
        for t, slot in enumerate(cache_loc.tolist()):
            if 0 <= slot < cache.shape[0] * page_size:
                row = rows[slot // page_size, slot % page_size]
                row[(x[t].float().isnan() & x[t].float().signbit()).reshape(row.shape)] = 0xFF


def test_a_negative_nans_sign_kept_in_an_e5m2_cache_is_the_nan_sign_rule() -> None:
    """One NaN byte, 0xFF for 0x7F, in an e5m2 cache: the sign rule e4m3 caches name, not K and V's NaN masks
    mixed up (a one-byte Case fits both; a self-written vLLM kernel read two keys for its one defect)."""
    nan = (Override("k", 0, 0xFFC0, "special"),)
    case = _case(cache_dtype="float8_e5m2", cache_format="fp8_e5m2", recipe="divide", overrides=nan,
                 k_scale=Scale("tensor1", 1.0), v_scale=Scale("tensor1", 1.0))
    keys = [f.key for f in Diagnoser(_impl(_nan_sign_kept, "divide"), CPU).diagnose(case)]
    assert [k.split("@")[0] for k in keys] == ["encoding:nan-sign"], keys


def test_an_exponent_rebiased_with_another_formats_bias_is_named_so() -> None:
    """Every e5m2 byte that of the value / 256 (not a format's bytes, nor a scale off by one binade): the bias."""
    case = _case(cache_dtype="float8_e5m2", cache_format="fp8_e5m2", recipe="divide")
    keys = [f.key for f in Diagnoser(_impl(_e5m2_rebiased_by_e4m3s, "divide"), CPU).diagnose(case)]
    assert keys == ["exponent-bias:7@cache-e5m2"], keys


def test_a_normal_values_rule_beside_a_wrong_subnormal_path_is_named_with_it() -> None:
    """Held-out batch 61's pair: e5m2 rebiased with e4m3's 7 and, apart, a subnormal path of its own. No one rule
    gives both kinds of value, so the normal values' rule is read from them alone, beside the subnormal path
    (the e5m2 key read as nothing explained); each a defect of its own."""
    small = tuple(Override("k", i, _bf16(x), "small")
                  for i, x in enumerate((3e-5, -2e-6, 7e-7, 1e-3, -2e-3, 1.5, -40.0)))
    case = _case(cache_dtype="float8_e5m2", cache_format="fp8_e5m2", recipe="divide", overrides=small,
                 k_scale=Scale("tensor1", 1.0), v_scale=Scale("tensor1", 1.0))
    # the subnormal path wrong on the quotient (3e-5 and below), or on what the bias made of it (1e-3 / 256)
    for write in (_subnormal_path_bug(_tiny_to_smallest_subnormal, _e5m2_rebiased_by_e4m3s),
                  _rebiased_into_a_wrong_subnormal_path):
        # the Case itself, as a re-drawn call shows it (a minimal one keeps one kind of value and one defect)
        keys = sorted({e.key for e in Diagnoser(_impl(write, "divide"), CPU).effects(case, "wrong-bytes")})
        assert keys == ["exponent-bias:7", "subnormal-path"], (write.__name__, keys)


def _rebiased_into_a_wrong_subnormal_path(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None,
                                          page_size=16, use_triton=True, *, recipe="unfused", checked=False,
                                          cache_dtype=None):
    """e5m2 rebiased with e4m3's 7 (the quotient / 256), then a subnormal path that rounds anything below half
    the smallest subnormal up to it, on what the bias made of the value (held-out batch 61's pair)."""
    scales = [s if k_cache.dtype != torch.float8_e5m2 else 256.0 * (1.0 if s is None else float(s))
              for s in (k_scale, v_scale)]
    _subnormal_path_bug(_tiny_to_smallest_subnormal)(k, v, k_cache, v_cache, cache_loc, *scales, page_size,
                                                     checked=checked, cache_dtype=cache_dtype)


def test_wrong_subnormals_seen_only_beside_a_normal_values_rule_are_that_rules_defect() -> None:
    """One encoder step wrong on both kinds of value (a rule on the normal ones, none on the subnormals) is one
    defect; a subnormal path also seen wrong alone is a second."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_subnormals_beside
    rule, sub = "rounds-ties-away@any", "subnormal-path@any"
    for alone, kept in ((False, [rule]), (True, [rule, sub])):
        findings = [("a", Finding("subnormal-path", sub, "?", facts={"beside": "rounds-ties-away"}))]
        if alone:
            findings.append(("b", Finding("subnormal-path", sub, "?")))
        groups = {rule: [("r", Finding("rounding", rule, "?"))], sub: findings}
        _merge_subnormals_beside(groups)
        assert sorted(groups) == kept, (alone, sorted(groups))


def test_an_accumulating_stores_zero_and_parked_bytes_are_its_symptoms() -> None:
    """Adding 0x00 to a slot leaves it as it was (read as unwritten, under special values), and the bytes
    skipped tokens park in one slot add up (bytes no model places, under out-of-range slots): beside the one
    accumulating store, its symptoms. A slot left unwritten under a shape trigger stays apart."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_old_bytes_symptoms
    keys = ["storage:added-to-old@any", "wrong-slot:unwritten@special-values", "wrong-slot:unexplained@out-of-range",
            "wrong-slot:unwritten@heads-not-pow2"]
    groups = {k: [(str(i), Finding(k.split(":")[0], k, k))] for i, k in enumerate(keys)}
    _merge_old_bytes_symptoms(groups)
    assert sorted(groups) == ["storage:added-to-old@any", "wrong-slot:unwritten@heads-not-pow2"]


def test_a_value_defects_title_names_the_values_its_smallest_case_needs() -> None:
    """Its key leaves the value dimensions out (one defect whichever Case showed it), but the reader learns
    from the title that a NaN was lost only for a tiny scale, and which (batch twenty-three's reciprocal
    clamped to FLT_MAX read as a bare `encoding:nan-lost@any`)."""
    from conformance.diagnosis.diagnose import _values_needed
    from conformance.diagnosis.effects import Effect
    lost = Effect("encoding:nan-lost", "writes a finite byte where the recipe gives NaN", value=True)
    said = _values_needed(lost, ["scale-value", "special-values"], _case(k_scale=Scale("tensor1", 1e-40)))
    assert "a scale other than 1.0 (here k_scale 1e-40, v_scale 0.7)" in said and "special input values" in said
    assert _values_needed(lost, ["cache-uint8"], _case()) == ""


def _row_mask_le(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                 recipe="unfused", checked=False):
    """A row mask `<=` T: every tensor read one token past its end (cache_loc[T] and the inputs' row T)."""
    one_more = [t.as_strided((t.shape[0] + 1, *t.shape[1:]), t.stride(), t.storage_offset())
                for t in (k, v, cache_loc)]
    _reference(one_more[0], one_more[1], k_cache, v_cache, one_more[2], k_scale, v_scale, page_size, recipe=recipe)


def _tail_rows_at_slot_0(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                         use_triton=True, *, recipe="unfused", checked=False):
    """A tile of 4 tokens, its loads masked with other=0 (slot and values) and its store not: the rows past T
    write zeros to slot 0, after the batch's own."""
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe)
    if k.shape[0] % 4:
        zeros = [torch.zeros_like(x[:1]) for x in (k, v)]
        _reference(*zeros, k_cache, v_cache, cache_loc.new_zeros(1), k_scale, v_scale, page_size, recipe=recipe)


def test_the_build_puts_an_unwritten_slot_after_cache_loc() -> None:
    """A kernel reading cache_loc[T] reads the same valid, unwritten slot every time (then padding), and the
    inputs' row T lies in their buffers: the stray row lands deterministically where the comparison sees it."""
    from strategies.build import LOC_GUARD, loc_guard_slot
    case = _case(loc_step=2)
    built = build(case, CPU)
    after = built.buffers["cache_loc"][case.num_tokens * case.loc_step:]
    assert after.tolist() == [loc_guard_slot(case)] + [-1] * (LOC_GUARD - 1)
    assert loc_guard_slot(case) == case.num_slots - 1 not in case.cache_loc
    assert loc_guard_slot(_case(num_pages=1, page_size=3, cache_loc=(2, 0, 1))) == -1
    for name in ("k", "v"):
        t = getattr(built, name)
        row_t = t.storage_offset() + t.shape[0] * t.stride(0) + sum((n - 1) * s for n, s in
                                                                    zip(t.shape[1:], t.stride()[1:]))
        assert row_t < built.buffers[name].numel()


@pytest.mark.parametrize(("fn", "key"), [(_row_mask_le, "overrun:rows@plain"),
                                       (_tail_rows_at_slot_0, "overrun:rows@tokens-not-multiple:4")])
def test_a_token_past_the_batch_is_an_overrun_of_rows(fn, key) -> None:
    """Held-out batch 24's Triton pair masked its rows with `<=` T (it read past cache_loc, whose bytes then
    depended on memory: `state:*`), and batch 25's stored a tile's rows past T as zeros at slot 0 (three
    unexplained keys): both write a token past the batch."""
    found = Diagnoser(_impl(fn), CPU).diagnose(_case(num_tokens=3, cache_loc=(5, 0, 9)))
    assert [f.key for f in found] == [key], [(f.key, f.title) for f in found]


def _vllm_e5m2_nan_as_7e(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """vLLM's convention; NaN written into an e5m2 cache as 0x7E (fp16's canonical NaN 0x7E00, its high byte),
    another NaN encoding of e5m2; e4m3 caches right."""
    if kv_cache_dtype != "fp8_e5m2":
        naive_fp8_set_kv_buffer(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale,
                                key_cache.shape[1], recipe="divide")
        return
    for x, cache, s in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        q = (x.float() / s.float()).clamp(-57344.0, 57344.0).to(torch.float8_e5m2).view(torch.uint8)
        q[(q & 0x7F) > 0x7C] = 0x7E
        rows = cache.view(torch.uint8).view(-1, *cache.shape[2:])
        kept = (slot_mapping >= 0) & (slot_mapping < rows.shape[0])
        rows[slot_mapping[kept].long()] = q[kept]


def test_a_nan_written_as_another_nan_encoding_is_named_by_its_byte() -> None:
    """Held-out batch 26's SGLang write put 0x7E for NaN into e5m2 caches (read as wrong bytes nothing
    explains): another NaN encoding of e5m2, named with its byte."""
    case = _case(cache_dtype="float8_e5m2", cache_format="fp8_e5m2", v_scale=Scale("tensor1", 0.7),
                 overrides=(Override("k", 1, 0x7FC0, "nan"), Override("v", 3, 0xFFC0, "-nan")))
    impl = Implementation("nan-7e", _vllm_e5m2_nan_as_7e, {}, convention=VLLM, recipe="divide")
    found = Diagnoser(impl, CPU).diagnose(case.replace(recipe="divide"))
    assert [f.key for f in found] == ["encoding:nan-byte:0x7E@cache-e5m2"], [(f.key, f.title) for f in found]


def _heads_masked_by_dim(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                         use_triton=True, *, recipe="unfused", checked=False):
    """A tile mask `h < head_size` for `h < num_heads` (H a power of two here, so no tile heads past H): the heads
    from D on are never written."""
    kept = min(k.shape[-2] if k.dim() == 3 else k_cache.shape[-2], k_cache.shape[-1])
    heads, dim = k_cache.shape[-2], k_cache.shape[-1]
    rows = [x.reshape(x.shape[0], heads, dim)[:, :kept] for x in (k, v)]
    _reference(*rows, k_cache[..., :kept, :], v_cache[..., :kept, :], cache_loc, k_scale, v_scale, page_size,
               recipe=recipe)


def test_heads_masked_by_head_dim_are_a_tile_overrun() -> None:
    """Held-out batch 26's Triton pair bounded its tile's heads by head_size: heads from D on were never written
    (read as slots left unwritten, a second key beside the tile's stray heads). The tile model with that mask
    names both faces."""
    found = Diagnoser(_impl(_heads_masked_by_dim), CPU).diagnose(_case(num_heads=4, head_dim=2))
    assert [f.key.split("@")[0] for f in found] == ["overrun:tile"], [(f.key, f.title) for f in found]


def _v_with_ks_nan_mask(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                        use_triton=True, *, recipe="unfused", checked=False):
    """V's NaN fix-up taken from K's mask (`nan_v = isnan(yk)`, copy-pasted): V's bytes are 0x7F where K is NaN,
    and a NaN of V alone keeps its sign (0xFF for -NaN); contiguous 3-D inputs, 4-D caches."""
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe)
    rows = v_cache.view(torch.uint8).view(-1, *v_cache.shape[2:])
    for t, slot in enumerate(cache_loc.tolist()):
        if 0 <= slot < rows.shape[0]:
            own, other = v[t].isnan(), k[t].isnan()
            negative = v[t].view(torch.int16) < 0
            rows[slot] = torch.where(other, 0x7F, torch.where(own & negative, 0xFF, rows[slot])).to(torch.uint8)


def test_a_nan_mask_taken_from_the_other_input_is_named() -> None:
    """Held-out batch 27's vLLM pair fixed V's NaN bytes up with K's NaN mask: wrong bytes no model explained, which
    joined its other defect (one key for two causes)."""
    case = _case(cache_rank=4, overrides=(Override("k", 1, 0x7FC0, "nan"), Override("v", 3, 0xFFC0, "-nan")))
    found = Diagnoser(_impl(_v_with_ks_nan_mask), CPU).diagnose(case)
    assert [f.key.split("@")[0] for f in found] == ["kv-mixed:nan-mask"], [(f.key, f.title) for f in found]


def _nan_sign_kept(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                   recipe="unfused", checked=False):
    """Every value right but a negative NaN, written 0xFF (the cast's sign kept) where every recipe writes 0x7F."""
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe)
    for x, cache in ((k, k_cache), (v, v_cache)):
        rows = cache.view(torch.uint8).view(-1, *cache.shape[-2:])
        for t, slot in enumerate(cache_loc.tolist()):
            if 0 <= slot < rows.shape[0]:
                negative_nan = x[t].isnan() & (x[t].view(torch.int16) < 0)
                rows[slot] = torch.where(negative_nan, 0xFF, rows[slot]).to(torch.uint8)


def test_a_nan_sign_kept_is_not_the_other_inputs_nan_mask() -> None:
    """A fresh check kernel of this session (an SGLang write, accumulating into 4-D caches, over a base that keeps the
    NaN sign) had its base's kept sign named `kv-mixed:nan-mask`: the mask model's own-NaN bytes with their sign kept
    fit a NaN sign kept too. Where every differing byte is NaN in the recipe, the sign rule is the one."""
    case = _case(cache_rank=4, overrides=(Override("v", 3, 0xFFC0, "-nan"),))
    found = Diagnoser(_impl(_nan_sign_kept), CPU).diagnose(case)
    assert [f.key.split("@")[0] for f in found] == ["encoding:nan-sign"], [(f.key, f.title) for f in found]


def _inf_fixup_on_e4m3(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                       *, recipe="unfused", checked=False):
    """Every byte right but e5m2's ±inf bytes 0x7C/0xFC, "fixed up" to 0x7B/0xFB on an e4m3 cache too (held-out
    batch 55's Triton write): there they are ±384, written as ±352."""
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe)
    for cache in (k_cache, v_cache):
        rows = cache.view(torch.uint8).view(-1, *cache.shape[-2:])
        for slot in cache_loc.tolist():
            if 0 <= slot < rows.shape[0]:
                rows[slot] = torch.where(rows[slot] & 0x7F == 0x7C, rows[slot] - 1, rows[slot]).to(torch.uint8)


def test_an_e5m2_inf_fixup_on_an_e4m3_cache_is_named() -> None:
    """The batch's report named it `off-by-one-ulp` (one e4m3 ulp below): true of the bytes, not the cause."""
    case = _case(cache_rank=4, overrides=(Override("k", 1, 0x42E6, "384"), Override("k", 4, 0xC2E6, "-384")))
    found = Diagnoser(_impl(_inf_fixup_on_e4m3), CPU).diagnose(case)
    assert [f.key.split("@")[0] for f in found] == ["encoding:e5m2-inf-fixup"], [(f.key, f.title) for f in found]


def _fp16_rebias_write(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                       use_triton=True, *, recipe="unfused", checked=False):
    """float16 inputs widened by the exponent rebias alone: ±0 and subnormals m * 2**-24 read as
    ±2**-15 * (1 + m / 1024); other dtypes right."""
    if k.dtype == torch.float16:
        from conformance.diagnosis.effects import _fp16_widened_as_normal
        k, v = (w if (w := _fp16_widened_as_normal(x)) is not None else x.float() for x in (k, v))
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe)


def test_an_fp16_widening_right_for_normal_values_only_is_named() -> None:
    """Held-out batch 27's SGLang Triton write widened fp16 by the rebias trick: zeros came out as the smallest
    subnormal bytes, read as one ulp off (the nearest class, not the cause)."""
    case = _case(input_dtype="float16", k_scale=Scale("tensor1", 2.0**-12), v_scale=Scale("float", 2.0**-12),
                 recipe="single", overrides=(Override("k", 0, 0x0000, "+0"), Override("k", 1, 0x8000, "-0"),
                                             Override("v", 2, 0x0003, "subnormal")))
    found = Diagnoser(_impl(_fp16_rebias_write, "single"), CPU).diagnose(case)
    assert [f.key for f in found] == ["input-misread:fp16-subnormals@input-float16"], [(f.key, f.title) for f in found]


def _rows_from_zero_past_four(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                              use_triton=True, *, recipe="unfused", checked=False):
    """Chunks of four tokens, each quantizing the first chunk's rows: token t >= 4 gets token t % 4's bytes."""
    rows = torch.arange(k.shape[0]) % 4
    _reference(k[rows], v[rows], k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe,
               checked=checked)


def test_tokens_moved_under_an_extreme_scale_and_a_padded_cache_are_keyed_by_t() -> None:
    """Seen on the H200: at a scale of 1e38 every byte is ±0, so tokens moved differ in their signs alone, and an
    ordinary scale turns that symptom into misplaced bytes, the failure kept: the trigger is the failure's (T),
    not the symptom's (the scale, the fp16 input). The moved model reads the cache's slots, however much padding
    its buffer holds (V's here: over a MiB around 640 KiB of slots)."""
    case = Case(num_tokens=6, num_heads=2, head_dim=32, page_size=16, num_pages=640, cache_loc=(3, 40, 77, 9, 500, 1),
                v_cache_layout=Layout((2, 0, 1, 3), (2, 0, 3, 1), step=2, offset=3), input_dtype="float16",
                k_scale=Scale("tensor1", 1e38), v_scale=Scale("tensor1", 1e38), seed=5, recipe="unfused")
    assert build(case, CPU).buffers["v_cache"].numel() > 1 << 20
    keys = [f.key for f in Diagnoser(_impl(_rows_from_zero_past_four), CPU).diagnose(case)]
    assert keys == ["wrong-slot:tokens-moved@tokens-above:4"], keys


def test_tokens_moved_in_a_cache_of_many_slots_are_named() -> None:
    """Seen on an H100: the page-size ablation keeps T, so a minimal Case of 257 tokens on pages of 16 held 2 MiB
    of slots, past the moved models' old 1 MiB bound, and the moved tokens went unexplained (or, at an extreme
    scale, read as a sign rule)."""
    case = Case(num_tokens=6, num_heads=2, head_dim=64, page_size=16, num_pages=1100,
                cache_loc=(3, 4000, 7700, 9, 17000, 1), k_scale=Scale("tensor1", 0.7), v_scale=Scale("tensor1", 1.5),
                seed=9, recipe="unfused")
    assert case.num_slots * case.num_heads * case.head_dim > 2 << 20
    keys = [f.key for f in Diagnoser(_impl(_rows_from_zero_past_four), CPU).diagnose(case)]
    assert keys == ["wrong-slot:tokens-moved@tokens-above:4"], keys


def _vllm_grid_from_keys(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """vLLM's convention, T taken from the keys: past slot_mapping's end, its entries are read from whatever follows."""
    loc = slot_mapping.as_strided((key.shape[0],), slot_mapping.stride(), slot_mapping.storage_offset())
    naive_fp8_set_kv_buffer(key, value, key_cache.view(torch.uint8), value_cache.view(torch.uint8), loc, k_scale,
                            v_scale, key_cache.shape[1], recipe="divide")


def test_keys_padded_past_slot_mapping_and_written_are_one_defect_of_the_padding() -> None:
    """vllm#13922: keys longer than slot_mapping under CUDA-graph padding. A kernel sized by the keys writes the
    first padded row at the entry after slot_mapping's last: a row past the batch, triggered by the padding."""
    impl = Implementation("grid-from-keys", _vllm_grid_from_keys, {}, convention=VLLM_PADDED_KEYS, recipe="divide")
    case = _case(recipe="divide", k_scale=Scale("tensor1", 0.3), v_scale=Scale("tensor1", 0.7), padded_rows=3)
    [f] = Diagnoser(impl, CPU).diagnose(case)
    assert f.key == "overrun:rows@padded-keys" and "T taken from the keys" in f.title, (f.key, f.title)
    assert Diagnoser(impl, CPU).diagnose(case.replace(padded_rows=0)) == []
    # vLLM's convention as detected takes one key a slot_mapping entry: the padded call is not made, and says how
    assert "--convention vllm-padded-keys" in VLLM.why_not(case)


def _head_scale_on_tokens_where_t_is_h(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                                       use_triton=True, *, recipe="unfused", checked=False):
    """An [H] scale put on "the axis of length H", found by its length: the token axis where T = H, so token t is
    divided by scale[t] in every head (held-out batch thirty-one, twice)."""
    if k.shape[0] != k.shape[1] or not isinstance(k_scale, torch.Tensor) or k_scale.numel() != k.shape[1]:
        _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
        return
    for t in range(k.shape[0]):
        _reference(k[t:t + 1], v[t:t + 1], k_cache, v_cache, cache_loc[t:t + 1], k_scale[t].reshape(()),
                   v_scale[t].reshape(()) if isinstance(v_scale, torch.Tensor) and v_scale.numel() > 1 else v_scale,
                   page_size, recipe=recipe, checked=checked)


def test_a_per_head_scale_wrong_only_where_t_equals_h_is_keyed_by_the_coincidence() -> None:
    from conformance.diagnosis.per_head import only_where_t_equals_h
    values = {"k_scale": (0.5, 0.25, 0.125), "v_scale": (0.3, 0.6, 0.9)}
    impl = _impl(_head_scale_on_tokens_where_t_is_h)
    assert only_where_t_equals_h(_case(num_heads=3, k_scale=Scale("tensor1", 1.0)), values, 1, impl, CPU)
    assert not only_where_t_equals_h(_case(num_heads=3, k_scale=Scale("tensor1", 1.0)), values, 1,
                                     _impl(_first_head_scale), CPU)  # wrong at every T: not the coincidence


def _first_head_scale(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                      *, recipe="unfused", checked=False):
    """Every head divided by the first head's scale."""
    first = [s.reshape(-1)[0].reshape(()) if isinstance(s, torch.Tensor) else s for s in (k_scale, v_scale)]
    _reference(k, v, k_cache, v_cache, cache_loc, *first, page_size, recipe=recipe, checked=checked)


def _grid_of_pages(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                   recipe="unfused", checked=False):
    """A token grid sized by the cache's first dimension (its pages): tokens past that count are not written."""
    n = min(k.shape[0], k_cache.shape[0])
    _reference(k[:n], v[:n], k_cache, v_cache, cache_loc[:n], k_scale, v_scale, page_size, recipe=recipe,
               checked=checked)


def test_tokens_past_the_page_count_left_unwritten_are_triggered_by_it() -> None:
    """Held-out batch thirty-one's Triton grid of `key_cache.shape[0]` programs: the trigger is T above the pages,
    not tokens sharing a page (moving each to a page of its own adds pages too)."""
    case = _case(num_tokens=5, cache_loc=(9, 2, 6, 3, 1), num_pages=3)
    keys = [f.key for f in Diagnoser(_impl(_grid_of_pages), CPU).diagnose(case)]
    assert keys == ["wrong-slot:unwritten@tokens-above-pages"], keys


def test_a_size_rule_may_leave_one_head_to_its_own_path() -> None:
    """A paired-head store loses an odd H's last head, and a single head has its own path: H = 1 passes and 3
    fails, and the rule is still "not a multiple of 2" (6, 12 and 24 pass, so not "not a power of two")."""
    from conformance.diagnosis.ablation import SIZE_PROBES, fitting_rule
    outcomes = {n: n % 2 == 1 and n > 1 for n in SIZE_PROBES["heads"]}
    assert fitting_rule("heads", outcomes).name == "heads-not-multiple:2"
    assert fitting_rule("heads", {**outcomes, 1: True}).name == "heads-not-multiple:2"
    assert fitting_rule("heads", {n: n & (n - 1) != 0 for n in SIZE_PROBES["heads"]}).name == "heads-not-pow2"


def _decode_path_v_with_k_scale(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                                use_triton=True, *, recipe="unfused", checked=False):
    """A single-token (decode) path that writes V with k_scale; every larger call is right."""
    if k.shape[0] == 1:
        v_scale = k_scale
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)


def test_a_one_token_defect_is_not_refuted_by_a_right_call_of_more_tokens() -> None:
    """Held-out batch thirty-one's decode path, on the one-element Case its report shrank to: the re-drawn calls of
    32 tokens are right, and refute no value model (T may be the trigger), so the other cache's scale is named.
    (Its Triton kernel's report had V read from its storage's start, K's one value, fit by chance; a placement fit
    of a few bytes must now give a re-drawn call of the same symptoms too.)"""
    case = _case(num_tokens=1, num_heads=1, head_dim=1, cache_loc=(1,), k_scale=Scale("tensor1", 1.0),
                 v_scale=Scale("tensor0d", 0.6666666865348816), recipe="divide", seed=0)
    keys = [f.key for f in Diagnoser(_impl(_decode_path_v_with_k_scale, "divide"), CPU).diagnose(case)]
    assert [k.split("@")[0] for k in keys] == ["scale:swapped"], keys


def test_one_raise_under_padding_and_out_of_range_is_one_missing_bound() -> None:
    """Held-out batch thirty-two's one-token path indexed with the raw slot: an out-of-range slot and a padding
    slot below -num_slots both raised IndexError, read as two defects. One, unless a padding rule is named (a
    wrap that writes) or the exception types differ."""
    from conformance.diagnosis.report import _merge_raises_outside_cache
    groups = _groups("raises:IndexError@out-of-range", "raises:IndexError@padding+page-size")
    _merge_raises_outside_cache(groups)
    assert list(groups) == ["raises:IndexError@out-of-range"]
    kept = _groups("raises:IndexError@out-of-range", "raises:IndexError@padding", "padding:wraps-to-end@padding")
    _merge_raises_outside_cache(kept)
    assert len(kept) == 3
    apart = _groups("raises:ValueError@out-of-range", "raises:IndexError@padding")
    _merge_raises_outside_cache(apart)
    assert len(apart) == 2


def _pow2_reciprocal(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                     recipe="divide", checked=False):
    """Recipe divide, but a power-of-two scale multiplies by its reciprocal ("exact for powers of two"), with no
    guard that the reciprocal is finite: at 2**-149 it is inf, and a zero input gives NaN (held-out batch 47)."""
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        s = torch.tensor(1.0 if scale is None else float(scale), dtype=torch.float32)
        y = x.float().reshape(x.shape[0], -1)
        y = y * (1.0 / s) if torch.frexp(s).mantissa.abs() == 0.5 else y / s
        q = y.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
        q = torch.where(y.isnan(), 0x7F, q).to(torch.uint8)
        rows = cache.view(torch.uint8).reshape(-1, q.shape[1])
        for t, slot in enumerate(cache_loc.tolist()):
            if 0 <= slot < rows.shape[0]:
                rows[slot] = q[t]


def test_zeros_made_nan_in_both_caches_are_a_value_defect_not_a_misread_tensor() -> None:
    """Every input zero, every byte of both caches NaN: a tensor read from its storage's start (the poison around
    it is NaN) fits those bytes by chance, then fails a larger call, and the value effect, found once a cache,
    is the cause; re-drawn values that show it again are asked of the value models first (a sign rule's call
    shows placement too, which would hide it)."""
    zeros = tuple(Override(t, i, 0x8000 * (i % 2), "±0") for t in "kv" for i in range(64))
    case = _case(recipe="divide", num_tokens=1, num_heads=1, head_dim=64, page_size=16, num_pages=1, cache_loc=(1,),
                 k_scale=Scale("tensor1", 2.0**-149), v_scale=Scale("tensor1", 2.0**-149), overrides=zeros)
    keys = {f.key for f in Diagnoser(_impl(_pow2_reciprocal, "divide"), CPU).diagnose(case)}
    assert keys == {"encoding:nan-produced@any"}, keys


def test_bytes_out_of_place_under_the_one_placement_defects_trigger_are_its_symptoms() -> None:
    """Rows gathered with the inverse of a slot sort: tokens moved where the slots are unsorted, and with padding
    or out-of-range slots (sorted as the kernel counts them) bytes no model places. Under the run's one named
    placement defect, a diff whose every Case holds its trigger is its symptom; a sorted Case of valid slots, or a
    second placement defect, keeps it apart (held-out batch forty-seven's pair)."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _attribute_misplaced

    def group(key: str, *locs: tuple[int, ...]) -> list:
        return [(str(i), Finding(class_of(key), key, "?", facts={"minimal": _case(
            num_tokens=len(loc), cache_loc=loc, num_pages=4, page_size=16).to_dict()})) for i, loc in enumerate(locs)]
    host = "wrong-slot:tokens-moved@slots-unsorted"
    pad, many = "wrong-slot:unexplained@padding", "wrong-slot:unexplained@many-tokens"
    groups = {host: group(host, (5, 1)), pad: group(pad, (16, -1, -1), (16, 32, 96)), many: group(many, (0, 1, 2))}
    _attribute_misplaced(groups)
    assert sorted(groups) == [host, many], sorted(groups)
    second = "strides:cache-ignored@strided-cache"
    groups = {host: group(host, (5, 1)), second: group(second, (0, 1)), pad: group(pad, (16, -1, -1))}
    _attribute_misplaced(groups)
    assert pad in groups


def test_bounds_on_h_on_d_and_a_wider_input_that_one_row_size_parts_are_one_defect() -> None:
    """A grid that counts a row's tiles with the cache's element size and fills them with the input's leaves the
    row's tail unwritten past 512 bytes: under H above 4 (D = 64, bf16), D above 8 (H = 32) and float32 input
    (H = 4, D = 64) alike (held-out batch forty-seven). One row size parts every passing bound from every failing
    Case: one defect. A head tile past 4 heads of 8 dims and a dim chunk past 8 dims of one head have no such
    size, and stay two."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_row_bytes

    def group(key: str, h: int, d: int, dtype: str = "bfloat16") -> list:
        case = _case(num_heads=h, head_dim=d, input_dtype=dtype)
        return [("t", Finding(class_of(key), key, f"leaves slots unwritten, {key}", facts={"minimal": case.to_dict()}))]
    e = "wrong-slot:unwritten"
    groups = {f"{e}@heads-above:4": group(f"{e}@heads-above:4", 5, 64), f"{e}@dim-above:8": group(
        f"{e}@dim-above:8", 32, 32), f"{e}@input-float32": group(f"{e}@input-float32", 4, 64, "float32")}
    _merge_row_bytes(groups)
    assert sorted(groups) == [f"{e}@row-bytes-above:512"], sorted(groups)
    assert len(groups[f"{e}@row-bytes-above:512"]) == 3
    apart = {f"{e}@heads-above:4": group(f"{e}@heads-above:4", 5, 8), f"{e}@dim-above:8": group(
        f"{e}@dim-above:8", 1, 9)}
    _merge_row_bytes(apart)
    assert sorted(apart) == [f"{e}@dim-above:8", f"{e}@heads-above:4"], sorted(apart)


def _head_stride_as_dim_3d(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                           use_triton=True, *, recipe="single", checked=False):
    """Recipe single; a 3-D cache's strides indexed as a 4-D one's, so its heads are addressed with its dim stride
    (held-out batch forty-seven; ROCm/aiter#4531's class): heads overlap within a slot, later ones winning."""
    if k_cache.dim() != 3:
        _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
        return
    caches = [torch.zeros_like(c) for c in (k_cache, v_cache)]
    _reference(k, v, *caches, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    for right, cache in zip(caches, (k_cache, v_cache)):
        flat = cache.view(torch.uint8).as_strided((cache.untyped_storage().nbytes(),), (1,), 0)
        s0, _, s2 = cache.stride()
        for slot in cache_loc.tolist():
            if 0 <= slot < cache.shape[0]:
                for h in range(cache.shape[1]):
                    for d in range(cache.shape[2]):
                        flat[cache.storage_offset() + slot * s0 + (h + d) * s2] = right.view(torch.uint8)[slot, h, d]


def test_a_3d_caches_heads_addressed_with_its_dim_stride_are_named() -> None:
    keys = {f.key for f in Diagnoser(_impl(_head_stride_as_dim_3d, "single"), CPU).diagnose(
        _case(recipe="single", cache_rank=3, page_size=1, num_pages=12, num_heads=2, head_dim=4))}
    assert keys == {"strides:cache-axis-stride@cache-3d"}, keys


def test_a_quotient_staged_in_bf16_for_an_fp16_input_is_double_rounding_through_bf16() -> None:
    """SGLang's recipe rounds the quotient to the input's dtype; staged in bf16 for an fp16 input it is rounded to
    bf16 instead, not after an fp16 rounding: the model rounds in its place (held-out batch forty-seven's pair read
    as off-by-one-ulp for fp16 input and double rounding for fp32, two defects)."""
    from conformance.conventions import SGLANG
    impl = Implementation("bf16-staged", _bf16_staged_nan_signed, {}, convention=SGLANG, recipe="unfused-tensor1")
    case = _case(recipe="unfused-tensor1", input_dtype="float16", num_tokens=4, cache_loc=(5, 0, 9, 2),
                 head_dim=32, k_scale=Scale("tensor1", 0.3), v_scale=Scale("tensor1", 0.7))
    keys = {f.key for f in Diagnoser(impl, CPU).diagnose(case)}
    assert keys == {"double-rounding:bfloat16@input-float16"}, keys


def _unchecked_slots(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True, *,
                     recipe="unfused", checked=False):
    """No bound check: an out-of-range token written at its own slot, past the cache's end, into whatever follows
    it (vLLM's own Triton write, held-out on the CPU)."""
    need = max(cache_loc.tolist()) + 1
    big = [c.as_strided((-(-need // c.shape[1]), *c.shape[1:]), c.stride(), c.storage_offset())
           for c in (k_cache, v_cache)]
    _reference(k, v, *big, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=False)


def test_an_out_of_range_token_written_past_the_caches_end_is_named() -> None:
    keys = {f.key for f in Diagnoser(_impl(_unchecked_slots), CPU).diagnose(_case(cache_loc=(5, 13, 9)))}
    assert keys == {"out-of-range:written@out-of-range"}, keys


def _padding_unchecked(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                       *, recipe="unfused", checked=False):
    """No padding check: a token of slot -1 written at page -1, offset page_size - 1 (floor division), one slot
    before the cache's start (SGLang's own Triton write, held-out on the CPU)."""
    from kernel.plan import ScaleArg
    from kernel.recipe import get_recipe
    from kernel.reference import quantize
    _reference(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe, checked=checked)
    for x, cache, scale in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        value = 1.0 if scale is None else float(scale)
        q = quantize(x.reshape(x.shape[0], *cache.shape[-2:]).float(), ScaleArg("float", value, None),
                     get_recipe(recipe)).view(torch.uint8)
        flat = cache.view(torch.uint8).as_strided((cache.untyped_storage().nbytes(),), (1,), 0)
        st = cache.stride()
        for t, s in enumerate(cache_loc.tolist()):
            if s < 0:
                page, off = divmod(s, cache.shape[1])
                for h in range(cache.shape[2]):
                    for d in range(cache.shape[3]):
                        flat[cache.storage_offset() + page * st[0] + off * st[1] + h * st[2] + d * st[3]] = q[t, h, d]


def test_padding_written_at_its_own_negative_slot_before_the_cache_is_named() -> None:
    keys = {f.key for f in Diagnoser(_impl(_padding_unchecked), CPU).diagnose(_case(cache_loc=(5, -1, 9)))}
    assert keys == {"padding:before-start@padding"}, keys


def test_an_untriggered_raise_joins_the_raise_of_its_type_whose_trigger_its_case_has() -> None:
    """A big-cache test is never replayed whole, so its raise has no trigger; of two raises of the same type, it
    joins the one whose whole trigger its Case has (SGLang's own Triton write on an H100: a uint8 big cache's
    CompilationError beside the uint8 and the D-not-a-power-of-two ones)."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_same_exception

    def group(key: str, **changes) -> list:
        return [("t", Finding("raises", key, "?", facts={"exception": "CompilationError",
                                                           "minimal": _case(**changes).to_dict()}))]
    loose = "raises:CompilationError: at N:N:"
    groups = {loose: group(loose, cache_dtype="uint8", head_dim=128),
              "raises:CompilationError@cache-uint8": group("raises:CompilationError@cache-uint8", cache_dtype="uint8"),
              "raises:CompilationError@dim-not-pow2": group("raises:CompilationError@dim-not-pow2", head_dim=24)}
    _merge_same_exception(groups)
    assert sorted(groups) == ["raises:CompilationError@cache-uint8", "raises:CompilationError@dim-not-pow2"]
    assert len(groups["raises:CompilationError@cache-uint8"]) == 2


def _none_scale_from_key(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                         use_triton=True, *, recipe="unfused", checked=False):
    """A None scale's placeholder pointer loaded (held-out batch 54: K's data pointer passed for it): that side
    is multiplied by K's first value where its scale is 1."""
    def factor(scale):
        return torch.tensor(1.0) / k.reshape(-1)[0].float() if scale is None else scale
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, factor(k_scale), factor(v_scale), page_size,
                            recipe="single", checked=checked)


def test_a_none_scale_read_from_an_input_is_named() -> None:
    case = _case(recipe="single", v_scale=Scale("none"), k_scale=Scale("tensor1", 0.3))
    keys = [f.key for f in Diagnoser(_impl(_none_scale_from_key, "single"), CPU).diagnose(case)]
    assert keys == ["scale:none-read-from-input@scale-kind:none"], keys


def test_an_index_error_at_some_page_sizes_is_the_plain_call_slot_defect() -> None:
    """A vLLM write that read its block size from the head axis moved tokens on the plain call and raised
    IndexError where the page size made its blocks run past the cache: one cause, two keys, before."""
    from conformance.diagnosis.report import _merge_page_size_raise
    groups = _groups("wrong-slot:tokens-moved@plain", "raises:IndexError@page-size", "validation:accepted")
    _merge_page_size_raise(groups)
    assert sorted(groups) == ["validation:accepted", "wrong-slot:tokens-moved@plain"], sorted(groups)
    for apart in (("scale:inverted@any", "raises:IndexError@page-size"),  # no slot defect: its own
                  ("wrong-slot:tokens-moved@plain", "raises:IndexError@empty-batch"),  # not the page size
                  ("wrong-slot:tokens-moved@plain", "raises:ValueError@page-size")):  # not an index past the cache
        groups = _groups(*apart)
        _merge_page_size_raise(groups)
        assert sorted(groups) == sorted(apart), sorted(groups)


def test_one_missing_check_is_one_validation_defect() -> None:
    """v's shape never checked: one shape slips through (accepted), another fails later in a reshape
    (other-exception), both on the input-shape class: one defect. Two ways on classes of their own stay two."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_validation_kinds

    def group(key: str, *mutations: str) -> list:
        return [(f"t[{m}]", Finding("validation", key, m, facts={"mutation": m})) for m in mutations]
    groups = {"validation:accepted": group("validation:accepted", "input-shape", "scale-value"),
              "validation:other-exception": group("validation:other-exception", "input-shape")}
    _merge_validation_kinds(groups)
    assert list(groups) == ["validation:accepted"] and len(groups["validation:accepted"]) == 3
    apart = {"validation:writes": group("validation:writes", "overlapping-cache", "cache-overlaps-scale"),
             "validation:accepted": group("validation:accepted", "caches-overlap", "cache-overlaps-scale")}
    _merge_validation_kinds(apart)
    assert sorted(apart) == ["validation:accepted", "validation:writes"]


def test_an_invalid_call_that_raises_a_valid_calls_error_is_that_raise() -> None:
    """A valid [1] scale refused before any argument check: each invalid call raises that same error, unnamed;
    it is the raise's symptom, not a validation defect of its own (held-out batch 57)."""
    from conformance.diagnosis.classify import Finding, error_line
    from conformance.diagnosis.report import _merge_raised_before_checks
    refusal = "ValueError: k_scale must be a 0-d or 1-element tensor, or a [2] tensor, got shape (1,)"
    raised = "raises:ValueError@heads-above:1"
    unnamed = Finding("validation", "validation:unnamed", "aliased-caches: unnamed",
                      facts={"mutation": "aliased-caches", "error": error_line(f"without naming it\n{refusal}")})
    other = Finding("validation", "validation:unnamed", "cache-dtype: unnamed",
                    facts={"mutation": "cache-dtype", "error": error_line("TypeError: bad dtype")})
    groups = {raised: [("r", Finding("raises", raised, "raises", excerpt=f"impl raised {refusal}"))],
              "validation:unnamed": [("a", unnamed), ("b", other)]}
    _merge_raised_before_checks(groups)
    assert [n for n, _ in groups[raised]] == ["r", "a"] and [n for n, _ in groups["validation:unnamed"]] == ["b"]


def test_one_refusal_of_k_and_of_v_is_one_raise() -> None:
    """A [1] scale refused where H > 1: k_scale's refusal under heads-above:1, v_scale's (a 0-d k_scale beside
    it) under scale-kind:tensor0d, one defect under the key of more failures. Refusals of other words stay
    apart."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_kv_raises

    def raised(key: str, n: int, text: str) -> list:
        return [(f"{key}{i}", Finding("raises", key, "raises", excerpt=f"impl raised ValueError: {text}"))
                for i in range(n)]
    heads, kind = "raises:ValueError@heads-above:1", "raises:ValueError@scale-kind:tensor0d"
    other = "raises:ValueError@cache-e5m2"
    groups = {heads: raised(heads, 3, "k_scale must be 0-d or [2], got shape (1,)"),
              kind: raised(kind, 2, "v_scale must be 0-d or [2], got shape (1,)"),
              other: raised(other, 2, "key_cache must be float8_e4m3fn, got float8_e5m2")}
    _merge_kv_raises(groups)
    assert sorted(groups) == [other, heads] and len(groups[heads]) == 5
