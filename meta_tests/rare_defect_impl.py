"""A planted defect that `make test`'s CI budget misses and a HypoFuzz campaign finds (docs/fuzz.md,
"A defect make test misses"). Not a test module: `--impl meta_tests/rare_defect_impl.py:fused_fp8_set_kv_buffer`.

The defect (wrong slot): the page of a slot comes from a hand-rolled "fast division" by the page
size, `page = (slot * M) >> SHIFT` with `M = ceil(2**SHIFT / page_size)`, and `offset = slot - page
* page_size`. With SHIFT = 11 the quotient is one too large at some slots just below a page
boundary (page size 48: slots 143, 191, 239, ...), and the offset comes out negative (143 -> page
3, offset -1). The row goes to `page * page_stride + offset * slot_stride` instead of its slot,
which keeps its old bytes; the row lands in padding, in another slot or head, or (where that
address falls outside the buffer) nowhere.

The real bug it models: division by a runtime constant through a multiply and a shift (CUTLASS's
FastDivmod, libdivide) with too few fraction bits. Every 32-bit slot needs SHIFT = 32 +
ceil(log2(page_size)); with fewer, small slots are still right and only large ones go wrong.
Tests on a contiguous NHD cache cannot see it: there the page stride is page_size * slot stride, so
(page + 1, offset - page_size) is the same address as (page, offset). It shows on an HND, padded,
head-sliced or K/V-interleaved paged cache.

Why it is rare in the suite's draws (size="small", the CPU strategies), all at once:
- a 4-D cache (half the draws) whose page stride is not page_size * slot stride (about 2 in 5 of
  the 4-D caches drawn): in a 3-D [S, H, D] cache, or a contiguous 4-D one, the wrong (page,
  offset) names the right address;
- page size 48 (1 draw in 16), 3 or 4 pages (2 spare pages or 3: 1 in 2), and a token at slot 143
  or 191: the last slot of the cache, or of its third page. Every other page size drawn
  (strategies/dims.py) is exact on a small cache: 24 first fails at slot 143 (small caches have at
  most 96 slots), 17 at 237 (68), 13 at 350 (65), 7 at 685 (42); 3 and 5 past 1000; powers of two
  never.
Measured over Cases drawn by `strategies.cases(allow_out_of_range=True)`: 22 and 34 of 60,000 in
two runs trigger it, about 1 in 2,000 (docs/results/fuzz-rare-defect-cpu-2026-12-03.md).

How it is planted: our kernel writes every slot; then, for each slot the fast division gets wrong
(computed from the arguments, deterministically), the row the kernel wrote moves to the wrong
address and the slot gets its old bytes back. Where the two addresses coincide nothing changes, as
in the kernel. Under CUDA-graph capture (no host sync there) it plants nothing.
"""

from __future__ import annotations

import torch

import kernel
from kernel.recipe import DEFAULT_RECIPE, Recipe

#: The fast division's fraction bits: exact for every slot below 2**SHIFT / (M * page_size - 2**SHIFT)
#: (128 for page size 48), wrong at some slots above.
SHIFT = 11


def fast_page_and_offset(slot: int, page_size: int) -> tuple[int, int]:
    """(page, offset) of `slot` by the buggy fast division: the offset is negative where the page is wrong."""
    magic = -(-(1 << SHIFT) // page_size)
    page = (slot * magic) >> SHIFT
    return page, slot - page * page_size


def _row(cache_bytes: torch.Tensor, start: int) -> torch.Tensor | None:
    """The [H, D] row of a 4-D uint8 cache view that starts at storage element `start`, or None when
    part of it falls outside the cache's storage."""
    _, _, heads, dim = cache_bytes.shape
    _, _, s_head, s_dim = cache_bytes.stride()
    low = start + min(0, (heads - 1) * s_head) + min(0, (dim - 1) * s_dim)
    high = start + max(0, (heads - 1) * s_head) + max(0, (dim - 1) * s_dim)
    if low < 0 or high >= cache_bytes.untyped_storage().nbytes():
        return None
    return cache_bytes.as_strided((heads, dim), (s_head, s_dim), start)


def _misplaced_rows(cache: object, slots: list[int], page_size: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(the row of the slot, the row the buggy address names) for each slot of a 4-D cache whose
    fast-division address differs from its real one; [] for anything else."""
    if not (isinstance(cache, torch.Tensor) and cache.dim() == 4 and cache.shape[1] == page_size
            and cache.dtype in (torch.float8_e4m3fn, torch.uint8) and cache.device.type != "meta"):
        return []
    cache_bytes = cache.view(torch.uint8)
    s_page, s_slot = cache_bytes.stride()[:2]
    base, num_slots, rows = cache_bytes.storage_offset(), cache.shape[0] * page_size, []
    for slot in sorted(set(slots)):
        if not 0 <= slot < num_slots:
            continue
        page, offset = fast_page_and_offset(slot, page_size)
        right = base + (slot // page_size) * s_page + (slot % page_size) * s_slot
        wrong = base + page * s_page + offset * s_slot
        if wrong != right:
            rows.append((cache_bytes.as_strided(cache_bytes.shape[2:], cache_bytes.stride()[2:], right),
                         _row(cache_bytes, wrong)))
    return rows


def fused_fp8_set_kv_buffer(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_loc: torch.Tensor,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
    page_size: int = 16,
    use_triton: bool = True,
    *,
    recipe: Recipe | str = DEFAULT_RECIPE,
    checked: bool = False,
    encoder: str | None = None,
) -> None:
    """kernel.fused_fp8_set_kv_buffer with the fast-division page bug planted (module docstring)."""
    # Only reads before the launch: an invalid call raises in the kernel, before anything is written.
    rows: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    if (use_triton and not capturing and isinstance(cache_loc, torch.Tensor) and cache_loc.dim() == 1
            and cache_loc.dtype in (torch.int32, torch.int64) and cache_loc.device.type != "meta"
            and isinstance(page_size, int) and not isinstance(page_size, bool) and page_size >= 1):
        slots = cache_loc.tolist()
        rows = [row for cache in (k_cache, v_cache) for row in _misplaced_rows(cache, slots, page_size)]
    old = [right.clone() for right, _ in rows]  # before the kernel writes: the bytes a skipped slot keeps
    kernel.fused_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size, use_triton,
                                   recipe=recipe, checked=checked, encoder=encoder)
    written = [right.clone() for right, _ in rows]
    for (right, _), before in zip(rows, old):
        right.copy_(before)  # the real slot is never written
    for (_, wrong), row in zip(rows, written):
        if wrong is not None:
            wrong.copy_(row)  # the row lands at the fast division's address
