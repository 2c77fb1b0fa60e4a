"""The per-token-head diff locates every changed element, whatever the Case's layouts and ranks."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kernel
from conformance.pth_bytediff import located_diff
from strategies.cases import cases
from strategies.per_token_head import build_pth, pth_cases

BASE = cases(size="small", scale_kinds=("none",), recipes=("single",), allow_out_of_range=True)


@settings(max_examples=30, deadline=None)
@given(pc=pth_cases(BASE), data=st.data())
def test_each_changed_element_is_reported_once_at_its_place(pc, data):
    expected, actual = build_pth(pc), build_pth(pc)
    for b in (expected, actual):
        kernel.naive_fp8_set_kv_buffer(**b.call())
    assert located_diff(expected, actual) is None
    name = data.draw(st.sampled_from(sorted(n for n in actual.buffers if n.endswith("_cache"))), label="buffer")
    flat = actual.buffers[name].view(-1)
    i = data.draw(st.integers(0, flat.numel() - 1), label="element")
    flat.view(torch.uint8 if flat.element_size() == 1 else torch.int32)[i] ^= 1
    report = located_diff(expected, actual)
    assert report is not None and f"{name}[{i}] expected" in report, report
    assert report.count(" expected 0x") == 1, report



def _row(b, s: int) -> torch.Tensor:
    """Slot s's [H, D(+4)] bytes of b's K cache, a view."""
    cache = b.call()["k_cache"].view(torch.uint8)
    return cache[s // cache.shape[1], s % cache.shape[1]] if cache.dim() == 4 else cache[s]


def _written(pc):
    b = build_pth(pc)
    kernel.naive_fp8_set_kv_buffer(**b.call())
    return b


@settings(max_examples=40, deadline=None)
@given(pc=pth_cases(BASE), data=st.data())
def test_rows_out_of_place_are_told_from_wrong_values(pc, data):
    """A byte of a named slot's row changed is a wrong value at the right place, and so is a row of zeros; another
    token's row at a named slot (its signs told apart from the slot's own), or a row written at a slot no token
    names, is out of place (conformance/test_per_token_head.py raises the two apart)."""
    from conformance.pth_bytediff import _same_signs, _slot_rows, misplaced
    expected = _written(pc)
    named = sorted({s for s in pc.case.cache_loc if 0 <= s < pc.case.num_slots})
    assert not misplaced(expected, _written(pc), build_pth(pc))
    if named:
        actual = _written(pc)
        row = _row(actual, data.draw(st.sampled_from(named), label="slot"))
        row[data.draw(st.integers(0, row.shape[0] - 1), label="head"), 0] ^= 0x01
        assert not misplaced(expected, actual, build_pth(pc))
        row.fill_(0)
        assert not misplaced(expected, actual, build_pth(pc))
    rows = _slot_rows(expected, "k_cache", data_only=True)
    pairs = [(s, t) for s in named for t in named if s != t and _same_signs(rows[s], rows[t]) is False]
    if pairs:
        actual = _written(pc)
        s, t = data.draw(st.sampled_from(pairs), label="pair")
        _row(actual, s).copy_(_row(expected, t))
        assert misplaced(expected, actual, build_pth(pc))
    unnamed = [s for s in range(pc.case.num_slots) if s not in named]
    if unnamed:
        actual = _written(pc)
        row = _row(actual, unnamed[0])
        row.copy_(row ^ 0x01)
        assert misplaced(expected, actual, build_pth(pc))
