"""Overlap: tensors that share one buffer without a cache sharing a byte are a valid call, and the
bytes are the reference's, over every whole buffer.

Real pools keep K and V in one allocation: `[P, 2, ps, H, D]` halves (FlashInfer/SGLang), `[2, P, ...]`
(vLLM's FlashAttention layout), K and V interleaved per slot or per head, or everything carved from
one workspace arena; k and v may be one fused buffer or one tensor (they are only read). An overlap
check that compares extents instead of bytes rejects these (a false positive), and an implementation
that assumes separate buffers may write one half over the other. The invalid side (a cache sharing a
byte with anything) is conformance/test_errors.py's overlap classes.

Binds every implementation (it is the byte contract, not the argument contract). The sharing is
drawn by strategies.overlap.sharings; a failure report prints it, and the saved Case alone rebuilds
separate buffers with the values the call had (V holds K's values, in K's layout, where v is k: Case.v_values);
`strategies.overlap.build_shared(case, sharing)` rebuilds the shared ones.
"""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.bytediff import compare_caches
from conformance.harness import fail, run_impl, run_reference
from conformance.impls import Implementation
from strategies.build import Built
from strategies.case import Case
from strategies.overlap import InputSharing, Sharing, build_shared, owner_of, sharings

FIRST_N = 8
#: The report's last line when the Case alone passes (conformance/diagnosis/classify.py keys the finding on it).
SPECIFIC = "the same Case in separate buffers passes: the failure is specific to the shared memory"
#: And its next one when the same caches' sharing passes too with k and v in buffers of their own.
INPUTS_SPECIFIC = ("the same caches' sharing with k and v in buffers of their own (the same values, laid out and "
                   "aligned as here) passes: the failure is specific to k and v sharing memory")


def _diff(expected: Built, actual: Built) -> str | None:
    """Byte-diff every whole buffer of the call (uint8, untouched bytes and guard bands included)."""
    reports = []
    for name, exp in expected.buffers.items():
        e, a = exp.cpu(), actual.buffers[name].cpu()
        bad = (e != a).nonzero().flatten()
        if bad.numel() == 0:
            continue
        lines = [f"buffer {name}: {bad.numel()} of {e.numel()} bytes differ; first {min(bad.numel(), FIRST_N)}:"]
        for i in bad[:FIRST_N].tolist():
            lines.append(f"  [{i}] expected 0x{int(e[i]):02X} actual 0x{int(a[i]):02X}: "
                         f"{owner_of(actual, actual.buffers[name], i)}")
        reports.append("\n".join(lines))
    return "\n".join(reports) or None


def _views(built: Built) -> str:
    """Each tensor's shape, strides and address relative to k_cache's first byte."""
    return "; ".join(f"{n}: shape {tuple(t.shape)} stride {t.stride()} at {t.data_ptr() - built.k_cache.data_ptr():+d}"
                     for n, t in built.call().items() if isinstance(t, torch.Tensor))


def _plain(case: Case, impl: Implementation, device: torch.device) -> str:
    """Does the same Case fail with every tensor in its own buffer (strategies.build)? Then the defect is
    not the sharing's, and `tools.repro` replays it from the saved Case."""
    expected = run_reference(case, device)
    actual, error = run_impl(case, impl, device)
    if error or compare_caches(expected, actual):
        return "the same Case in separate buffers fails too: python -m tools.repro replays it"
    return SPECIFIC


def _apart(t: torch.Tensor) -> torch.Tensor:
    """t's values in a buffer of its own, at the same strides and storage offset: laid out and aligned as t is,
    sharing nothing."""
    storage = torch.UntypedStorage(t.untyped_storage().nbytes(), device=t.device)
    out = torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(), t.shape, t.stride())
    out.copy_(t)
    return out


def _inputs_own_buffers(case: Case, sharing: Sharing, impl: Implementation, device: torch.device,
                        expected: Built | None = None) -> bool:
    """Does the call pass with the caches shared as before, and k and v each in a buffer of its own, laid out and
    aligned as in the shared call (the same values)? Then the inputs' sharing is what the implementation gets
    wrong (a kernel that reuses K's bytes for V when v is k, ignoring v_scale), and not their layout (a vector
    path chosen by the inputs' alignment)."""
    given = build_shared(case, sharing, device)
    if given.k_padded is not None:  # padded rows: k and v are views of longer tensors; rebuilt from the Case
        separate = Sharing(sharing.caches, InputSharing())
        expected, given = build_shared(case, separate, device), build_shared(case, separate, device)
        run_reference(case, device, expected)
    else:
        if expected is None:  # the shared call's reference bytes
            expected = build_shared(case, sharing, device)
            run_reference(case, device, expected)
        given = dataclasses.replace(given, k=_apart(given.k), v=_apart(given.v))
    actual, error = run_impl(case, impl, device, given)
    return not error and _diff(expected, actual) is None


@given(data=st.data())
def test_shared_but_disjoint_memory_is_accepted(data, impl, device, recipe):
    """Caches that share a buffer with each other or with the inputs, without sharing a byte: the call
    is accepted and every byte of every buffer equals the reference's."""
    case = data.draw(impl.cases(recipes=(recipe,), max_tokens=8, max_heads=4, max_dim=128), label="case")
    sharing: Sharing = data.draw(sharings(case), label="sharing")
    if sharing.inputs.kind == "same":  # v is k: the saved Case gives V K's values and K's layout, so that it
        # replays alone as the call was made (a kernel's vector path chosen by both inputs' alignment sees the same)
        case = case.replace(v_values="k", v_layout=case.k_layout)
    expected = build_shared(case, sharing, device)
    try:
        run_reference(case, device, expected)
    except ValueError as exc:  # the specification itself must accept it: a suite or kernel/plan.py bug
        raise AssertionError(f"the reference rejects a valid call whose tensors share memory ({sharing.describe()}): "
                             f"{exc}\n{_views(expected)}") from exc
    actual, error = run_impl(case, impl, device, build_shared(case, sharing, device))
    report = _diff(expected, actual)
    if error or report:
        where = f"sharing: {sharing.describe()}\n{_views(actual)}\n{_plain(case, impl, device)}"
        # A failure of k and v sharing memory is a bug of its own to Hypothesis (its own exception type), so
        # that it is shrunk and reported beside, not instead of, a failure of the caches' sharing
        inputs = where.endswith(SPECIFIC) and sharing.inputs.kind != "separate" and _inputs_own_buffers(
            case, sharing, impl, device, expected)
        if inputs:
            where += f"\n{INPUTS_SPECIFIC}"
        if error:
            fail(impl, "raises on a valid call whose caches share memory without sharing a byte:",
                 f"{error}\n{where}", case, kind="raises-inputs-shared" if inputs else "raises")
        fail(impl, f"differs from the reference (recipe {case.recipe}) when its tensors share memory:",
             f"{report}\n{where}", case, kind="inputs-shared" if inputs else "bytes")
