"""The suite judges independent implementations as they are: examples/ in their own conventions.

Each planted defect of examples/sglang_triton_planted.py is found, by the property that owns it, on a
Case chosen to show it; the implementations written correctly pass the same Cases; the recipes are
identified from the sweep. The full runs (every property, every example) are in docs/results/.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.conventions import SGLANG
from conformance.diagnosis.identification import held_recipe, identify, sweep_points
from conformance.harness import ConformanceFailure, check_case
from conformance.impls import from_spec
from conformance.impls import test_device as _test_device  # not collected as a test
from strategies.case import Case, Scale

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PLANTED = f"{EXAMPLES / 'sglang_triton_planted.py'}:fused_fp8_set_kv_buffer"
VLLM = f"{EXAMPLES / 'vllm_divide.py'}:reshape_and_cache_flash"
DEVICE = _test_device()


@pytest.fixture(autouse=True)
def _failures_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path / "failures"))


def _case(**changes: object) -> Case:
    base = Case(num_tokens=3, num_heads=2, head_dim=16, page_size=4, num_pages=2, cache_loc=(5, -1, 0),
                k_scale=Scale("float", 0.3), v_scale=Scale("tensor1", 0.7), seed=11, recipe="single")
    return base.replace(**changes)


def _failure(spec: str, case: Case) -> str:
    """The report the suite prints for this Case (or '' when it passes)."""
    try:
        check_case(case, from_spec(spec), DEVICE)
    except ConformanceFailure as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize("spec, convention, recipe", [(PLANTED, "sglang", "single"), (VLLM, "vllm", "divide")])
def test_convention_and_recipe_are_identified(spec, convention, recipe):
    impl = from_spec(spec)
    assert impl.convention.name == convention
    res = identify(impl, sweep_points(["bfloat16"], full=False, convention=impl.convention), DEVICE)
    held, note = held_recipe(res)
    assert held == recipe, note


def test_planted_power_of_two_tiles():
    report = _failure(PLANTED, _case(num_heads=3))
    # The interpreter says "power of 2"; compiled Triton fails at the first non-power-of-two block shape.
    assert "raises on a valid call" in report and ("power of 2" in report.lower() or "CompilationError" in report), \
        report
    assert _failure(PLANTED, _case()) == ""  # the same Case with H = 2 conforms


def test_planted_no_uint8_cache():
    report = _failure(PLANTED, _case(cache_dtype="uint8"))
    assert "raised TypeError" in report and "float8_e4m3fn" in report, report


def test_planted_scale_used_only_when_both_are_given():
    report = _failure(PLANTED, _case(v_scale=Scale("none")))
    assert "k_cache:" in report and "v_cache:" not in report, report  # K lost its scale; V's 1.0 is right


def test_planted_rounding_once_against_unfused():
    report = _failure(PLANTED, _case(recipe="unfused", num_tokens=8, cache_loc=tuple(range(8)), head_dim=64))
    assert "differs from the reference (recipe unfused)" in report, report


@pytest.mark.skipif(DEVICE.type != "cuda", reason="needs CUDA: a cache past 2**31 bytes")
def test_planted_32_bit_offsets(tmp_path):
    """In a subprocess (tools.repro): a wrapped offset may be an illegal address, which ends a process."""
    from conformance.test_bigcache import _big_case, _need_free
    _need_free(10)
    path = tmp_path / "big.json"
    path.write_text(_big_case("float8_e4m3fn", "int64", 4, "single").to_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # a tool, not a test worker
    done = subprocess.run([sys.executable, "-m", "tools.repro", str(path), "--impl", PLANTED],
                          capture_output=True, text=True, cwd=EXAMPLES.parent, timeout=600, env=env)
    assert done.returncode == 1 and "FAIL" in done.stdout, done.stdout + done.stderr


def test_vllm_example_conforms_where_it_can_express_the_case():
    case = _case(k_scale=Scale("tensor0d", 0.3), recipe="divide")
    assert _failure(VLLM, case) == ""
    with pytest.raises(pytest.skip.Exception, match="vllm convention cannot express a float k_scale"):
        check_case(case.replace(k_scale=Scale("float", 0.3)), from_spec(VLLM), DEVICE)


def test_uint8_cache_through_vllm_is_a_bit_copy():
    case = _case(k_scale=Scale("tensor1", 0.3), recipe="divide", cache_dtype="uint8", num_tokens=2,
                 cache_loc=(7, 1))
    assert _failure(VLLM, case) == ""


def test_vllm_example_accepts_the_e4m3_alias():
    """A Case with format_alias reaches a vLLM-convention kernel as kv_cache_dtype="fp8_e4m3"; this project's
    convention and SGLang's have no such argument, so they cannot express one."""
    case = _case(k_scale=Scale("tensor1", 0.3), recipe="divide", format_alias=True)
    assert _failure(VLLM, case) == ""
    assert "no other name for fp8_e4m3" in SGLANG.why_not(case)


@pytest.mark.parametrize("cache_dtype", ["float8_e5m2", "uint8"])
def test_vllm_example_is_told_e5m2_by_kv_cache_dtype(cache_dtype):
    """An e5m2 Case reaches a vLLM-convention kernel as kv_cache_dtype="fp8_e5m2" (its e5m2 bytes are
    right only if it was told); a format vLLM has no word for is inexpressible."""
    case = _case(k_scale=Scale("tensor1", 0.3), v_scale=Scale("tensor0d", 0.7), recipe="divide",
                 cache_format="fp8_e5m2", cache_dtype=cache_dtype)
    assert _failure(VLLM, case) == ""
    with pytest.raises(pytest.skip.Exception, match="no kv_cache_dtype for fp8_e4m3fnuz"):
        check_case(case.replace(cache_format="fp8_e4m3fnuz", cache_dtype="uint8"), from_spec(VLLM), DEVICE)


@pytest.mark.long
def test_vllm_example_holds_per_head_scales_when_the_convention_says_so():
    """--convention vllm-per-head (opt-in) runs the per-head properties on a vLLM kernel: the example passes
    them (its [H] scales divide head by head, a scale of another shape is a ValueError naming it), and the plain
    vllm convention skips them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "conformance/test_per_head.py",
            "--impl", VLLM, "--recipe", "divide", "-rs"]
    opted = subprocess.run([*base, "--convention", "vllm-per-head"], capture_output=True, text=True,
                           cwd=EXAMPLES.parent, timeout=600, env=env)
    assert opted.returncode == 0 and " passed" in opted.stdout, opted.stdout[-3000:] + opted.stderr[-2000:]
    assert "passes no per-head scales" not in opted.stdout, opted.stdout[-3000:]
    plain = subprocess.run([*base, "--convention", "vllm"], capture_output=True, text=True, cwd=EXAMPLES.parent,
                           timeout=600, env=env)
    assert plain.returncode == 0 and "passes no per-head scales" in plain.stdout, plain.stdout[-3000:]
