"""Big caches: offsets past 2**31 bytes (and input offsets past 2**31 elements) stay exact.

A kernel that computes its addresses in 32 bits writes the wrong place (or faults) only once a
cache holds more than 2**31 bytes, so these cases use a ~2.1 GiB fp8 / uint8 cache per K and V,
written at its first, middle, straddling and last slots. They need CUDA: the interpreter would
spend minutes on such buffers, and the point is the compiled kernel's integer widths. The
reference stays cheap (it only scatters the written tokens), and whole buffers, guard bands
included, are compared on the GPU with torch.equal; the byte-diff helper explains a mismatch.
"""

from __future__ import annotations

import fcntl
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from conformance.bytediff import diff_buffers
from conformance.harness import ConformanceFailure, execute, fail, run_reference
from strategies.build import POISON_BITS, build
from strategies.case import Case, Layout

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs CUDA: a >2 GiB cache under Triton's interpreter is far too slow")

HEADS, DIM, PAGE = 8, 128, 16  # 1 KiB per slot, 16 KiB per page
SLOT_BYTES = HEADS * DIM
NUM_PAGES = 2**31 // (PAGE * SLOT_BYTES) + 1024  # 2**31 bytes + 16 MiB
NUM_SLOTS = NUM_PAGES * PAGE
# First, the slot at exactly 2**31 bytes and its neighbours, the last page, the very last slot.
SLOTS = (0, 1, 2**31 // SLOT_BYTES - 1, 2**31 // SLOT_BYTES, NUM_SLOTS // 2 + 5,
         NUM_SLOTS - PAGE - 3, NUM_SLOTS - 2, NUM_SLOTS - 1)
GIB = 2**30


@pytest.fixture(autouse=True)
def _one_big_test_per_gpu_at_a_time() -> Iterator[None]:
    """Each test holds 6 to 21 GiB: xdist workers, and reports run side by side (tools/corpus.py), take turns
    through a lock file per GPU, and each gives its cached blocks back when done. Without both, an 80 GiB card
    ran out of memory in a small test of another process (an H100, 14 reports at a time)."""
    if not torch.cuda.is_available():
        yield
        return
    index = torch.cuda.current_device()
    gpu = getattr(torch.cuda.get_device_properties(index), "uuid", index)  # the card, whatever the process sees
    lock = Path(tempfile.gettempdir()) / f"kvfp8-bigcache-{gpu}.lock"
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            torch.cuda.empty_cache()
            fcntl.flock(f, fcntl.LOCK_UN)


def _need_free(gib: float) -> None:
    free, _ = torch.cuda.mem_get_info()
    if free < gib * GIB:
        pytest.skip(f"needs {gib:.0f} GiB of free GPU memory, {free / GIB:.1f} GiB free")


def _big_case(cache_dtype: str, loc_dtype: str, cache_rank: int, recipe: str) -> Case:
    slots = SLOTS
    return Case(
        num_tokens=len(slots), num_heads=HEADS, head_dim=DIM, page_size=PAGE, num_pages=NUM_PAGES,
        cache_loc=slots, input_dtype="bfloat16", cache_dtype=cache_dtype, loc_dtype=loc_dtype,
        cache_rank=cache_rank, k_cache_layout=Layout.contiguous(4), v_cache_layout=Layout.contiguous(4),
        seed=20261202, recipe=recipe,
    )


def _input_rows_case(impl, small: bool = False) -> Case:
    """The call whose K rows test_input_rows_past_2_31_elements spreads over a 4 GiB buffer; `small`: its
    twin for the diagnosis, K's rows spread by a token stride that fits (one padded head's worth)."""
    case = Case(num_tokens=3, num_heads=HEADS, head_dim=DIM, page_size=PAGE, num_pages=2,
                cache_loc=(3, 17, 30), input_dtype="bfloat16", seed=7, recipe="unfused")
    return impl.fit(case.replace(k_layout=Layout((0, 1, 2), (0, 1, 0))) if small else case)


def _assert_equal_buffers(impl, expected, actual, names=("k_cache", "v_cache")) -> None:
    """Whole-buffer equality on the GPU; on a mismatch, the byte-diff report of the first bytes."""
    reports = []
    for name in names:
        e, a = expected.buffers[name], actual.buffers[name]
        if not torch.equal(e, a):
            reports.append(diff_buffers(actual, name, e, a) or f"{name}: torch.equal is False")
    if reports:
        fail(impl, f"differs from the reference on a cache of {actual.case.num_slots * SLOT_BYTES:,} bytes "
                   f"(recipe {actual.case.recipe}):", "\n".join(reports))


def _released(check: Callable[[], None]) -> None:
    """Run one big check; a failure of the implementation is raised again once the check's frames, which hold
    its 6 to 21 GiB of buffers, are gone and the cached blocks given back. pytest keeps a failed test's
    traceback (sys.last_traceback) until its worker's next test starts (to the end of the run after the worker's
    last test), and a traceback keeps its frames' tensors: side by side, reports whose big tests failed had
    filled an 80 GiB card between them (an H100, nine reports)."""
    try:
        check()
        return
    except ConformanceFailure as exc:
        failure = exc.with_traceback(None)  # the message is the whole report; the frames hold the buffers
    torch.cuda.empty_cache()
    raise failure


def _cache_matches(impl, device, case: Case) -> None:
    expected = run_reference(case, device)
    actual = build(case, device)
    execute(impl, actual)
    _assert_equal_buffers(impl, expected, actual)


@pytest.mark.parametrize("cache_dtype", ["float8_e4m3fn", "uint8"])
@pytest.mark.parametrize("loc_dtype", ["int32", "int64"])
def test_cache_past_2_31_bytes(impl, device, cache_dtype, loc_dtype):
    _need_free(10)  # two pairs of caches (reference and implementation), 2.1 GiB each
    case = impl.fit(_big_case(cache_dtype, loc_dtype, 4, "unfused"))
    assert case.num_slots * SLOT_BYTES > 2**31
    _released(lambda: _cache_matches(impl, device, case))


def test_flat_cache_past_2_31_bytes(impl, device):
    """A 3-D [S, H, D] cache: the slot stride times a slot index past 2**21 overflows 32 bits."""
    _need_free(10)
    case = impl.fit(_big_case("float8_e4m3fn", "int32", 3, "single"))
    _released(lambda: _cache_matches(impl, device, case))


def _input_rows_match(impl, device) -> None:
    stride = 2**30 + 64
    case = _input_rows_case(impl)
    expected = run_reference(case, device)
    actual = build(case, device)
    poison = POISON_BITS["bfloat16"]  # the same quiet NaN as every other input gap (fits int16)
    big = torch.full((2 * stride + HEADS * DIM,), poison, dtype=torch.int16, device=device)
    big = big.view(torch.bfloat16)
    k = big.as_strided((3, HEADS, DIM), (stride, DIM, 1))
    k.copy_(actual.k_logical.to(device))
    actual.k = k
    execute(impl, actual)
    del big, k
    _assert_equal_buffers(impl, expected, actual)


def test_input_rows_past_2_31_elements(impl, device):
    """k's third token row sits 2**31 + 128 elements into its buffer (token stride 2**30 + 64).

    The token stride fits in 32 bits, so only the product t * stride overflows: a kernel that
    drops its 64-bit casts reads the wrong row. The buffer is poison NaN everywhere else.
    """
    _need_free(6)
    _released(lambda: _input_rows_match(impl, device))
