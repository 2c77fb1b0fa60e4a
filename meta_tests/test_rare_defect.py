"""The defect `make test` misses and fuzzing finds (meta_tests/rare_defect_impl.py, docs/fuzz.md) is real
on one hand-made Case, our kernel passes that Case, and it hides where its docstring says it does."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.harness import ConformanceFailure, check_case
from conformance.impls import Implementation, from_spec, fused
from conformance.impls import test_device as _test_device  # under its own name pytest would collect it
from meta_tests.rare_defect_impl import fast_page_and_offset
from strategies.case import Case, Layout, Scale
from strategies.dims import COMMON_PAGE_SIZES, LIMITS, ODD_PAGE_SIZES

RARE = f"{Path(__file__).resolve().parent / 'rare_defect_impl.py'}:fused_fp8_set_kv_buffer"
DEVICE = _test_device()
HND = Layout((0, 2, 1, 3), (0, 0, 0, 0))  # [P, H, ps, D] in storage: page stride != page_size * slot stride
# Slot 143 is the last slot of a 3-page cache of page size 48: the fast division puts it at page 3,
# offset -1. V's cache is HND, where that is another address; K's is contiguous, where it is not.
CASE = Case(num_tokens=2, num_heads=2, head_dim=8, page_size=48, num_pages=3, cache_loc=(143, 5),
            v_cache_layout=HND, k_scale=Scale("float", 0.5), v_scale=Scale("tensor1", 2.0), seed=7)


@pytest.fixture(autouse=True)
def _failures_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path / "failures"))


def _failure(impl: Implementation, case: Case) -> str:
    """The report the suite prints for this Case (or '' when it passes)."""
    try:
        check_case(case, impl, DEVICE)
    except ConformanceFailure as exc:
        return str(exc)
    return ""


def test_the_defect_is_real():
    report = _failure(from_spec(RARE), CASE)
    assert "differs from the reference" in report and "at view slot=143 (page=2, offset=47)" in report, report
    assert "v_cache:" in report and "k_cache:" not in report, report  # the contiguous K cache hides it


def test_our_kernel_passes_the_same_case():
    assert _failure(fused("software"), CASE) == ""


@pytest.mark.parametrize("change", [{"v_cache_layout": Layout.contiguous(4)}, {"cache_loc": (142, 5)},
                                    {"page_size": 32, "num_pages": 5}],
                         ids=["contiguous-cache", "slot-142", "page-size-32"])
def test_hidden_elsewhere(change):
    """One condition less and the defect hides: a cache whose page stride is page_size * slot stride,
    a slot the fast division gets right, a power-of-two page size."""
    assert _failure(from_spec(RARE), CASE.replace(**change)) == ""


def test_on_a_small_cache_only_page_size_48_goes_wrong():
    """The CPU strategies' caches (strategies/dims.py): at most ceil(T / page_size) + 3 pages."""
    max_tokens, _, _, spare = LIMITS["small"]
    for page_size in COMMON_PAGE_SIZES + ODD_PAGE_SIZES:
        slots = (-(-max_tokens // page_size) + spare) * page_size
        wrong = [s for s in range(slots) if fast_page_and_offset(s, page_size) != divmod(s, page_size)]
        assert wrong == ([143, 191] if page_size == 48 else []), page_size
