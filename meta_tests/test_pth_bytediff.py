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
