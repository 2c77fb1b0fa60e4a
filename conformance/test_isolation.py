"""Isolation: a call writes the bytes of the slots its tokens name, and nothing else.

What may be written is computed from the Case (conformance.cachemap), not from the reference, so
these properties hold an implementation to the contract even where the reference itself is wrong.
Every byte comparison goes through conformance.bytediff (its report says where a byte sits).
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.bytediff import diff_buffers
from conformance.cachemap import CACHES, guard_mask, logical_slots, written_mask
from conformance.harness import check_case, execute, fail
from conformance.impls import Implementation, Inexpressible
from kernel.plan import make_plan
from kernel.reference import quantize
from strategies.build import INPUT_GUARD, POISON_BITS, Built, build
from strategies.case import Case
from strategies.layouts import strided_layouts
from strategies.locations import padded_rows


def _run(case: Case, impl: Implementation, device: torch.device) -> tuple[Built, dict[str, torch.Tensor]]:
    built = build(case, device)
    before = built.snapshot()
    execute(impl, built)
    return built, before


def _unwritten_report(built: Built, before: dict[str, torch.Tensor], only: str) -> str | None:
    """Byte-diff each cache against its snapshot, outside the written slots (or in the guards)."""
    reports = []
    for which in CACHES:
        old, new = before[which].cpu(), built.buffers[which].cpu()
        keep = guard_mask(built.case, which) if only == "guards" else ~written_mask(built.case, which)
        expected = torch.where(keep, old, new)  # the written bytes are bit-exact's business
        report = diff_buffers(built, which, expected, new)
        if report:
            reports.append(report)
    return "\n".join(reports) or None


@given(data=st.data())
def test_unwritten_slots_keep_their_bytes(data, impl, device):
    case = data.draw(impl.cases(), label="case")
    built, before = _run(case, impl, device)
    report = _unwritten_report(built, before, only="unwritten")
    if report:
        fail(impl, f"changed bytes outside the slots cache_loc names {list(case.cache_loc)}:", report, case)


@given(data=st.data())
def test_guard_bands_untouched(data, impl, device):
    case = data.draw(impl.cases(), label="case")
    case = case.replace(
        k_cache_layout=data.draw(strided_layouts(4, "k_cache_layout"), label="k_cache_layout"),
        v_cache_layout=data.draw(strided_layouts(4, "v_cache_layout"), label="v_cache_layout"),
        cache_rank=4)
    built, before = _run(case, impl, device)
    report = _unwritten_report(built, before, only="guards")
    if report:
        fail(impl, "wrote into a guard band around a cache:", report, case)


def _poison_count(built: Built, name: str) -> int:
    bits_dtype = torch.int16 if built.k.element_size() == 2 else torch.int32
    poison = POISON_BITS[built.case.input_dtype]
    bits = built.buffers[name].cpu().view(bits_dtype).to(torch.int64) & ((1 << (8 * built.k.element_size())) - 1)
    layout = built.case.k_layout if name == "k" else built.case.v_layout
    return int((bits[INPUT_GUARD:INPUT_GUARD + layout.span(built.case.input_shape)] == poison).sum())


@given(data=st.data())
def test_poisoned_gaps_are_never_read(data, impl, device):
    """Inputs with NaN-poisoned gaps between their elements still give exactly the reference bytes."""
    case = data.draw(impl.cases(input_ranks=(3,), cache_ranks=(4,)), label="case")
    case = case.replace(k_layout=data.draw(strided_layouts(3, "k_layout", gaps=True), label="k_layout"),
                        v_layout=data.draw(strided_layouts(3, "v_layout", gaps=True), label="v_layout"))
    built = build(case, device)
    gaps = {name: _poison_count(built, name) for name in ("k", "v")}
    # Meaningful only if the layout has gaps inside the span (a stride step or padding).
    assert case.num_tokens == 0 or all(n > 0 for n in gaps.values()), \
        f"layouts {case.k_layout}, {case.v_layout} left no poisoned gaps: {gaps}"
    check_case(case, impl, device)


@given(data=st.data())
def test_inputs_are_left_unmodified(data, impl, device):
    """k, v, cache_loc and tensor scales: whole buffers (gaps and guards included) keep their bits."""
    case = data.draw(impl.cases(), label="case")
    built, before = _run(case, impl, device)
    for name, old in before.items():
        if name in CACHES:
            continue
        old_bytes = old.reshape(-1).view(torch.uint8)  # reshape: a 0-d scale cannot be viewed as bytes
        new_bytes = built.buffers[name].reshape(-1).view(torch.uint8)
        if not torch.equal(old_bytes, new_bytes):
            diff = (old_bytes != new_bytes).nonzero().flatten()[:8].tolist()
            fail(impl, f"modified its input {name} (dtype {old.dtype}, {old.numel()} elements):",
                 f"first changed bytes of the buffer at {diff}", case)


def _out_of_range(num_slots: int, loc_dtype: str) -> st.SearchStrategy[int]:
    top = 2**31 - 1 if loc_dtype == "int32" else 2**63 - 1
    return st.integers(num_slots, num_slots + 64) | st.sampled_from((top, 2**31 - 1, 2**20))


@given(data=st.data())
def test_out_of_range_slots_write_nothing(data, impl, device):
    """With checked=False, entries >= num_slots are skipped: only in-range slots change."""
    case = data.draw(impl.cases(), label="case")
    t = case.num_tokens
    if t == 0:
        case = case.replace(num_tokens=1, cache_loc=(0,))
        t = 1
    n = case.num_slots
    entry = st.integers(-3, -1) | st.integers(0, n - 1) | _out_of_range(n, case.loc_dtype)
    locs = data.draw(st.lists(entry, min_size=t, max_size=t), label="cache_loc")
    bad = data.draw(st.integers(0, t - 1), label="forced_out_of_range_token")
    locs[bad] = data.draw(_out_of_range(n, case.loc_dtype), label="forced_out_of_range_value")
    case = case.replace(cache_loc=tuple(locs), checked=False)
    built, before = _run(case, impl, device)
    report = _unwritten_report(built, before, only="unwritten")
    if report:
        fail(impl, f"wrote outside the in-range slots of cache_loc {locs} (num_slots={n}):", report, case)


@given(data=st.data())
def test_keys_padded_past_cache_loc_write_cache_locs_tokens_alone(data, impl, device):
    """vLLM's CUDA-graph padding: K and V longer than slot_mapping, the batch's T its length (vllm#13922). The
    call writes cache_loc's tokens, bit-exact, and nothing of the rows past them (whole caches compared). A
    convention that takes one key a cache_loc entry is not held to it (a skip that says so)."""
    case = data.draw(impl.cases(), label="case")
    case = case.replace(padded_rows=data.draw(padded_rows(), label="padded_rows"))
    reason = impl.convention.why_not(case)
    if reason:
        raise Inexpressible(reason)
    check_case(case, impl, device)


@given(data=st.data())
def test_duplicate_slots_hold_one_tokens_bytes(data, impl, device):
    """Two tokens naming one slot: each byte of it is the byte one of them would write."""
    case = data.draw(impl.cases(), label="case")
    t = max(case.num_tokens, 2)
    few = data.draw(st.lists(st.integers(0, case.num_slots - 1), min_size=1, max_size=2, unique=True),
                    label="shared_slots")
    locs = data.draw(st.lists(st.sampled_from(few) | st.integers(-1, case.num_slots - 1), min_size=t,
                              max_size=t), label="cache_loc")
    locs[0] = locs[1] = few[0]  # at least one collision
    case = case.replace(num_tokens=t, cache_loc=tuple(locs))
    built, before = _run(case, impl, device)
    plan = make_plan(**build(case, device).call())
    for which, x, scale in (("k_cache", plan.k, plan.k_scale), ("v_cache", plan.v, plan.v_scale)):
        candidates = quantize(x, scale, plan.recipe, plan.cache_format).cpu()  # [T, H, D]: what each token writes
        for slot in sorted({s for s in locs if s >= 0}):
            tokens = [i for i, s in enumerate(locs) if s == slot]
            got = logical_slots(built, which, [slot])[0]
            ok = (candidates[tokens] == got[None]).any(0)
            if not bool(ok.all()):
                h, d = (~ok).nonzero()[0].tolist()
                fail(impl, f"{which} slot {slot}, named by tokens {tokens}, holds a byte none of them writes:",
                     f"head {h} dim {d} holds 0x{int(got[h, d]):02X}, not one of "
                     f"{[f'0x{int(c):02X}' for c in candidates[tokens, h, d]]}; cache_loc={locs}", case)
