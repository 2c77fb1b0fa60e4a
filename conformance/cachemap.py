"""Where a Case's cache bytes live, computed from the Case alone (never from the reference).

The isolation and equivalence properties need to know which bytes of a cache buffer a call may
write, and to read the logical cache back whatever its layout. Both follow from the Case's layout
and cache_loc: a byte is written exactly when it belongs to a slot some token names with
0 <= cache_loc[t] < num_slots. Cache elements are one byte (fp8 or uint8), so element offsets
are byte offsets.
"""

from __future__ import annotations

import torch

from strategies.build import GUARD_BYTES, Built
from strategies.case import Case, Layout

CACHES = ("k_cache", "v_cache")


def _layout(case: Case, which: str) -> Layout:
    return case.k_cache_layout if which == "k_cache" else case.v_cache_layout


def buffer_size(case: Case, which: str) -> int:
    return GUARD_BYTES + _layout(case, which).span(case.cache_shape) + GUARD_BYTES


def byte_index(case: Case, which: str) -> torch.Tensor:
    """[P, page_size, H, D] int64: the flat buffer index of every logical cache byte."""
    layout = _layout(case, which)
    shape = case.cache_shape
    flat = torch.arange(buffer_size(case, which), dtype=torch.int64)
    return flat.as_strided(shape, layout.strides(shape), GUARD_BYTES + layout.offset)


def written_slots(case: Case) -> list[int]:
    """The distinct in-range slots some token names (negative and >= num_slots write nothing)."""
    return sorted({s for s in case.cache_loc if 0 <= s < case.num_slots})


def written_mask(case: Case, which: str) -> torch.Tensor:
    """bool over the whole buffer: True where the call writes a byte."""
    mask = torch.zeros(buffer_size(case, which), dtype=torch.bool)
    slots = torch.tensor(written_slots(case), dtype=torch.int64)
    if slots.numel():
        idx = byte_index(case, which).flatten(0, 1)[slots]  # [n, H, D]
        mask[idx.flatten()] = True
    return mask


def guard_mask(case: Case, which: str) -> torch.Tensor:
    """bool over the whole buffer: True in the guard bands before and after the view's span."""
    mask = torch.zeros(buffer_size(case, which), dtype=torch.bool)
    mask[:GUARD_BYTES] = True
    mask[-GUARD_BYTES:] = True
    return mask


def logical_slots(built: Built, which: str, slots: list[int]) -> torch.Tensor:
    """uint8 [len(slots), H, D] on the CPU: the bytes of those slots, read through the layout."""
    buf = built.buffers[which].cpu()
    idx = byte_index(built.case, which).flatten(0, 1)[torch.tensor(slots, dtype=torch.int64)]
    return buf[idx]


def first_duplicates_only(case: Case) -> Case:
    """The Case with every repeated in-range slot after its first token turned into padding (-1)."""
    seen: set[int] = set()
    locs = []
    for s in case.cache_loc:
        in_range = 0 <= s < case.num_slots
        locs.append(-1 if in_range and s in seen else s)
        if in_range:
            seen.add(s)
    return case.replace(cache_loc=tuple(locs))
