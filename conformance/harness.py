"""Run one Case through an implementation and the reference, and compare the whole caches.

`check_case` is what every bit-exact property calls; `fail` is the one way a property fails with a
report (raised once, so pytest prints it once). An implementation that raises on a valid Case fails
that Case with its error, not the run. One that loses the CUDA context (an illegal memory access)
cannot be run again in this process: its case is saved, and the xdist worker exits so that a fresh
one takes the remaining tests (outside xdist the session stops, saying why).
"""

from __future__ import annotations

import functools
import os
import re
import sys
import sysconfig
import time
import traceback

import pytest
import torch

from conformance import stats
from conformance.bytediff import compare_caches
from conformance.impls import Implementation
from kernel import naive_fp8_set_kv_buffer
from strategies.build import Built, build
from strategies.case import Case

#: Who runs the properties in this process: "pytest", "xdist-worker" (set by conformance.session), or
#: "" for a tool. Not read from the environment: a tool a test starts inherits the test's variables.
RUNNER = ""


class ConformanceFailure(AssertionError):
    """The implementation broke the contract; the message is the whole report."""


@functools.cache
def _failure_kind(kind: str) -> type[ConformanceFailure]:
    # Hypothesis tells distinct bugs of one test apart by exception type and origin; every report is
    # raised here, so each kind of failure gets its own type (report_multiple_bugs shows each).
    return type(f"ConformanceFailure[{kind}]", (ConformanceFailure,), {})


def fail(impl: Implementation, what: str, report: str, case: Case | None = None, kind: str = "bytes",
         fill: str | None = None) -> None:
    """Raise the failure report of `impl` (saving the Case as a failure file when given; `fill` names
    how its values were overwritten after `build`, conformance.artifacts.FILLS)."""
    __tracebackhide__ = True  # the report says what failed; the suite's own frame adds nothing
    if case is not None:
        from conformance.artifacts import save_failure
        saved = save_failure(case, impl, report, fill=fill)
        report = f"{report}\n{saved}".rstrip()
    raise _failure_kind(kind)(f"{impl.name}: {what}\n{report}")


class SuiteError(RuntimeError):
    """The suite itself failed on a Case (its reference raised): a bug to report against this
    repository, never a defect of the implementation under test."""


class MemoryCorrupted(RuntimeError):
    """The reference, plain torch ops, met an illegal address: memory the suite uses was overwritten, by a
    stray write of an earlier call of the implementation in this process (seen on an H100: a kernel writing
    V with K's larger strides, then a big-cache test's reference). The implementation's failure, not the
    suite's."""


#: A fault no torch op of the reference makes on its own, whatever its Case: the memory under it changed.
_CORRUPTION = ("illegal memory access", "illegal address", "misaligned address")


def run_reference(case: Case, device: torch.device, built: Built | None = None) -> Built:
    """The reference on the Case's tensors (`built`, or a fresh build); returns them."""
    expected = built or build(case, device)
    try:
        naive_fp8_set_kv_buffer(**expected.call())
    except Exception as exc:
        if device.type == "cuda" and any(m in str(exc) for m in _CORRUPTION):
            raise MemoryCorrupted(
                f"the CUDA context was lost while this suite's reference ran ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0]}): an earlier call of the implementation in this process wrote "
                f"out of bounds, over memory the suite uses\ncase: {case.to_json()}") from exc
        raise SuiteError(f"the reference (this suite's specification, not the implementation under test) "
                         f"raised {type(exc).__name__}: {exc}\ncase: {case.to_json()}") from exc
    return expected


def cuda_context_lost(device: torch.device) -> bool:
    """True when the device's CUDA context is broken (a sticky error such as an illegal address)."""
    if device.type != "cuda":
        return False
    try:
        torch.cuda.synchronize(device)
        return False
    except RuntimeError:
        return True


def _abandon(case: Case | None, impl: Implementation, error: str, fill: str | None = None) -> None:
    """The implementation crashed the CUDA context: save the Case (when the call was one), then end this
    process's run (under pytest; a tool reports the error itself)."""
    from conformance.artifacts import save_failure
    saved = save_failure(case, impl, error, final=True, fill=fill) if case is not None else ""
    message = f"{impl.name} crashed the CUDA context; no later test can run in this process.\n{error}\n{saved}"
    print(message, file=sys.stderr, flush=True)
    if RUNNER == "xdist-worker":
        os._exit(70)  # xdist reports this test as crashed and starts a fresh worker for the rest
    if RUNNER == "pytest":
        pytest.exit(message, returncode=1)
    # Outside pytest (tools.repro): the caller reports the error, and its process ends anyway.


def abandon_if_context_lost(impl: Implementation, device: torch.device, during: str) -> None:
    """After calls that need not have waited for the device (an invalid call, say): when one lost the CUDA
    context, end this process's run now, so that the crash is the implementation's and not a later
    test's (or Hypothesis's, whose next draw would fail on the dead context)."""
    if cuda_context_lost(device):
        _abandon(None, impl, f"{impl.name} lost the CUDA context {during} (an illegal memory access, most likely)")


_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: This repository's suite: an exception raised in here is the suite's, never the implementation's.
SUITE_DIRS = tuple(os.path.join(_REPO, d) + os.sep for d in ("conformance", "strategies"))
KERNEL_DIR = os.path.join(_REPO, "kernel") + os.sep  # the specification, and this repository's kernel
_INSTALLED = tuple({os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "purelib", "platlib")})


def raised_by_implementation(exc: BaseException) -> bool:
    """Whether `exc` was raised inside the implementation's own frames (its `assert`, say), by its traceback.

    When the traceback passes through the convention's call of the implementation (conformance.conventions
    `invoke`), it is the implementation's unless its innermost frame is this suite's (conformance/,
    strategies/). Otherwise (a function called directly) it is the implementation's when the innermost
    frame lies outside this repository's conformance/, strategies/ and kernel/ and outside installed
    packages: in the implementation's own file.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return False
    inner = os.path.realpath(frames[-1].filename)
    if inner.startswith(SUITE_DIRS):
        return False
    conventions = os.path.join(_REPO, "conformance", "conventions.py")
    if any(f.name == "invoke" and os.path.realpath(f.filename) == conventions for f in frames):
        return True
    return not inner.startswith((KERNEL_DIR, *_INSTALLED))


def describe_error(impl: Implementation, exc: BaseException) -> str:
    return f"{impl.name} raised {type(exc).__name__}: {exc}\n" + "".join(traceback.format_exception(exc)[-3:])


def _call(impl: Implementation, built: Built, fill: str | None = None) -> str | None:
    """Call impl on built's tensors and wait for the device; returns its error (describe_error) or None.

    A lost CUDA context ends this process's run (_abandon), after saving the Case.
    """
    try:
        impl.run(built)
    except Exception as exc:  # the implementation's failure is this case's failure
        error = describe_error(impl, exc)
        if cuda_context_lost(built.k.device):
            _abandon(built.case, impl, error, fill)
        return error
    return None


def execute(impl: Implementation, built: Built, fill: str | None = None) -> None:
    """Call impl on built's tensors and wait for the device: the one way a property calls it when it
    checks the bytes itself. An exception of the implementation (its own `assert` too) fails the Case
    as "raises on a valid call", with its error and the Case saved, never as a bare exception that
    would read as the suite's; a lost CUDA context ends this process's run (_abandon).
    """
    __tracebackhide__ = True
    error = _call(impl, built, fill)
    if error:
        fail(impl, "raises on a valid call:", error, built.case, kind=_raised(error), fill=fill)


def run_impl(case: Case, impl: Implementation, device: torch.device,
             built: Built | None = None) -> tuple[Built, str | None]:
    """Run impl on the Case's tensors (`built`, or a fresh build); returns them and the error, if any."""
    actual = built or build(case, device)
    return actual, _call(impl, actual)


def _raised(error: str) -> str:
    """The exception type named in a describe_error text."""
    found = re.search(r" raised (\w+):", error)
    return found.group(1) if found else "error"


def check_case(case: Case, impl: Implementation, device: torch.device) -> None:
    """Fail unless impl's bytes equal the reference's on one Case."""
    started = time.perf_counter()
    built = build(case, device)
    # The same bytes as a second build, by device copies; the inputs are shared, as the reference
    # (which runs first) writes only its caches.
    fresh = built.copy(inputs=False)
    expected = run_reference(case, device, built)
    actual, error = run_impl(case, impl, device, fresh)
    stats.record(time.perf_counter() - started)
    if error:
        fail(impl, "raises on a valid call:", error, case, kind=_raised(error))
    report = compare_caches(expected, actual)
    if report:
        fail(impl, f"differs from the reference (recipe {case.recipe}):", report, case)
