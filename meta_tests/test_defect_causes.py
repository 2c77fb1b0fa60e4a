"""A defect is reported as its cause: not as Hypothesis's error about the draws, not as a suite assertion,
not outside the argument contract, and with a Case that replays.

- No property draws after it has run the implementation (the draws would depend on how the call went:
  a stateful implementation then gives FlakyStrategyDefinition instead of its failure).
- An exception raised inside the implementation's frames (its own `assert`) is "raises on a valid call".
- An invalid call that crashes or hangs the process is an argument-contract finding naming the mutation.
- An exhaustive failure saves its Case with the fill that makes its values, and `tools.repro` replays it.
"""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conformance.conventions import detect
from conformance.harness import ConformanceFailure, describe_error, execute, fail, raised_by_implementation
from conformance.impls import Implementation
from strategies.build import build
from strategies.case import Case, Layout, Override, Scale

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")
#: Calls that run the implementation (a module's own helpers that contain one are added per module).
RUNS_IMPL = {"check_case", "execute", "run_impl", "captured", "capture", "check_replay", "check_patterns",
             "run", "invoke", "replay"}


def _called(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _runs_impl(node: ast.AST, names: set[str]) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and _called(n) in names]


def _uses_data(node: ast.AST) -> list[ast.Name]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == "data"]


def draws_after_running(source: str) -> list[str]:
    """Lines where a property (a function taking `data`) draws after it has run the implementation."""
    tree = ast.parse(source)
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    names = set(RUNS_IMPL)
    while True:  # the module's helpers that run it, transitively
        more = {f.name for f in functions if f.name not in names and _runs_impl(f, names)}
        if not more:
            break
        names |= more
    found = []
    for f in functions:
        if "data" not in [a.arg for a in f.args.args + f.args.kwonlyargs]:
            continue
        calls = _runs_impl(f, names)
        if not calls:
            continue
        first = min(calls, key=lambda c: (c.lineno, c.col_offset))
        found += [f"{f.name}: line {n.lineno} draws after line {first.lineno} ran the implementation"
                  for n in _uses_data(f) if n.lineno > first.end_lineno]
        for loop in (n for n in ast.walk(f) if isinstance(n, (ast.For, ast.While))):
            if _runs_impl(loop, names) and _uses_data(loop):
                found.append(f"{f.name}: the loop at line {loop.lineno} draws and runs the implementation")
    return found


@pytest.mark.parametrize("module", sorted(p.name for p in (ROOT / "conformance").glob("test_*.py")))
def test_no_property_draws_after_running_the_implementation(module):
    """test_graphs drew new contents (and test_repeat its second call) after the first call: with a stateful
    implementation the same example drew more or less, and Hypothesis reported FlakyStrategyDefinition."""
    assert draws_after_running((ROOT / "conformance" / module).read_text()) == []


def test_the_draw_order_check_sees_the_old_pattern():
    old = ("def test_x(data, impl, device):\n    case = data.draw(cases())\n    check_case(case, impl, device)\n"
           "    second = data.draw(more(case))\n")
    loop = ("def _go(impl, b):\n    impl.invoke(b)\n\ndef test_y(data, impl):\n    for r in range(3):\n"
            "        new = data.draw(x)\n        _go(impl, new)\n")
    assert draws_after_running(old) == ["test_x: line 4 draws after line 3 ran the implementation"]
    assert draws_after_running(loop) == ["test_y: the loop at line 5 draws and runs the implementation"]


def _pytest(args: list[str], tmp_path: Path) -> str:
    env = {**os.environ, "KVFP8_FAILURES": str(tmp_path / "failures"), "HYPOTHESIS_PROFILE": "ci",
           "OMP_NUM_THREADS": "1"}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    return proc.stdout + proc.stderr


def test_a_stateful_implementation_gets_its_failure_not_flaky_draws(tmp_path):
    """meta_tests/stateful_impl.py flips a byte every third call, so whether an example fails depends on the
    calls before it. Before the fix test_repeat ended in FlakyStrategyDefinition; now in the byte report."""
    out = _pytest(["conformance/test_repeat.py", "--impl", "meta_tests/stateful_impl.py:fused_fp8_set_kv_buffer",
                   "--recipe", "divide"], tmp_path)
    assert "FlakyStrategyDefinition" not in out, out
    assert "differs from the reference (recipe divide)" in out and "1 failed" in out, out


# -- an exception raised inside the implementation ------------------------------------------------------

def continuous_heads_only(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                          use_triton=True):
    """Refuses with an assert, as vLLM's Triton write does a layout it cannot handle (SGLang convention)."""
    assert k.stride(-2) < 0, "only continous heads are supported"  # never: it always refuses


def _small() -> Case:
    return Case(num_tokens=2, num_heads=2, head_dim=8, page_size=2, num_pages=2, cache_loc=(1, 2),
                k_scale=Scale("float", 0.5), v_scale=Scale("float", 0.5), recipe="single")


def _findings(exc: BaseException, module: str, impl: Implementation | None = None, params=None) -> list:
    from conformance.diagnosis.classify import classify_failure
    return classify_failure(exc, "test_x", module, params or {}, impl, CPU if impl else None)


def test_an_implementations_assert_is_a_raise(tmp_path, monkeypatch):
    """execute (test_isolation, test_equivalence, test_exhaustive, the graphs' eager calls) let the
    implementation's AssertionError escape as it was, which read as "a suite assertion failed"."""
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = Implementation("asserts", continuous_heads_only, convention=detect(continuous_heads_only))
    with pytest.raises(ConformanceFailure, match="raises on a valid call") as info:
        execute(impl, build(_small(), CPU))
    assert "replay: python -m tools.repro" in str(info.value)
    [finding] = _findings(info.value, "test_isolation", impl)
    assert finding.cls == "raises" and "AssertionError" in finding.key + finding.title, finding
    # The same exception raised bare (any other path) is told by its traceback.
    try:
        impl.invoke(build(_small(), CPU).call())
    except AssertionError as exc:
        bare = exc
    assert raised_by_implementation(bare)
    [finding] = _findings(bare, "test_graphs")
    assert finding.cls == "raises" and "AssertionError" in finding.key + finding.title, finding
    # A graph's warm-up call (test_graphs.capture) reports it as every property does, with the Case saved.
    with pytest.raises(ConformanceFailure) as info:
        fail(impl, "raises on a valid call:", describe_error(impl, bare), _small(), kind="AssertionError")
    [finding] = _findings(info.value, "test_graphs", impl)
    assert finding.cls == "raises" and "AssertionError" in finding.key + finding.title, finding
    assert finding.case_file and finding.replayable, finding


def test_a_suite_assertion_stays_unclassified():
    from conformance.test_graphs import restore

    built = build(_small(), CPU)
    with pytest.raises(AssertionError) as info:
        restore(built, {})  # the suite's own assert, in conformance/
    assert not raised_by_implementation(info.value)
    [finding] = _findings(info.value, "test_graphs")
    assert finding.key == "unclassified:assertion", finding


# -- an invalid argument that crashes or hangs -----------------------------------------------------------

def test_a_crash_or_hang_on_an_invalid_call_is_in_the_argument_contract(tmp_path):
    from conformance.diagnosis import report
    from conformance.diagnosis.capabilities import argument_rows
    from conformance.diagnosis.recorder import params_file

    node = "conformance/test_errors.py::test_invalid_argument_raises_and_writes_nothing[impl-x.py:f-scale-device]"
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps({"nodeid": node, "when": "call", "outcome": "failed", "duration": 1.0,
                                   "params": {}, "leaves": [],
                                   "longrepr": f"worker 'gw1' crashed while running '{node}'"}) + "\n")
    params_file(records).write_text(json.dumps({node: {"mutation": "scale-device", "target": "impl"}}))
    nodes = report.nodes_from(report.read_records(records))
    assert nodes[node].outcome == "crashed"
    defects = report.defects_from(nodes, tmp_path / "cases", {"args": ""})
    assert [(d.key, d.cls, d.cell) for d in defects] == [("validation:crash", "validation", "crashes")], defects
    assert "scale-device" in defects[0].detail, defects[0]
    row = next(r for r in argument_rows() if r.id == "arg-scale-device")
    cell = report.cell_for(row, nodes, defects, {"errors"}, argument=True)
    assert cell["status"] == "crashes" and "scale-device" in cell["detail"], cell
    # One process (no xdist): pytest-timeout fails the hung test with "Timeout >N s".
    [hang] = _findings(pytest.fail.Exception("Timeout >240.0s"), "test_errors", params={"mutation": "scale-device"})
    assert (hang.key, hang.cell, hang.facts["mutation"]) == ("validation:crash", "crashes", "scale-device"), hang


# -- an exhaustive failure saves its Case, with its fill ------------------------------------------------

def always_divide(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                  *, recipe="unfused", checked=False):
    """Divides whatever recipe it is told."""
    from kernel import naive_fp8_set_kv_buffer
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe="divide",
                            checked=checked)


def test_an_exhaustive_failure_saves_its_case_and_replays(tmp_path, monkeypatch):
    from conformance.artifacts import load_case
    from conformance.test_exhaustive import FILL, check_patterns, pattern_case
    from tools import repro

    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = Implementation("always_divide", always_divide, {}, f"{Path(__file__).resolve()}:always_divide")
    scale = Scale("float", 0.30000001192092896)
    with pytest.raises(ConformanceFailure) as info:
        check_patterns(pattern_case("bfloat16", scale, scale, "single"), impl, CPU)
    message = str(info.value)
    [path] = list(tmp_path.glob("*.json"))
    assert f"replay: python -m tools.repro {path}" in message, message
    case, record = load_case(path)
    assert record["fill"] == FILL and case.num_tokens * case.num_heads * case.head_dim == 2**16
    out = io.StringIO()
    rc = repro.replay(str(path), repro._parser().parse_args([str(path)]), out)
    assert rc == 1 and "fill     all-patterns" in out.getvalue(), out.getvalue()
    assert "the same as the recorded one" in out.getvalue(), out.getvalue()
    findings = _findings(info.value, "test_exhaustive", impl, {"dtype": "bfloat16", "recipe": "single"})
    assert findings and all(f.case_file == str(path) and f.replayable for f in findings), findings


# -- a per-head failure whose cause is not the per-head scales --------------------------------------------------

def padding_wraps_per_head(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """examples/vllm_divide.py (per-head scales accepted) whose padding slot -1 wraps to the last slot."""
    from examples.vllm_divide import reshape_and_cache_flash
    slots = key_cache.shape[0] * key_cache.shape[1]
    reshape_and_cache_flash(key, value, key_cache, value_cache, torch.where(slot_mapping == -1, slots - 1,
                                                                             slot_mapping),
                            kv_cache_dtype, k_scale, v_scale)


def _per_head_message(impl: Implementation, case: Case, values: dict, step: int) -> ConformanceFailure:
    from conformance.test_per_head import per_tensor_twin
    return ConformanceFailure(f"{impl.name}: differs from the reference with per-head scales ({values}):\n"
                              f"expected 0x00 actual 0x38 at view ...\n{per_tensor_twin(case, values, step)}")


def _per_head_impl(fn) -> Implementation:
    from conformance.conventions import get_convention
    return Implementation(fn.__name__, fn, convention=get_convention("vllm-per-head"))


_PER_HEAD_CASE = Case(num_tokens=2, num_heads=3, head_dim=8, page_size=4, num_pages=2, cache_loc=(1, -1),
                      k_scale=Scale("tensor1", 0.5), v_scale=Scale("tensor1", 0.5), recipe="divide")


def _per_head_raises(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """Per-head scales indexed past their end (an element's head from the cache's head stride)."""
    from examples.vllm_divide import reshape_and_cache_flash
    if k_scale.numel() > 1:
        raise IndexError("index 3 is out of bounds for dimension 0 with size 3")
    reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def test_a_raise_of_the_e5m2_per_head_property_is_a_raise(tmp_path, monkeypatch):
    """test_e5m2's per-head property says "raises on a valid e5m2 call": a raise, keyed as test_per_head's own
    raise of the same call is, not wrong bytes of a per-head scale (batch 34: two defects for one IndexError)."""
    from conformance.diagnosis.classify import classify_failure
    from conformance.test_per_head import per_tensor_twin
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = _per_head_impl(_per_head_raises)
    values = {"k_scale": (0.5, 2.0, 0.3)}
    error = (f"{impl.name} raised IndexError: index 3 is out of bounds for dimension 0 with size 3\n\n"
             f"{per_tensor_twin(_PER_HEAD_CASE, values, 1)}")
    keys = set()
    for module, test, what in (("test_e5m2", "test_e5m2_per_head_scales", "a valid e5m2 call with per-head "
                                "k_scale [0.5, 2.0, 0.3]"), ("test_per_head", "test_per_head_scales_are_bit_exact",
                                                             f"a valid call with per-head scales ({values})")):
        exc = ConformanceFailure(f"{impl.name}: raises on {what}:\n{error}")
        keys |= {f.key for f in classify_failure(exc, test, module, {}, impl, CPU)}
    assert len(keys) == 1 and next(iter(keys)).startswith("raises:IndexError"), keys


def _per_head_raises_head_major(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """An element's [H] scale indexed with the cache's head stride: past the scale's end on a head-major cache."""
    from examples.vllm_divide import reshape_and_cache_flash
    if k_scale.numel() > 1 and key_cache.stride(-2) != key_cache.shape[-1]:
        raise IndexError("index 3 is out of bounds for dimension 0 with size 3")
    reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def test_a_per_head_raise_names_the_layout_that_triggers_it(tmp_path, monkeypatch):
    """The per-head call replayed with each of its Case's dimensions moved back: the raise vanishes with the
    caches contiguous, so that is its trigger (batch 34: an element's scale indexed with the head stride)."""
    from conformance.diagnosis.classify import classify_failure
    from conformance.test_per_head import per_tensor_twin
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = _per_head_impl(_per_head_raises_head_major)
    head_major = Layout((0, 2, 1, 3), (0, 0, 0, 0))
    case = _PER_HEAD_CASE.replace(k_cache_layout=head_major, v_cache_layout=head_major)
    values = {"k_scale": (0.5, 2.0, 0.3)}
    exc = ConformanceFailure(f"{impl.name}: raises on a valid call with per-head scales ({values}):\n"
                             f"{impl.name} raised IndexError: index 3 is out of bounds for dimension 0 with size 3\n\n"
                             f"{per_tensor_twin(case, values, 1)}")
    [finding] = classify_failure(exc, "test_per_head_scales_are_bit_exact", "test_per_head", {}, impl, CPU)
    assert finding.key == "raises:IndexError@strided-cache", finding


def test_a_per_head_failure_that_its_per_tensor_twin_shows_is_diagnosed_as_the_twin(tmp_path, monkeypatch):
    """Padding that wraps fails the per-head property too (its Cases draw padding); the report replays the same
    call with per-tensor scales, and where that fails the per-head failure is the twin's defect, keyed by its
    trigger, not a second defect `scale:per-head`. Where the twin passes and no wrong reading of the [H] scale
    explains the bytes, it is `scale:per-head`."""
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = _per_head_impl(padding_wraps_per_head)
    values = {"k_scale": (0.5, 2.0, 0.3)}
    [finding] = _findings(_per_head_message(impl, _PER_HEAD_CASE, values, 1), "test_per_head", impl)
    assert finding.key == "padding:wraps-to-end@padding", finding
    plain = _PER_HEAD_CASE.replace(cache_loc=(1, 0))
    [finding] = _findings(_per_head_message(impl, plain, values, 1), "test_per_head", impl)
    assert finding.key == "scale:per-head", finding


def _per_head_e4m3_only(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """A per-head path written for "fp8" alone: with an [H] scale, e4m3 bytes whatever kv_cache_dtype says."""
    from examples.vllm_divide import reshape_and_cache_flash
    if k_scale.numel() > 1 and kv_cache_dtype != "fp8":
        k8, v8 = key_cache.view(torch.uint8), value_cache.view(torch.uint8)
        reshape_and_cache_flash(key, value, k8, v8, slot_mapping, "fp8", k_scale, v_scale)
        return
    reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def test_a_per_head_path_that_ignores_the_format_is_named(tmp_path, monkeypatch):
    """Held-out batch 37: the [H] scales read right, e4m3 bytes in an e5m2 cache. No reading of the scales explains
    them; the reference told e4m3 does."""
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = _per_head_impl(_per_head_e4m3_only)
    case = _PER_HEAD_CASE.replace(cache_loc=(1, 0), cache_dtype="uint8", cache_format="fp8_e5m2")
    [finding] = _findings(_per_head_message(impl, case, {"k_scale": (0.5, 2.0, 0.3)}, 1), "test_per_head", impl)
    assert finding.key == "format:e4m3-bytes@per-head", finding


def _per_head_first_where_d_not_pow2(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                      v_scale):
    """Every head scaled by head 0's scale, only where D is not a power of two (held-out batch 38's Triton write
    indexed the scale by an element's offset over the padded head width)."""
    from examples.vllm_divide import reshape_and_cache_flash
    d = key.shape[-1]
    if k_scale.numel() > 1 and d & (d - 1):
        k_scale = k_scale[:1].expand(k_scale.numel())
    reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def test_a_per_head_rule_on_d_is_the_trigger(tmp_path, monkeypatch):
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = _per_head_impl(_per_head_first_where_d_not_pow2)
    values = {"k_scale": (0.5, 2.0, 0.3)}
    odd = _PER_HEAD_CASE.replace(cache_loc=(1, 0), head_dim=12)
    [finding] = _findings(_per_head_message(impl, odd, values, 1), "test_per_head", impl)
    assert finding.key == "scale:per-head-first@dim-not-pow2", finding


def _misread(read):
    def kernel(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
        from examples.vllm_divide import reshape_and_cache_flash
        reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                read(k_scale), read(v_scale))
    return kernel


def _first_head(s):
    return s[:1] if s.numel() > 1 else s


def _heads_reversed(s):
    return s.flip(0) if s.numel() > 1 else s


def _as_contiguous(s):
    return torch.as_strided(s, s.shape, (1,)) if s.numel() > 1 else s


def _largest_head(s):
    return s.max().reshape(1) if s.numel() > 1 else s


def _tile_of_two(index):
    """One scale a tile of two heads, as a program holding two heads loads it: head h reads index(h)."""
    def read(s):
        return s[[min(index(h), s.numel() - 1) for h in range(s.numel())]] if s.numel() > 1 else s
    return read


@pytest.mark.parametrize(("read", "key", "step"), [(_first_head, "scale:per-head-first", 1),
                                                   (_heads_reversed, "scale:per-head-reversed", 1),
                                                   (_largest_head, "scale:per-head-largest", 1),
                                                   (_as_contiguous, "scale:per-head-stride-ignored", 2),
                                                   (_tile_of_two(lambda h: h - h % 2), "scale:per-head-tile-first", 1),
                                                   (_tile_of_two(lambda h: h // 2), "scale:per-head-tile-index", 1)])
def test_a_per_head_scale_read_wrong_is_named_by_how(read, key, step, tmp_path, monkeypatch):
    """The twin passes (one scale a cache is read right); the [H] scale read as one head's, reduced to its largest
    (held-out batch 47's contiguous fast path), in reverse, as if contiguous, or one scale a tile of heads (the
    tile's first, or the one at the tile's index) gives every wrong byte of the reference with those scales: the
    cause, named."""
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = _per_head_impl(_misread(read))
    case = _PER_HEAD_CASE.replace(cache_loc=(1, 0))
    values = {"v_scale": (0.5, 2.0, 0.3)}
    [finding] = _findings(_per_head_message(impl, case, values, step), "test_per_head", impl)
    assert finding.key == key, finding


def _table_of_four(s):
    """Four scales kept (an array sized for grouped-query models): heads past the fourth read the fourth's."""
    return s[[min(h, 3) for h in range(s.numel())]] if s.numel() > 1 else s


@pytest.mark.parametrize(("read", "key"), [(_first_head, "scale:per-head-first"),
                                           (_largest_head, "scale:per-head-largest"),
                                           (_table_of_four, "scale:per-head-table")])
def test_scales_equal_but_for_one_head_tell_readings_apart_by_distinct_ones(read, key, tmp_path, monkeypatch):
    """A shrunk failure's [H] scales are equal but for the last head, where head 0's scale for every head and a
    table of four scales give the same bytes: the reading that fits is held to distinct scales too (held-out
    batch 40's 16-scale table was read as head 0's)."""
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = _per_head_impl(_misread(read))
    case = _PER_HEAD_CASE.replace(num_heads=5, cache_loc=(1, 0))
    values = {"k_scale": (0.5, 0.5, 0.5, 0.5, 2.0)}
    [finding] = _findings(_per_head_message(impl, case, values, 1), "test_per_head", impl)
    assert finding.key == key, finding


def _per_head_reciprocals(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """With [H] scales, recipe single (x times each head's fp32 reciprocal) where the one-scale path divides
    (held-out batch 42: the H reciprocals computed once)."""
    from examples.vllm_divide import reshape_and_cache_flash
    from kernel import naive_fp8_set_kv_buffer
    if k_scale.numel() == 1 and v_scale.numel() == 1:
        reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)
        return
    naive_fp8_set_kv_buffer(key, value, key_cache, value_cache, slot_mapping, k_scale.reshape(-1),
                            v_scale.reshape(-1), key_cache.shape[1], recipe="single")


def test_a_per_head_path_with_another_recipe_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    """0.02490234375 / 1.7 lies just past an e4m3 midpoint, and times fp32(1 / 1.7) just short of it: one byte."""
    impl = _per_head_impl(_per_head_reciprocals)
    near = Override("k", 8, 0x3CCC, "0.02490234375")  # token 0, head 1 (scale 1.7), dim 0: exact in bf16
    case = _PER_HEAD_CASE.replace(cache_loc=(1, 0), input_dtype="bfloat16", overrides=(near,))
    values = {"k_scale": (0.3, 1.7, 0.1)}
    [finding] = _findings(_per_head_message(impl, case, values, 1), "test_per_head", impl)
    assert finding.key == "rounding:single@per-head", finding


def test_one_value_for_every_head_unlike_one_element_is_diagnosed_as_a_per_head_failure(tmp_path, monkeypatch):
    """test_one_scale_for_every_head_is_the_per_tensor_write compares the implementation with itself; its failure
    carries the per-tensor twin line, so the report diagnoses it as a per-head failure (held-out batch 42: at a
    scale of 2**-149 the per-head path's 1/s is inf, so 0 becomes NaN)."""
    from conformance.test_per_head import per_tensor_twin
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = _per_head_impl(_per_head_reciprocals)
    tiny = 1.401298464324817e-45
    case = _PER_HEAD_CASE.replace(cache_loc=(1, 0), k_scale=Scale("tensor1", tiny),
                                  overrides=(Override("k", 0, 0x0000, "+0"),))
    message = ConformanceFailure(f"{impl.name}: k_scale of {tiny!r} for each of 3 heads writes other bytes than "
                                 f"k_scale [{tiny!r}] (recipe divide; expected: the one-element call's bytes):\n"
                                 f"k_cache: 1 of 64 bytes differ\n{per_tensor_twin(case, {'k_scale': (tiny,) * 3}, 1)}")
    [finding] = _findings(message, "test_per_head", impl)
    assert finding.key == "rounding:single@per-head", finding


def _first_head_and_loc_stride_ignored(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                       v_scale):
    """Two defects: slot_mapping read as if contiguous, and every head scaled by the first head's scale."""
    from examples.vllm_divide import reshape_and_cache_flash
    slots = torch.as_strided(slot_mapping, slot_mapping.shape, (1,))
    reshape_and_cache_flash(key, value, key_cache, value_cache, slots, kv_cache_dtype, _first_head(k_scale),
                            _first_head(v_scale))


def test_a_per_head_defect_behind_its_twins_defect_is_named_too(tmp_path, monkeypatch):
    """The per-head Case has a strided cache_loc, which the per-tensor twin fails on (a defect of its own); with
    that trigger moved back (cache_loc contiguous) the twin passes and the per-head call still fails: the [H]
    scale read wrong is a second defect, not hidden behind the first (a held-out Triton kernel's report)."""
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = _per_head_impl(_first_head_and_loc_stride_ignored)
    case = _PER_HEAD_CASE.replace(cache_loc=(1, 0), loc_step=2)
    keys = {f.key for f in _findings(_per_head_message(impl, case, {"v_scale": (0.5, 2.0, 0.3)}, 1), "test_per_head",
                                     impl)}
    assert keys == {"strides:cache-loc-ignored@strided-loc", "scale:per-head-first"}, keys


def _subnormals_truncated(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
                          tile: int = 0):
    """The encoder's subnormal bytes computed from the unrounded magnitude (rounded toward zero): it shows on every
    call, so a per-head call's per-tensor twin fails too, with no trigger to move back. With `tile`, a second
    defect: the [H] scales read at the index within a tile of that many heads (head h takes scale[h % tile]),
    held-out batch 34's pair."""
    from examples.vllm_divide import reshape_and_cache_flash
    scales = [s.reshape(-1)[torch.arange(s.numel()) % tile] if tile and s.numel() > 1 else s
              for s in (k_scale, v_scale)]
    reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, *scales)
    for x, cache, s in ((key, key_cache, scales[0]), (value, value_cache, scales[1])):
        y = x.float() / s.reshape(1, -1, 1).float()
        flat = cache.view(torch.uint8).view(-1, *cache.shape[2:])
        for t, slot in enumerate(slot_mapping.tolist()):
            if 0 <= slot < flat.shape[0]:
                b = flat[slot]
                got = b.view(torch.float8_e4m3fn).float()
                b[(y[t].abs() < 2.0 ** -6) & (got != y[t]) & (y[t].abs() < got.abs())] -= 1


def _tile_index_and_subnormals_truncated(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                         v_scale):
    _subnormals_truncated(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, tile=2)


#: A Case and [H] scales where both of _tile_index_and_subnormals_truncated's defects show: scales of 2**-9 make
#: subnormal quotients, and head 2's scale differs from head 0's, which a tile of two heads reads for it.
_TILED_CASE = _PER_HEAD_CASE.replace(cache_loc=(1, 0), k_scale=Scale("tensor1", 2.0 ** -9),
                                     v_scale=Scale("tensor1", 2.0 ** -9))
_TILED_VALUES = {"v_scale": (2.0 ** -9, 2.0 ** -9, 2.0 ** -3)}


def test_a_per_head_defect_behind_a_rounding_defect_everywhere_is_named_too(tmp_path, monkeypatch):
    """The twin's defect rounds subnormals one step toward zero on every call: nothing to move back. The per-head
    call's bytes farther than one step from the reference's are the [H] scales' own: a second defect. Without
    it, the rounding defect is the failure's only one."""
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    case, values = _TILED_CASE, _TILED_VALUES
    keys = {}
    for fn in (_tile_index_and_subnormals_truncated, _subnormals_truncated):
        impl = _per_head_impl(fn)
        keys[fn] = {f.key.split("@")[0] for f in _findings(_per_head_message(impl, case, values, 1), "test_per_head",
                                                           impl)}
    assert keys[_tile_index_and_subnormals_truncated] == keys[_subnormals_truncated] | {"scale:per-head"}, keys
    assert "scale:per-head" not in keys[_subnormals_truncated], keys


def test_a_head_unlike_its_own_per_tensor_write_is_the_per_head_scales(tmp_path, monkeypatch):
    """Where the per-tensor twin is wrong too (a rounding defect on every call), the per-head property holds each
    head to the implementation's own per-tensor write with that head's scale: the tile-index reading differs
    there, the rounding defect alone does not; the failure is keyed as the [H] scale's."""
    from conformance.diagnosis.classify import classify_failure
    from conformance.harness import run_impl, run_reference
    from conformance.test_per_head import UNLIKE_OWN, _head_unlike_own, _per_head
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    case, values = _TILED_CASE, _TILED_VALUES
    found = {}
    for fn in (_tile_index_and_subnormals_truncated, _subnormals_truncated):
        impl = _per_head_impl(fn)
        expected, actual = (_per_head(build(case, CPU), "v_scale", values["v_scale"], 1) for _ in range(2))
        run_reference(case, CPU, expected)
        actual, error = run_impl(case, impl, CPU, actual)
        found[fn] = _head_unlike_own(case, values, expected, actual, impl, CPU)
    assert found[_subnormals_truncated] is None
    assert UNLIKE_OWN in found[_tile_index_and_subnormals_truncated], found
    impl = _per_head_impl(_tile_index_and_subnormals_truncated)
    exc = ConformanceFailure(f"{impl.name}: with per-head scales, a head {UNLIKE_OWN}:\n"
                             f"{found[_tile_index_and_subnormals_truncated]}")
    [finding] = classify_failure(exc, "test_per_head_scales_are_bit_exact", "test_per_head", {}, impl, CPU)
    assert finding.key == "scale:per-head", finding


# -- k and v sharing memory ----------------------------------------------------------------------------

def v_is_k_shortcut(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16, use_triton=True,
                    *, recipe="unfused", checked=False):
    """Quantizes once when v is k (one tensor passed twice): V's bytes are K's, v_scale ignored."""
    from kernel import naive_fp8_set_kv_buffer
    same = v.data_ptr() == k.data_ptr() and v.stride() == k.stride()
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, k_scale if same else v_scale, page_size,
                            recipe=recipe, checked=checked)


def test_a_defect_of_k_and_v_sharing_memory_is_its_own(tmp_path, monkeypatch):
    """test_overlap's failure with v is k, where the same caches' sharing with k and v apart (the same values)
    passes, is `wrong-bytes:inputs-shared`: not a symptom of the run's one strided-cache defect, as the caches'
    own sharing failures are (seen: a held-out kernel's second defect folded into its first)."""
    from conformance.diagnosis import report
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import Node
    from conformance.test_overlap import INPUTS_SPECIFIC, SPECIFIC, _inputs_own_buffers
    from strategies.overlap import InputSharing, Pool, Sharing
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = Implementation("v-is-k", v_is_k_shortcut, convention=detect(v_is_k_shortcut))
    case = _small().replace(k_scale=Scale("tensor1", 0.3), v_scale=Scale("tensor1", 0.7), recipe="unfused",
                            v_values="k")
    halves = Pool(order=(0, 4, 1, 2, 3), extra=(0, 0, 0, 0, 0))
    assert _inputs_own_buffers(case, Sharing(halves, InputSharing("same")), impl, CPU)
    with pytest.raises(ConformanceFailure) as info:
        fail(impl, "differs from the reference (recipe unfused) when its tensors share memory:",
             f"v_cache bytes differ\nsharing: ...\n{SPECIFIC}\n{INPUTS_SPECIFIC}", case)
    [finding] = _findings(info.value, "test_overlap", impl)
    assert finding.key == "wrong-bytes:inputs-shared", finding
    strided = Finding("strides", "strides:cache-ignored@strided-cache", "ignores the cache's strides")
    nodes = {"a": Node("a", "failed", findings=[strided]), "b": Node("b", "failed", findings=[finding])}
    keys = sorted(d.key for d in report.defects_from(nodes, tmp_path / "cases", {"args": ""}))
    assert keys == ["strides:cache-ignored@strided-cache", "wrong-bytes:inputs-shared"], keys


def aligned_path_ignores_v_scale(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                                 use_triton=True, *, recipe="unfused", checked=False):
    """A vector path taken only where both inputs are 8-byte aligned, which quantizes V with K's scale."""
    from kernel import naive_fp8_set_kv_buffer
    aligned = k.data_ptr() % 8 == 0 and v.data_ptr() % 8 == 0
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, k_scale if aligned else v_scale, page_size,
                            recipe=recipe, checked=checked)


def test_a_path_chosen_by_the_inputs_alignment_is_no_sharing_defect(tmp_path, monkeypatch):
    """Held-out batch 62: k and v apart, each laid out and aligned as in the shared call, fail as the shared call
    does, so the failure is not k and v's sharing (rebuilt from the Case's own layouts, V misaligned, it passed)."""
    import dataclasses

    from conformance.test_overlap import _inputs_own_buffers
    from strategies.overlap import InputSharing, Pool, Sharing
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = Implementation("aligned", aligned_path_ignores_v_scale, convention=detect(aligned_path_ignores_v_scale))
    case = _small().replace(k_scale=Scale("tensor1", 0.3), v_scale=Scale("tensor1", 0.7), recipe="unfused",
                            v_values="k")
    case = case.replace(v_layout=dataclasses.replace(case.v_layout, offset=1))
    halves = Pool(order=(0, 4, 1, 2, 3), extra=(0, 0, 0, 0, 0))
    assert not _inputs_own_buffers(case, Sharing(halves, InputSharing("same")), impl, CPU)
    # what the control measured before: k and v in the Case's own layouts, V misaligned, take the right path
    assert _inputs_own_buffers(case, Sharing(halves, InputSharing()), impl, CPU)


def v_quotient_overflow_as_nan(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None, page_size=16,
                               use_triton=True, *, recipe="unfused", checked=False):
    """V's quotient that overflows fp32 is written as NaN (0x7F), not saturated: a V-path value defect that only
    values far above V's scale trigger (K's, when one tensor is passed as both)."""
    from kernel import naive_fp8_set_kv_buffer
    naive_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, recipe=recipe,
                            checked=checked)
    s = float(v_scale) if v_scale is not None else 1.0
    for t, slot in enumerate(cache_loc.tolist()):
        if slot >= 0:
            row = v_cache.view(torch.uint8).view(-1, *v_cache.shape[-2:])[slot]
            row[torch.isinf(v[t].float() / s)] = 0x7F


def test_v_given_ks_values_replays_alone_as_a_value_defect(tmp_path, monkeypatch):
    """With v is k, V's path is given K's values: the saved Case says so (v_values "k"), so a V-path value defect
    that only K's values trigger fails on that Case in buffers of its own too, and is diagnosed by replay like any
    value defect, not keyed to the shared memory (seen: a held-out pair's third key)."""
    from conformance.test_overlap import SPECIFIC, _plain
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = Implementation("v-overflow-nan", v_quotient_overflow_as_nan, convention=detect(v_quotient_overflow_as_nan))
    own = _small().replace(k_scale=Scale("float", 2.0 ** 100), v_scale=Scale("float", 2.0 ** -30), recipe="unfused")
    same = own.replace(v_values="k")
    built = build(same)
    assert torch.equal(built.v_logical, built.k_logical) and not torch.equal(build(own).v_logical, built.k_logical)
    assert _plain(own, impl, CPU) == SPECIFIC  # V's own values never overflow: the old rebuild passed
    assert _plain(same, impl, CPU) != SPECIFIC
    with pytest.raises(ConformanceFailure) as info:
        fail(impl, "differs from the reference (recipe unfused) when its tensors share memory:",
             f"v_cache bytes differ\nsharing: ...\n{_plain(same, impl, CPU)}", same)
    keys = {f.key for f in _findings(info.value, "test_overlap", impl)}
    assert keys and not any("shared" in k or k.startswith("unclassified") for k in keys), keys


def _per_head_refuses_zero(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """A calibrated [H] scale "validated" as positive: a head that calibration saw as zeros (scale 0) refused."""
    from examples.vllm_divide import reshape_and_cache_flash
    if k_scale.numel() > 1 and bool((k_scale <= 0).any()):
        raise ValueError(f"k_scale: every per-head scale must be positive, got {k_scale.tolist()}")
    reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def test_a_per_head_raise_on_a_zero_head_is_one_defect_by_its_trigger(tmp_path, monkeypatch):
    """The [H] values replayed with each zero head set to a nonzero scale: the raise vanishes, so a zero head is
    its trigger, and raises whose messages list a different number of heads are one defect (held-out batch 51:
    two keys, `got [N, N]` and `got [N, N, N, ...]`)."""
    from conformance.diagnosis.classify import classify_failure
    from conformance.test_per_head import per_tensor_twin
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = _per_head_refuses_zero
    keys = set()
    for heads in (2, 3):
        values = {"k_scale": (1.0, 0.0, 0.5)[:heads]}
        case = _PER_HEAD_CASE.replace(num_heads=heads)
        exc = ConformanceFailure(f"{impl.__name__}: raises on a valid call with per-head scales ({values}):\n"
                                 f"{impl.__name__} raised ValueError: k_scale: every per-head scale must be positive, "
                                 f"got {list(values['k_scale'])}\n\n{per_tensor_twin(case, values, 1)}")
        keys |= {f.key for f in classify_failure(exc, "test_per_head_scales_are_bit_exact", "test_per_head", {},
                                                 _per_head_impl(impl), CPU)}
    assert keys == {"raises:ValueError@head-scale-zero"}, keys


def _other_scale_by_shape(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """The one-value scale beside an [H] one broadcast by `s.shape[0]`: a 0-d tensor has none (IndexError)."""
    from examples.vllm_divide import reshape_and_cache_flash
    heads = key_cache.shape[2]
    if max(k_scale.numel(), v_scale.numel()) > 1:
        k_scale, v_scale = (s if s.shape[0] == heads else s.expand(heads) for s in (k_scale, v_scale))
        k_scale, v_scale = k_scale[:1], v_scale[:1]  # the example takes one value; the raise is the point here
    reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def test_a_per_head_raise_on_a_0d_other_scale_is_triggered_by_it(tmp_path, monkeypatch):
    """Held-out batch 53: the [H] values replace K's scale, so moving K's scale kind tells nothing; moving V's
    0-d scale to the plain [1] makes the raise vanish: its trigger."""
    from conformance.diagnosis.classify import classify_failure
    from conformance.test_per_head import per_tensor_twin
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = _other_scale_by_shape
    values = {"k_scale": (1.0, 0.5)}
    case = _PER_HEAD_CASE.replace(num_heads=2, k_scale=Scale("tensor0d", 1.0), v_scale=Scale("tensor0d", 0.5))
    exc = ConformanceFailure(f"{impl.__name__}: raises on a valid call with per-head scales ({values}):\n"
                             f"{impl.__name__} raised IndexError: tuple index out of range\n\n"
                             f"{per_tensor_twin(case, values, 1)}")
    keys = {f.key for f in classify_failure(exc, "test_per_head_scales_are_bit_exact", "test_per_head", {},
                                            _per_head_impl(impl), CPU)}
    assert keys == {"raises:IndexError@scale-kind:tensor0d"}, keys


def _head_scales_clamped_to_input_max(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                      v_scale):
    """[H] scales clamped to the input dtype's largest value ("keep a checkpoint's scale finite"): 65504 for fp16."""
    from kernel import naive_fp8_set_kv_buffer
    top = torch.finfo(key.dtype).max
    k_scale, v_scale = (s.clamp(max=top) if s.numel() > 1 else s for s in (k_scale, v_scale))
    naive_fp8_set_kv_buffer(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale,
                            key_cache.shape[1], recipe="divide")


def test_a_per_head_value_defect_no_reading_explains_is_triggered_by_its_ablations(tmp_path, monkeypatch):
    """Held-out batch 53: no reading of the [H] scales gives the bytes, so the defect is `scale:per-head`; the
    ablations that make the per-head call right (twice, with other values) say where: fp16 inputs."""
    from conformance.diagnosis.classify import classify_failure
    from conformance.test_per_head import per_tensor_twin
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = _head_scales_clamped_to_input_max
    values = {"k_scale": (1.0, 3e38, 0.5)}
    case = _PER_HEAD_CASE.replace(input_dtype="float16")
    exc = ConformanceFailure(f"{impl.__name__}: differs from the reference with per-head scales ({values}):\n"
                             f"k_cache bytes differ\n\n{per_tensor_twin(case, values, 1)}")
    keys = {f.key for f in classify_failure(exc, "test_per_head_scales_are_bit_exact", "test_per_head", {},
                                            _per_head_impl(impl), CPU)}
    assert keys == {"scale:per-head@input-float16"}, keys


def _v_scale_with_k_stride(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """One stride for both [H] scales, K's ("the two scales are rows of one table"): V's head h reads element
    h * k_scale.stride(0) of V's buffer (held-out batch 51's Triton wrapper)."""
    from examples.vllm_divide import reshape_and_cache_flash
    if k_scale.numel() > 1 and v_scale.numel() > 1:
        buffer = torch.as_strided(v_scale, ((v_scale.numel() - 1) * v_scale.stride(0) + 1,), (1,))
        at = torch.arange(v_scale.numel()) * k_scale.stride(0)  # past the buffer: whatever memory follows
        v_scale = torch.where(at < buffer.numel(), buffer[at.clamp(max=buffer.numel() - 1)], 7.0)
    reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def test_a_scale_read_with_the_other_scales_stride_is_named_so(tmp_path, monkeypatch):
    """K's and V's [H] scales are drawn with strides of their own; where they differ, V's scale read with K's
    stride is named by that reading (with one stride for both, as before, no draw showed it)."""
    from conformance.diagnosis.classify import classify_failure
    from conformance.harness import run_impl
    from conformance.test_per_head import _per_head
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    impl = _per_head_impl(_v_scale_with_k_stride)
    case = _PER_HEAD_CASE.replace(cache_loc=(1, 0))
    values, step = {"k_scale": (0.5, 2.0, 0.3), "v_scale": (0.25, 4.0, 0.7)}, {"k_scale": 1, "v_scale": 2}
    built = build(case, CPU)
    for name, vals in values.items():
        built = _per_head(built, name, vals, step[name])
    _, error = run_impl(case, impl, CPU, built)
    assert error is None, error
    [finding] = classify_failure(_per_head_message(impl, case, values, step), "test_per_head_scales_are_bit_exact",
                                 "test_per_head", {}, impl, CPU)
    assert finding.key == "scale:per-head-other-stride", finding
    # K's stride the larger: V's heads past half read past its buffer (unknown memory); the heads before say it
    step = {"k_scale": 2, "v_scale": 1}
    case = case.replace(num_heads=4)
    values = {"k_scale": (0.5, 2.0, 0.3, 0.9), "v_scale": (0.25, 4.0, 0.7, 3.0)}
    [finding] = classify_failure(_per_head_message(impl, case, values, step), "test_per_head_scales_are_bit_exact",
                                 "test_per_head", {}, impl, CPU)
    assert finding.key == "scale:per-head-other-stride", finding


def _unit_scale_tolerance(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """A unit-scale fast path with a tolerance: a scale within 2**-8 of 1 ("a bf16-rounded 1.0") is not applied
    (held-out batch 51's pair)."""
    from examples.vllm_divide import reshape_and_cache_flash
    k_scale, v_scale = (torch.ones_like(s) if abs(float(s) - 1.0) <= 2.0**-8 else s for s in (k_scale, v_scale))
    reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def test_a_scale_near_one_taken_for_one_is_named_so() -> None:
    """At 1.003 the bytes fit a scale ignored, and, through a recipe that rounds the scale to bf16, a scale held in
    fp16; at the telling scales the call is right, which refutes the scale ignored: what is left is the scale near 1
    taken for 1, a model only at such a scale (batch 51 read it as scale:held-float16)."""
    from conformance.diagnosis.diagnose import Diagnoser
    impl = Implementation("unit-tolerance", _unit_scale_tolerance, convention=detect(_unit_scale_tolerance))
    case = Case(num_tokens=1, num_heads=2, head_dim=64, page_size=16, num_pages=5, cache_loc=(1,),
                k_scale=Scale("tensor1", 1.003000020980835), v_scale=Scale("tensor0d", 1.003000020980835), seed=5,
                recipe="divide")
    found = {f.key.split("@")[0] for f in Diagnoser(impl, CPU).diagnose(case)}
    assert found == {"scale:near-one-ignored"}, found
