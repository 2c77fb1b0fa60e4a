"""The suite's own helpers: where a byte sits, which bytes a call writes, the value hash, strategy
arguments, and the committed H200 red run, which must still replay to its recorded report."""

from __future__ import annotations

import io
import itertools
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from conformance.bytediff import locate
from conformance.cachemap import buffer_size, byte_index, written_mask, written_slots
from strategies import cases
from strategies.build import GUARD_BYTES, _hash32_int, hash32
from strategies.case import Case, Layout
from tools import repro

RED_RUN = Path(__file__).resolve().parent.parent / "docs" / "results" / "h200-red-run-2026-12-02.json"
M32 = 0xFFFFFFFF


def _lowbias32(x: int) -> int:
    """Wellons' lowbias32 in plain Python integers: an independent statement of strategies.build.hash32."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def test_value_hash_is_lowbias32_and_stable():
    xs = [0, 1, 2, 3, 0x7FFFFFFF, 0x80000000, M32, 123456789, 2**31 + 12345]
    got = hash32(torch.tensor(xs, dtype=torch.int64)).tolist()
    assert got == [_lowbias32(x) for x in xs]
    assert [_hash32_int(x) for x in xs] == got  # the stream keys' integer form, too
    # Failure files (format 2) rebuild their values from these: a change here breaks every saved Case.
    assert got[1:3] == [1753845952, 3507691905] and got[7] == 2834422664


@st.composite
def _layout_cases(draw: st.DrawFn) -> Case:
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.integers(1, 5)))
    layout = Layout(tuple(draw(st.permutations(range(4)))), tuple(draw(st.lists(st.integers(0, 2), min_size=4,
                                                                                 max_size=4))),
                    draw(st.integers(1, 3)), draw(st.integers(0, 5)))
    slots = shape[0] * shape[1]
    locs = tuple(draw(st.lists(st.integers(-2, slots + 2), min_size=1, max_size=4)))
    return Case(num_tokens=len(locs), num_heads=shape[2], head_dim=shape[3], page_size=shape[1], num_pages=shape[0],
                cache_loc=locs, k_cache_layout=layout)


@given(_layout_cases())
def test_locate_inverts_the_strided_view(case: Case):
    """locate (divmod over the layout) and byte_index (torch.as_strided) agree on every byte."""
    index = byte_index(case, "k_cache")
    inside = {}
    for p, o, h, d in itertools.product(*(range(n) for n in case.cache_shape)):
        inside[int(index[p, o, h, d])] = (p, o, h, d)
    for flat in range(buffer_size(case, "k_cache")):
        pos = locate(case, "k_cache", flat)
        if flat in inside:
            assert (pos.region, (pos.page, pos.offset, pos.head, pos.dim)) == ("view", inside[flat])
        else:
            guard = "guard-before" if flat < GUARD_BYTES else "guard-after" \
                if flat >= buffer_size(case, "k_cache") - GUARD_BYTES else "gap"
            assert pos.region == guard, (flat, pos)


@given(_layout_cases())
def test_written_mask_is_the_named_in_range_slots(case: Case):
    mask = written_mask(case, "k_cache")
    slots = set(written_slots(case))
    assert slots == {s for s in case.cache_loc if 0 <= s < case.num_slots}
    for flat in range(mask.numel()):
        pos = locate(case, "k_cache", flat)
        assert bool(mask[flat]) == (pos.region == "view" and pos.slot(case.page_size) in slots), (flat, pos)


@pytest.mark.parametrize("kwargs, says", [
    (dict(checked=True, allow_out_of_range=True), "checked=True, allow_out_of_range=True"),
    (dict(recipes=("nope",)), "unknown recipes"),
    (dict(recipes=()), "at least one recipe"),
    (dict(size="huge"), "'small' or 'large'"),
    (dict(max_tokens=-1), "must be >= 0"),
])
def test_cases_rejects_bad_arguments_when_built(kwargs, says):
    with pytest.raises(InvalidArgument, match=says):
        cases(**kwargs)  # no draw: the strategy itself refuses


def test_committed_h200_red_run_replays_its_recorded_report():
    """A GPU failure file from 2026-12-02, replayed on this machine: the same report, exit 1."""
    record = json.loads(RED_RUN.read_text())
    spec = record["impl"]["name"]  # examples/broken_impl.py:..., relative to the repository root
    args = repro._parser().parse_args([str(RED_RUN), "--impl", str(RED_RUN.parent.parent.parent / spec)])
    out = io.StringIO()
    rc = repro.replay(str(RED_RUN), args, out)
    assert rc == 1 and record["report"] in out.getvalue(), out.getvalue()


def test_a_reference_failure_is_blamed_on_the_suite(monkeypatch):
    """If the specification itself raises on a Case, no report may call it the implementation's defect."""
    from conformance import harness
    from conformance.diagnosis.classify import classify_failure
    from conformance.impls import Implementation
    from kernel import naive_fp8_set_kv_buffer

    def broken_reference(**kwargs):
        raise RuntimeError("value cannot be converted to type float without overflow")

    monkeypatch.setattr(harness, "naive_fp8_set_kv_buffer", broken_reference)
    case = Case(num_tokens=1, num_heads=1, head_dim=4, page_size=1, num_pages=1, cache_loc=(0,))
    impl = Implementation("reference", naive_fp8_set_kv_buffer, {})
    with pytest.raises(harness.SuiteError, match="not the implementation under test") as info:
        harness.check_case(case, impl, torch.device("cpu"))
    [finding] = classify_failure(info.value, "test_bit_exact", "test_bit_exact", {}, impl, torch.device("cpu"))
    assert finding.key == "unclassified:suite" and "suite bug" in finding.title, finding


def test_the_gpu_running_out_of_memory_in_the_suite_is_not_a_defect():
    """Another process holding the GPU is the machine's state: no defect, and no suite bug either."""
    from conformance import harness
    from conformance.diagnosis.classify import classify_failure
    from conformance.impls import Implementation
    from kernel import naive_fp8_set_kv_buffer

    # raised in a suite frame (conformance/harness.py's name: a graph pool's allocation, as seen on an H100)
    suite_frame = compile('raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has '
                          'a total capacity of 79.18 GiB of which 13.50 MiB is free.")',
                          str(Path(harness.__file__)), "exec")
    try:
        exec(suite_frame, {"torch": torch})
    except torch.OutOfMemoryError as exc:
        error = exc
    impl = Implementation("reference", naive_fp8_set_kv_buffer, {})
    [finding] = classify_failure(error, "test_graphs", "test_replay_new_contents", {}, impl, torch.device("cpu"))
    assert finding.key == "unclassified:out-of-memory" and "other processes" in finding.title, finding


def test_the_gpu_running_out_of_memory_in_the_implementation_is_not_a_defect_unless_it_asks_past_the_card():
    """An implementation's own allocation (a torch kernel's temporaries) or a CUDA graph's pool that found the card
    full is the machine's too (nine reports side by side on an H100 read it as raises:OutOfMemoryError,
    graph:capture and crash); an allocation larger than the whole card is the implementation's."""
    from conformance.diagnosis.classify import classify_failure, out_of_memory
    from conformance.harness import ConformanceFailure

    full = ("CUDA out of memory. Tried to allocate {} GiB. GPU 0 has a total capacity of 79.18 GiB of which "
            "13.50 MiB is free. Process 4242 has 21.00 GiB memory in use.")
    assert out_of_memory(full.format("2.00")) and not out_of_memory(full.format("120.00"))
    assert out_of_memory("AcceleratorError: CUDA error: out of memory")
    assert not out_of_memory("IndexError: index 2048 is out of bounds for dimension 0 with size 2048")
    for asked, machine in (("2.00", True), ("120.00", False)):
        failure = ConformanceFailure("reference: raises on a valid call:\nreference raised OutOfMemoryError: "
                                     f"{full.format(asked)}")
        found = classify_failure(failure, "test_bit_exact", "test_bit_exact", {}, None, None)
        assert [f.key == "unclassified:out-of-memory" for f in found] == [machine], found


def test_a_failed_big_cache_test_lets_go_of_its_buffers():
    """pytest keeps a failed test's traceback until the next failure: test_bigcache raises its failure again
    without the frames that hold 6 to 21 GiB, so side-by-side reports do not fill the card between them."""
    import gc
    import weakref

    from conformance.harness import ConformanceFailure
    from conformance.test_bigcache import _released

    held: list = []

    def check() -> None:
        buffer = torch.zeros(1024)
        held.append(weakref.ref(buffer))
        raise ConformanceFailure("impl: differs from the reference on a big cache")

    with pytest.raises(ConformanceFailure, match="big cache") as info:
        _released(check)
    gc.collect()
    assert held[0]() is None, "the failure still holds the check's buffer"
    assert "differs" in str(info.value)


def _always_tensor0d(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                     use_triton=True, *, recipe="unfused", checked=False):
    """An implementation that rounds a tensor scale to the input dtype whatever recipe it is told."""
    from kernel import naive_fp8_set_kv_buffer
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
                            recipe="unfused-tensor0d", checked=checked)


def _every_scale_findings(fn, dtype: str, scale) -> list:
    """What the classifier makes of fn's failure over all `dtype` patterns (both scales `scale`,
    recipe unfused-nan), read as test_all_patterns_every_scale's, on the CPU."""
    import tempfile

    from conformance.diagnosis.classify import classify_failure
    from conformance.harness import ConformanceFailure
    from conformance.impls import Implementation
    from conformance.test_exhaustive import check_patterns, pattern_case

    impl = Implementation(fn.__name__.strip("_"), fn, {})
    cpu = torch.device("cpu")
    # the failure saves its Case (the classifier reads it back): not into this repository's failures/
    with pytest.MonkeyPatch.context() as patched, tempfile.TemporaryDirectory() as failures:
        patched.setenv("KVFP8_FAILURES", failures)
        with pytest.raises(ConformanceFailure) as info:
            check_patterns(pattern_case(dtype, scale, scale, "unfused-nan"), impl, cpu)
        return classify_failure(info.value, "test_all_patterns_every_scale", "test_exhaustive",
                                {"dtype": dtype, "recipe": "unfused-nan"}, impl, cpu)


def test_a_recipe_other_than_the_stacks_own_is_said_so():
    """A vLLM kernel identified as multiplying by 1/s conforms to that recipe, but not to vLLM's own x / s: the
    report's recipe line says so; a stack with no one recipe (SGLang's) says nothing."""
    from conformance.conventions import SGLANG, VLLM
    assert "vllm stack's own recipe (divide)" in VLLM.stack_note("single")
    assert VLLM.stack_note("divide") == "" and VLLM.stack_note(None) == "" and SGLANG.stack_note("divide") == ""


def test_every_scale_exhaustive_failure_is_classified_by_its_case():
    """test_all_patterns_every_scale loops over scales (no scale parameter): the classifier replays the
    Case its report names, so the defect gets its recipe, not a bare "writes wrong bytes"."""
    from strategies.case import Scale

    scale = Scale("tensor0d", 0.30000001192092896)
    findings = _every_scale_findings(_always_tensor0d, "float16", scale)
    assert [f.key for f in findings] == ["rounding:unfused-tensor0d@any"], findings


def _keeps_nan_sign(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                    use_triton=True, *, recipe="unfused", checked=False):
    """The reference, except that a negative NaN input writes 0xFF (SGLang's unfused path on CUDA)."""
    from kernel import naive_fp8_set_kv_buffer
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
                            recipe=recipe, checked=checked)
    for x, cache in ((k, k_cache), (v, v_cache)):
        negative_nan = (x.isnan() & x.float().signbit()).reshape(x.shape[0], -1)
        slots = cache.view(torch.uint8).reshape(-1, negative_nan.shape[1])  # a view: contiguous caches
        rows = slots[cache_loc.long()]
        rows[negative_nan] = 0xFF
        slots[cache_loc.long()] = rows


def test_a_nan_sign_defect_is_not_a_wrong_slot():
    """Over all bfloat16 patterns, a token whose row is negative overflow and NaN (0xFF kept) equals,
    byte for byte, the row unfused-nan writes for a token of negative overflow only: still a NaN-sign
    defect, not a token written to another's slot (the H200 report of examples/sglang_unfused.py)."""
    from strategies.case import Scale

    findings = _every_scale_findings(_keeps_nan_sign, "bfloat16", Scale("none", 1.0))
    assert {f.key for f in findings} == {"encoding:nan-sign@any"}, findings


@pytest.mark.parametrize("value", [0.3, 1e-45, 3.4028235677973366e38, 1e39, -1e300, 2.0**-149 * 1.5])
def test_a_float_scale_is_its_fp32_rounding(value: float):
    """The reference's float scale is torch.tensor(value, float32): RNE to fp32, inf past its range (the
    classifier asks for 1/s of tiny scales), never an error."""
    from kernel.plan import ScaleArg
    from kernel.reference import scale_to_fp32

    got = scale_to_fp32(ScaleArg("float", value, None), torch.device("cpu"))
    assert got.dtype == torch.float32 and got.shape == ()
    assert got.view(torch.int32).item() == torch.tensor(value, dtype=torch.float32).view(torch.int32).item()


def _each_cache_with(k_recipe, v_recipe, k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
                     checked):
    """The reference, K's cache under one recipe and V's under another (the other cache's writes go to a copy)."""
    from kernel import naive_fp8_set_kv_buffer
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache.clone(), cache_loc, k_scale, v_scale, page_size,
                            recipe=k_recipe, checked=checked)
    naive_fp8_set_kv_buffer(k, v, k_cache.clone(), v_cache, cache_loc, k_scale, v_scale, page_size,
                            recipe=v_recipe, checked=checked)


def _divides_by_tensor1(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                        use_triton=True, *, recipe="unfused", checked=False):
    """The reference, except that V, whose scale is a 1-element tensor here, is divided by it exactly
    (`divide`), as torch on CUDA divides by a tensor but multiplies by a float's reciprocal."""
    _each_cache_with(recipe, "divide", k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, checked)


def test_a_tiny_scale_case_is_told_apart_by_plain_values():
    """Under a scale of 2**-149 every drawn input is zero, which reads the same divided by the scale
    or with the scale ignored. The classifier replays the Case with plain values over its first
    inputs: `divide` stays, 'ignores a scale' goes (the H200 report of examples/sglang_unfused.py)."""
    from conformance.diagnosis.capabilities import probe_findings
    from conformance.diagnosis.classify import classify_case
    from conformance.impls import Implementation
    from strategies.case import Scale

    impl = Implementation("divides-by-tensor1", _divides_by_tensor1, {})
    case = Case(num_tokens=2, num_heads=1, head_dim=8, page_size=1, num_pages=2, cache_loc=(1, 0),
                v_scale=Scale("tensor1", 2.0**-149), recipe="unfused-nan")
    # As a failing property's Case, and as a capability probe's (which did not narrow before 2026-12-03-e).
    cpu = torch.device("cpu")
    for [finding] in (classify_case(case, impl, cpu), probe_findings(case, impl, cpu)[0]):
        explanations = finding.facts["explanations"]
        assert finding.key == "rounding" and "rounding:divide" in explanations, finding
        assert not any(e.startswith("scale:") for e in explanations), finding


def _divides_with_nan_overflow(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                               use_triton=True, *, recipe="unfused", checked=False):
    """`k.div_(scale).to(float8_e4m3fn)` on torch <= 2.11 (CUDA): a 1-element tensor scale divides
    exactly, a 0-d one is first rounded to the input dtype, the quotient is rounded to the input dtype,
    and the cast gives NaN past the e4m3 range. No recipe of the table has that overflow rule."""
    from kernel.recipe import Recipe

    def recipe_of(scale):
        rounded = isinstance(scale, torch.Tensor) and scale.dim() == 0
        return Recipe("divide-nan", "divide", "input" if rounded else "fp32", "input", "nan", "this test")
    _each_cache_with(recipe_of(k_scale), recipe_of(v_scale), k, v, k_cache, v_cache, cache_loc, k_scale, v_scale,
                     page_size, checked)


def test_an_arithmetic_is_told_by_its_finite_bytes():
    """torch 2.11's division on CUDA has the arithmetic of unfused-tensor1 (a 1-element scale) or
    unfused-tensor0d (a 0-d one) with NaN past the range. Held to unfused-nan, that overflow rule is
    right, so the arithmetic is the defect, and the plain-value replay must not rule it out for its
    NaN bytes (the H200 report of examples/sglang_unfused.py):
    - a scale of 2**-149: zero gives 0 divided, NaN held to unfused-nan (0 * inf), which also reads as
      an ignored, swapped or inverted scale; plain values overflow, so only the divisions remain;
    - a 0-d scale of 1 + 2**-8, a bf16 tie that rounds to 1.0, beside a k_scale of 1.0: V reads as
      written with K's scale too, but it is unfused-tensor0d's rounding of the scale."""
    from conformance.diagnosis.capabilities import probe_findings
    from conformance.impls import Implementation
    from strategies.case import Scale

    impl = Implementation("divides-with-nan-overflow", _divides_with_nan_overflow, {})
    cpu = torch.device("cpu")
    tiny = Case(num_tokens=2, num_heads=1, head_dim=8, page_size=1, num_pages=2, cache_loc=(1, 0),
                v_scale=Scale("tensor1", 2.0**-149), recipe="unfused-nan")
    [finding] = probe_findings(tiny, impl, cpu)[0]
    assert finding.key == "rounding" and "rounding:unfused-tensor1" in finding.facts["explanations"], finding
    assert not any(e.startswith("scale:") for e in finding.facts["explanations"]), finding
    tie = Case(num_tokens=1, num_heads=1, head_dim=64, page_size=1, num_pages=1, cache_loc=(0,),
               k_scale=Scale("tensor1", 1.0), v_scale=Scale("tensor0d", 1.00390625), recipe="unfused-nan")
    [finding] = [f for f in probe_findings(tie, impl, cpu)[0] if f.facts.get("which") == "v_cache"]
    assert "rounding:unfused-tensor0d" in finding.facts["explanations"], finding


def _zero_or_one(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                 use_triton=True, *, recipe="unfused", checked=False):
    """Writes a zero input as its signed zero byte (0x00, 0x80) and any other as 0x01: no recipe's arithmetic."""
    loc = cache_loc.long()
    for x, cache in ((k, k_cache), (v, v_cache)):
        out = cache.view(torch.uint8).reshape(-1, *x.shape[1:])
        out[loc] = torch.where(x == 0, torch.signbit(x).to(torch.uint8) * 0x80, 1).to(torch.uint8)


def test_values_no_recipe_explains_are_said_so():
    """Under a scale of 2**-149 every drawn input is zero, and zero reads as divided by the scale, as an
    ignored scale, a swapped one or an inverted one. Plain values rule out each (0x01 is none of
    them), so the finding is values that no recipe explains."""
    from conformance.diagnosis.capabilities import probe_findings
    from conformance.impls import Implementation
    from strategies.case import Scale

    impl = Implementation("zero-or-one", _zero_or_one, {})
    case = Case(num_tokens=2, num_heads=1, head_dim=8, page_size=1, num_pages=2, cache_loc=(1, 0),
                v_scale=Scale("tensor1", 2.0**-149), recipe="unfused-nan")
    findings = probe_findings(case, impl, torch.device("cpu"))[0]
    [finding] = [f for f in findings if f.facts.get("which") == "v_cache"]
    assert finding.key == "wrong-bytes:values", findings
    assert {"scale:ignored", "rounding:divide"} <= set(finding.facts["ruled_out"]), finding.facts


def _ignores_v_scale(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                     use_triton=True, *, recipe="unfused", checked=False):
    """The reference, except that V is written as if v_scale were None."""
    from kernel import naive_fp8_set_kv_buffer
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, None, page_size, recipe=recipe,
                            checked=checked)


def test_a_row_equal_to_another_tokens_by_chance_is_the_scale_defect():
    """Token 1's V is token 0's times the scale, 8: with the scale ignored, token 0's row equals token 1's
    expected row byte for byte. The rows are still an ignored scale, as every row's own token explains
    them, not a token written to another's slot (the H200 report of examples/sglang_triton_planted.py)."""
    from conformance.diagnosis.classify import classify_case
    from conformance.impls import Implementation
    from strategies.case import Scale

    def one_row_times_eight(built):
        values = torch.tensor([[[0.0217742919921875, -1.5, 3.0, 0.125]]], dtype=torch.float16)
        logical = torch.cat([values, values * 8])  # exact: a power of two
        built.v.copy_(logical.reshape(built.v.shape))
        built.v_logical = logical
        return built

    impl = Implementation("ignores-v-scale", _ignores_v_scale, {})
    case = Case(num_tokens=2, num_heads=1, head_dim=4, page_size=1, num_pages=3, cache_loc=(2, 0),
                input_dtype="float16", v_scale=Scale("float", 8.0), recipe="single")
    findings = classify_case(case, impl, torch.device("cpu"), fill=one_row_times_eight)
    assert [f.key for f in findings] == ["scale:ignored"], findings


def test_a_lost_context_after_an_invalid_call_is_the_implementation_crash(monkeypatch, capsys, tmp_path):
    """test_errors' calls do not wait for the device: when one lost the CUDA context, the run ends there,
    blaming the implementation, with no Case saved (an invalid call is not a Case that replays)."""
    from conformance import harness
    from conformance.impls import Implementation
    from kernel import naive_fp8_set_kv_buffer

    impl = Implementation("oob-writer", naive_fp8_set_kv_buffer, {})
    # Undone before this test's teardown: the session's teardown check asks the same function, and on a
    # CUDA machine it would end this worker.
    with monkeypatch.context() as patched:
        patched.setattr(harness, "cuda_context_lost", lambda device: True)
        patched.setattr(harness, "RUNNER", "")  # as in a tool: report and return, not exit
        patched.setenv("KVFP8_FAILURES", str(tmp_path))
        harness.abandon_if_context_lost(impl, torch.device("cpu"), "on an invalid call (page-size-mismatch)")
    err = capsys.readouterr().err
    assert "oob-writer crashed the CUDA context" in err and "page-size-mismatch" in err, err
    assert not list(tmp_path.iterdir())


def test_the_reference_keeps_no_device_table_a_kernel_could_overwrite():
    """A stray write by the kernel under test can land on any live device memory: the reference's fp8
    magnitude table is built for each call, so overwriting one does not change the next expected byte."""
    from kernel.recipe import get_recipe
    from kernel.reference import _magnitudes, encode_e4m3
    cpu = torch.device("cpu")
    y = torch.tensor([0.0, 1.0, -3.5, 448.0])
    before = encode_e4m3(y, get_recipe("single"))
    _magnitudes(cpu).fill_(-1.0)  # what a write past a cache could do to a cached table
    assert torch.equal(encode_e4m3(y, get_recipe("single")), before)


def test_a_capture_pauses_the_garbage_collector_and_restores_its_state():
    """conformance.capture.gc_paused: off inside (a collection during a capture can destroy an earlier graph,
    pytorch#161037), back to its earlier state after, an exception included; an already paused collector stays
    paused."""
    import gc

    from conformance.capture import gc_paused

    was = gc.isenabled()
    try:
        gc.enable()
        with gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled()
        with pytest.raises(RuntimeError), gc_paused():
            raise RuntimeError("a failed capture")
        assert gc.isenabled()
        gc.disable()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()
