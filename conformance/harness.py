"""Run one Case through an implementation and the reference, and compare the whole caches.

`check_case` is what every bit-exact property calls. On a failure it raises AssertionError with
the byte-diff report; an implementation that raises or crashes on a valid Case is a failure of
that Case, with its error, not an abort of the run.
"""

from __future__ import annotations

import time
import traceback

import torch

from conformance import stats
from conformance.bytediff import compare_caches
from conformance.impls import Implementation
from kernel import naive_fp8_set_kv_buffer
from strategies.build import Built, build
from strategies.case import Case


def run_reference(case: Case, device: torch.device, built: Built | None = None) -> Built:
    """The reference on the Case's tensors (`built`, or a fresh build); returns them."""
    expected = built or build(case, device)
    naive_fp8_set_kv_buffer(*expected.args(), **expected.kwargs())
    return expected


def run_impl(case: Case, impl: Implementation, device: torch.device,
             built: Built | None = None) -> tuple[Built, str | None]:
    """Run impl on the Case's tensors (`built`, or a fresh build); returns them and the error, if any."""
    actual = built or build(case, device)
    try:
        impl(*actual.args(), **actual.kwargs())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # the implementation's failure is this case's failure
        return actual, f"{impl.name} raised {type(exc).__name__}: {exc}\n" + \
            "".join(traceback.format_exception(exc)[-3:])
    return actual, None


def mismatch_report(case: Case, impl: Implementation, device: torch.device) -> str | None:
    """None if impl's bytes equal the reference's over both whole cache buffers."""
    built = build(case, device)
    fresh = built.copy()  # the same bytes as a second build, by device copies
    expected = run_reference(case, device, built)
    actual, error = run_impl(case, impl, device, fresh)
    if error:
        return error
    return compare_caches(expected, actual)


def check_case(case: Case, impl: Implementation, device: torch.device) -> None:
    """Assert bit-exactness of impl against the reference on one Case."""
    started = time.perf_counter()
    report = mismatch_report(case, impl, device)
    stats.record(time.perf_counter() - started)
    if report:
        from conformance.artifacts import save_failure
        path = save_failure(case, impl, report)
        raise AssertionError(f"{impl.name} differs from the reference (recipe {case.recipe}):\n"
                             f"{report}\n{path}")
