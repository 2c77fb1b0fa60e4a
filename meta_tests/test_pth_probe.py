"""tools.pth_probe's variants write the kernel's bytes, and its check would see one that does not."""

from __future__ import annotations

import pytest
import torch

from kernel.backend import interpreted
from tools import pth_probe

pytestmark = pytest.mark.skipif(not interpreted(), reason="the CPU bit-checks run under TRITON_INTERPRET=1; "
                                "on CUDA `python -m tools.pth_probe` checks them before it times them")


def test_every_variant_writes_the_kernels_bytes():
    assert pth_probe.mismatches(torch.device("cpu"), [(9, 8, 128)], True, list(pth_probe.VARIANTS)) == []


def test_a_variant_that_differs_is_named(monkeypatch):
    real = pth_probe.launch_variant

    def off_by_one(a, **kw):
        out = real(a, **kw)
        a["v_cache"].view(torch.uint8)[0, 0, 0, 0] += 1  # one byte of slot 0
        return out
    monkeypatch.setattr(pth_probe, "launch_variant", off_by_one)
    bad = pth_probe.mismatches(torch.device("cpu"), [(5, 4, 64)], True, ["base", "chunk"])
    assert bad == ["base 5x4x64 inline", "chunk 5x4x64 inline", "base 5x4x64 separate"], bad


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("ceil", ["random", "contiguous"])
def test_the_ceiling_writes_each_tokens_slot_row_and_no_other(ceil, flat):
    a = pth_probe.make_arguments(9, 4, 64, True, torch.device("cpu"))  # rows of 272 bytes, 17 chunks of 16
    pth_probe.launch_variant(a, ceil=ceil, flat=flat, elements=512)
    slots = a["cache_loc"] if ceil == "random" else torch.arange(9)
    want = sorted(s for s in slots.tolist() if s >= 0)
    for name in ("k_cache", "v_cache"):
        rows = a[name].view(torch.uint8).flatten(0, 1).flatten(1)
        assert (rows != 0).any(1).nonzero().flatten().tolist() == want, name
        # Each written row whole: its bytes run through 0..255 from a per-program offset, so at most one
        # byte in 256 (and one more) is a zero.
        assert bool(((rows[want] == 0).sum(1) <= rows.shape[1] // 256 + 1).all()), name


def test_a_ceiling_refuses_rows_it_cannot_store_16_bytes_at_a_time():
    a = pth_probe.make_arguments(5, 2, 64, True, torch.device("cpu"))  # rows of 136 bytes
    with pytest.raises(ValueError, match="136 bytes"):
        pth_probe.launch_variant(a, ceil="random")
