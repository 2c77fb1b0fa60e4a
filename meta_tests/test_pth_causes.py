"""conformance/diagnosis/pth_causes.py names the scale rule a per-token-head write follows, on kernels made from
examples/vllm_per_token_head.py with one scale rule changed (its `_quantize` patched)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import examples.vllm_per_token_head as example
from conformance.conventions import get_convention
from conformance.diagnosis.pth_causes import pth_cause, pth_unwritten
from conformance.impls import Implementation
from strategies.case import Case, Layout, Override
from strategies.per_token_head import PTHCase

CPU = torch.device("cpu")


def _quantize_with(scale_of):
    """examples/vllm_per_token_head.py's _quantize with its scale computed by scale_of(x32) instead."""
    def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x32 = x.float()
        s = scale_of(x32)
        y = (x32 * (torch.ones_like(s) / s)[..., None]).clamp(-448.0, 448.0)
        q = torch.where(y.isnan(), 0x7F, y.to(torch.float8_e4m3fn).view(torch.uint8))
        return q, s
    return quantize


def _per_token(x32):
    amax = x32.abs().amax(dim=(-2, -1), keepdim=True).squeeze(-1).expand(x32.shape[:-1])
    return torch.maximum(amax / torch.full_like(amax, 448.0), torch.full_like(amax, 1e-6))


def _no_floor(x32):
    amax = x32.abs().amax(dim=-1)
    return amax / torch.full_like(amax, 448.0)


def _in_bf16(x32):
    """The scale computed on the bf16 amax (the Case's input dtype), as `x.abs().amax()` before `.float()` does."""
    amax = x32.to(torch.bfloat16).abs().amax(dim=-1)
    s = amax / torch.full_like(amax, 448.0)
    return torch.where(s < 1e-6, torch.full_like(s, 1e-6), s).float()


def _signed(x32):
    """The signed maximum, the abs left out: a head whose largest magnitude is negative gets a smaller scale."""
    amax = x32.amax(dim=-1)
    return torch.maximum(amax / torch.full_like(amax, 448.0), torch.full_like(amax, 1e-6))


def _inf_masked(x32):
    """An amax kept "robust" to outliers: ±inf masked out (NaN still propagates)."""
    amax = x32.abs().masked_fill(x32.isinf(), 0).amax(dim=-1)
    return torch.maximum(amax / torch.full_like(amax, 448.0), torch.full_like(amax, 1e-6))


def _nan_over_heads(x32):
    """Each head's amax, but the NaN flag over the whole token (an axis left out of its reduction)."""
    s = torch.maximum(x32.abs().amax(dim=-1) / 448.0, torch.full(x32.shape[:-1], 1e-6))
    return torch.where(x32.isnan().flatten(-2).any(-1, keepdim=True), torch.nan, s)


def _floor_of_per_token_quant(x32):
    """Another floor: vLLM's per-token activation quantizer's 1 / (448 * 512), copied into a per-head write."""
    amax = x32.abs().amax(dim=-1)
    return torch.maximum(amax / torch.full_like(amax, 448.0), torch.full_like(amax, 1.0 / (448.0 * 512.0)))


def _times_reciprocal(x32):
    """amax times a constant 1/448 ("a multiply is cheaper"; fast-math does it to a division by a constant)."""
    amax = x32.abs().amax(dim=-1)
    return torch.maximum(amax * (1.0 / 448.0), torch.full_like(amax, 1e-6))


_CASE = PTHCase(Case(num_tokens=3, num_heads=2, head_dim=8, page_size=4, num_pages=2, cache_loc=(5, 0, 2), seed=7,
                     cache_dtype="uint8"), "per-token-head-vllm", "separate", Layout.contiguous(3),
                Layout.contiguous(3))


@pytest.mark.parametrize(("scale_of", "key"), [(_per_token, "per-token-head:amax-over-heads"),
                                               (_no_floor, "per-token-head:no-floor"),
                                               (_in_bf16, "per-token-head:scale-in-input-dtype"),
                                               (_signed, "per-token-head:amax-signed"),
                                               (_inf_masked, "per-token-head:inf-dropped"),
                                               (_nan_over_heads, "per-token-head:nan-over-heads"),
                                               (_times_reciprocal, "per-token-head:scale-by-reciprocal"),
                                               (_floor_of_per_token_quant, "per-token-head:floor-value")])
def test_a_scale_rule_real_kernels_get_wrong_is_named(scale_of, key, monkeypatch):
    """The failing Case need not hold the heads that tell the rule (an all-zero head for the missing floor):
    the same Case with special heads does."""
    monkeypatch.setattr(example, "_quantize", _quantize_with(scale_of))
    impl = Implementation("pth", example.reshape_and_cache, convention=get_convention("vllm-per-token-head"))
    found = pth_cause(_CASE, impl, CPU)
    assert found is not None and found.key == key, found


def test_the_example_itself_names_no_rule():
    impl = Implementation("pth", example.reshape_and_cache, convention=get_convention("vllm-per-token-head"))
    assert pth_cause(_CASE, impl, CPU) is None


def test_a_scale_stored_before_its_floor_is_named(monkeypatch):
    """Held-out batch thirty-one: the floored scale divides, the unfloored one is stored (the data bytes right)."""
    right = _quantize_with(lambda x32: torch.maximum(_no_floor(x32), torch.full_like(_no_floor(x32), 1e-6)))

    def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return right(x)[0], _no_floor(x.float())
    monkeypatch.setattr(example, "_quantize", quantize)
    impl = Implementation("pth", example.reshape_and_cache, convention=get_convention("vllm-per-token-head"))
    found = pth_cause(_CASE, impl, CPU)
    assert found is not None and found.key == "per-token-head:stored-unfloored", found


def test_a_nan_head_quantized_with_a_zero_reciprocal_is_named(monkeypatch):
    """Held-out batch 53: `r = s > 0 ? 1/s : 0`, a division guard that NaN fails: a NaN head's finite values
    are written as zeros (x * 0), its NaN scale stored as the recipe's."""
    def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x32 = x.float()
        s = torch.maximum(_no_floor(x32), torch.full_like(_no_floor(x32), 1e-6))
        s = torch.where(x32.isnan().any(-1), torch.nan, s)
        r = torch.where(s > 0, torch.ones_like(s) / s, torch.zeros_like(s))
        y = (x32 * r[..., None]).clamp(-448.0, 448.0)
        return torch.where(y.isnan(), 0x7F, y.to(torch.float8_e4m3fn).view(torch.uint8)), s
    monkeypatch.setattr(example, "_quantize", quantize)
    impl = Implementation("pth", example.reshape_and_cache, convention=get_convention("vllm-per-token-head"))
    found = pth_cause(_CASE, impl, CPU)
    assert found is not None and found.key == "per-token-head:nan-reciprocal-zero", found


def test_a_reciprocal_stored_for_the_scale_is_named(monkeypatch):
    """Held-out batch 41: the quantizer returns the factor it multiplied by (1/s) as the head's scale."""
    right = _quantize_with(lambda x32: torch.maximum(_no_floor(x32), torch.full_like(_no_floor(x32), 1e-6)))

    def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, s = right(x)
        return q, torch.ones_like(s) / s
    monkeypatch.setattr(example, "_quantize", quantize)
    impl = Implementation("pth", example.reshape_and_cache, convention=get_convention("vllm-per-token-head"))
    found = pth_cause(_CASE, impl, CPU)
    assert found is not None and found.key == "per-token-head:stored-reciprocal", found


def test_a_scale_stored_in_the_input_dtype_is_named(monkeypatch):
    """Held-out batch 38: the fp32 scale divides, the one stored went through a staging buffer of the input's
    dtype (bf16 here: `torch.empty_like(x[..., 0])`)."""
    right = _quantize_with(lambda x32: torch.maximum(_no_floor(x32), torch.full_like(_no_floor(x32), 1e-6)))

    def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, s = right(x)  # a NaN scale kept as it is: torch's vectorized cast to bf16 makes it 0xFFFF
        return q, torch.where(s.isnan(), s, s.to(x.dtype).float())
    monkeypatch.setattr(example, "_quantize", quantize)
    impl = Implementation("pth", example.reshape_and_cache, convention=get_convention("vllm-per-token-head"))
    # 64 dims a head: some byte quantized with the rounded scale would differ, so the scale is only stored so
    # (on 8 dims, the scale computed in bf16 for the bytes too explained every byte as well)
    wide = dataclasses.replace(_CASE, case=_CASE.case.replace(head_dim=64))
    found = pth_cause(wide, impl, CPU)
    assert found is not None and found.key == "per-token-head:stored-in-input-dtype", found


def test_scale_caches_written_as_contiguous_are_named():
    """Held-out batch thirty-one's Triton write addressed its scale caches as contiguous [pages, page_size, H]
    from their first element: scales land outside the named slots of a strided or head-major scale cache."""
    def flat(key, value, key_cache, value_cache, slot_mapping, *, k_scale_cache, v_scale_cache):
        views = [sc.as_strided(sc.shape, torch.empty(sc.shape, device="meta").stride(), sc.storage_offset())
                 for sc in (k_scale_cache, v_scale_cache)]
        example.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale_cache=views[0],
                                  v_scale_cache=views[1])
    impl = Implementation("pth", flat, convention=get_convention("vllm-per-token-head"))
    head_major = Layout((0, 2, 1), (0, 0, 0))  # [P, page_size, H] stored with the heads outside the slots
    pc = dataclasses.replace(_CASE, k_scale_layout=head_major, v_scale_layout=head_major)
    found = pth_cause(pc, impl, CPU)
    assert found is not None and found.key == "per-token-head:scale-caches-as-contiguous", found


def test_a_cache_loc_read_as_contiguous_is_named():
    """Held-out batch fifty's pair read slot_mapping as `slot_mapping_ptr + token_idx` does, its stride ignored:
    a column of a [T, 2] tensor gives token t the t-th word from its start. Read as `per-token-head:values`, no
    cause named."""
    def flat_loc(key, value, key_cache, value_cache, slot_mapping, *, k_scale_cache, v_scale_cache):
        loc = slot_mapping.as_strided(slot_mapping.shape, (1,), slot_mapping.storage_offset())
        example.reshape_and_cache(key, value, key_cache, value_cache, loc, k_scale_cache=k_scale_cache,
                                  v_scale_cache=v_scale_cache)
    impl = Implementation("pth", flat_loc, convention=get_convention("vllm-per-token-head"))
    pc = dataclasses.replace(_CASE, case=_CASE.case.replace(loc_step=2))
    found = pth_cause(pc, impl, CPU)
    assert found is not None and found.key == "per-token-head:cache-loc-stride-ignored", found
    assert pth_cause(_CASE, impl, CPU) is None  # a contiguous cache_loc: nothing to name, nothing wrong


def test_a_write_whose_scale_caches_default_to_none_is_held_to_inline_scales_too():
    """Held-out batch thirty-two's inline write in vLLM's per-token-head signature (`k_scale_cache=None`) was
    never called inline, and its report said it conforms; the example, whose scale caches have no default,
    is held to scale caches only."""
    from conformance.test_per_token_head import _target

    def inline_too(key, value, key_cache, value_cache, slot_mapping, *, k_scale_cache=None, v_scale_cache=None):
        example.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale_cache=k_scale_cache,
                                  v_scale_cache=v_scale_cache)
    conv = get_convention("vllm-per-token-head")
    assert _target(Implementation("pth", inline_too, convention=conv))[1] == ("separate", "inline")
    assert _target(Implementation("pth", example.reshape_and_cache, convention=conv))[1] == ("separate",)


def _padded_amax(x32):
    """D padded to a power of two with -inf, then abs: every padded head's amax is +inf (held-out batch 33)."""
    d = x32.shape[-1]
    width = 1 << (d - 1).bit_length()
    padded = torch.nn.functional.pad(x32, (0, width - d), value=float("-inf"))
    amax = padded.abs().amax(dim=-1)
    return torch.maximum(amax / torch.full_like(amax, 448.0), torch.full_like(amax, 1e-6))


def test_a_rule_on_d_is_the_trigger(monkeypatch):
    """A failure only where D is not a power of two: replayed at the probed sizes, it names that rule; a rule
    every size shows (one amax a token) names none."""
    from conformance.diagnosis.pth_causes import pth_size_rule
    impl = Implementation("pth", example.reshape_and_cache, convention=get_convention("vllm-per-token-head"))
    odd = dataclasses.replace(_CASE, case=_CASE.case.replace(head_dim=12))
    monkeypatch.setattr(example, "_quantize", _quantize_with(_padded_amax))
    rule = pth_size_rule(odd, impl, CPU)
    assert rule is not None and rule.name == "dim-not-pow2", rule
    monkeypatch.setattr(example, "_quantize", _quantize_with(_per_token))
    assert pth_size_rule(odd, impl, CPU) is None


def _zero_guard(x32):
    """`amax == 0 ? 1e-6 : amax / 448`: the floor as a guard against 0/0 (held-out batch 34)."""
    amax = x32.abs().amax(dim=-1)
    return torch.where(amax == 0, torch.full_like(amax, 1e-6), amax / torch.full_like(amax, 448.0))


def test_a_floor_kept_for_zero_heads_only_is_named_on_one_head(monkeypatch):
    """One token of one head: each special head kind is tried in a Case of its own, so the small head that tells
    the guard from the floor is among them."""
    monkeypatch.setattr(example, "_quantize", _quantize_with(_zero_guard))
    impl = Implementation("pth", example.reshape_and_cache, convention=get_convention("vllm-per-token-head"))
    one = dataclasses.replace(_CASE, case=_CASE.case.replace(num_tokens=1, num_heads=1, cache_loc=(5,)))
    found = pth_cause(one, impl, CPU)
    assert found is not None and found.key == "per-token-head:floor-on-zero", found


def _amax_of_half(x32):
    """`x.half().abs().amax()` for the amax, the bytes quantized from x itself (held-out batch 36)."""
    amax = x32.half().abs().amax(dim=-1).float()
    return torch.maximum(amax / torch.full_like(amax, 448.0), torch.full_like(amax, 1e-6))


def test_an_amax_taken_in_fp16_is_named_where_a_bf16_value_passes_65504(monkeypatch):
    monkeypatch.setattr(example, "_quantize", _quantize_with(_amax_of_half))
    impl = Implementation("pth", example.reshape_and_cache, convention=get_convention("vllm-per-token-head"))
    big = dataclasses.replace(_CASE, case=_CASE.case.replace(overrides=(Override("k", 3, 0x7F7F, "max-finite"),)))
    found = pth_cause(big, impl, CPU)
    assert found is not None and found.key == "per-token-head:amax-in-float16", found


def test_a_token_taken_for_padding_is_named_unwritten():
    """Held-out batch 52's pair: a token whose key is all zeros taken for a CUDA-graph padding row, its rows and
    scales never written. No scale rule explains it; its slot keeps its old bytes."""
    def zero_rows_skipped(key, value, key_cache, value_cache, slot_mapping, *, k_scale_cache, v_scale_cache):
        keep = (key != 0).flatten(1).any(1)
        slots = torch.where(keep, slot_mapping, torch.full_like(slot_mapping, -1))
        example.reshape_and_cache(key, value, key_cache, value_cache, slots, k_scale_cache=k_scale_cache,
                                  v_scale_cache=v_scale_cache)
    impl = Implementation("pth", zero_rows_skipped, convention=get_convention("vllm-per-token-head"))
    one_head = dataclasses.replace(_CASE, case=_CASE.case.replace(num_heads=1), heads=(("k", 1, 0, "zero"),))
    found = pth_cause(one_head, impl, CPU) or pth_unwritten(one_head, impl, CPU)
    assert found is not None and found.key == "per-token-head:unwritten", found
    assert pth_unwritten(_CASE, impl, CPU) is None  # no key of zeros: nothing left unwritten


def test_a_write_one_scale_rule_off_the_conventions_recipe_is_held_to_it(monkeypatch):
    """Held-out batch 54: vLLM's arithmetic (the reciprocal multiplied) with the floor put on the amax,
    `amax.clamp(min=1e-6) / 448`, differs from FlashInfer's recipe in fewer bytes than from vLLM's; held to the
    closest, its report named two defects (FlashInfer's floor value and vLLM's floor placement). One rule off
    vLLM's recipe explains every probe byte, and one FlashInfer rule does not (the probe's ordinary values
    tell the reciprocal from the division)."""
    from conformance.diagnosis.pth_identification import identify_per_token_head

    def floored_amax(x32):
        return x32.abs().amax(dim=-1).clamp(min=1e-6) / 448.0
    monkeypatch.setattr(example, "_quantize", _quantize_with(floored_amax))
    impl = Implementation("pth", example.reshape_and_cache, convention=get_convention("vllm-per-token-head"))
    held, note = identify_per_token_head(impl, CPU)
    assert held == "per-token-head-vllm" and "per-token-head:floor-on-amax" in note, (held, note)


def test_a_nan_scale_floored_is_named(monkeypatch):
    """Held-out batch 54's pair floored with `torch.fmax`, which drops NaN: a NaN head gets the floor as its
    scale (its finite values saturate), where the recipe's scale is NaN."""
    def fmax_floor(x32):
        amax = x32.abs().amax(dim=-1)
        return torch.fmax(amax / torch.full_like(amax, 448.0), torch.full_like(amax, 1e-6))
    monkeypatch.setattr(example, "_quantize", _quantize_with(fmax_floor))
    impl = Implementation("pth", example.reshape_and_cache, convention=get_convention("vllm-per-token-head"))
    nan_head = dataclasses.replace(_CASE, heads=(("k", 0, 1, "nan"),))
    found = pth_cause(nan_head, impl, CPU)
    assert found is not None and found.key == "per-token-head:nan-floored", found


def test_an_inline_scale_stored_first_is_named():
    """Held-out batch 54: each inline row written as the scale's 4 bytes, then the D data bytes."""
    def header(key, value, key_cache, value_cache, slot_mapping, *, k_scale_cache=None, v_scale_cache=None):
        shape = (*key_cache.shape[:-1], 1)
        ks, vs = (torch.empty(shape, dtype=torch.float32).squeeze(-1) for _ in range(2))
        dim = key.shape[-1]
        k_rows, v_rows = (torch.empty(c.shape[:-1] + (dim,), dtype=c.dtype) for c in (key_cache, value_cache))
        example.reshape_and_cache(key, value, k_rows, v_rows, slot_mapping, k_scale_cache=ks, v_scale_cache=vs)
        for cache, rows, s in ((key_cache, k_rows, ks), (value_cache, v_rows, vs)):
            loc = slot_mapping[(slot_mapping >= 0) & (slot_mapping < cache.shape[0] * cache.shape[1])]
            at = (loc // cache.shape[1], loc % cache.shape[1])
            cache.view(torch.uint8)[at] = torch.cat((s[at].contiguous().view(torch.uint8).reshape(*s[at].shape, 4),
                                                     rows.view(torch.uint8)[at]), dim=-1)
    impl = Implementation("pth", header, convention=get_convention("vllm-per-token-head"))
    inline = dataclasses.replace(_CASE, layout="inline", k_scale_layout=None, v_scale_layout=None)
    found = pth_cause(inline, impl, CPU)
    assert found is not None and found.key == "per-token-head:inline-scale-first", found


def test_a_per_token_head_raise_is_keyed_by_the_sizes_that_trigger_it():
    """Held-out batch 54's pair: a bare `.squeeze()` drops the head dim of a one-head batch of several tokens,
    and the store raises, its message's shapes those of each layout (two keys by text, one by trigger)."""
    from conformance.diagnosis.pth_causes import pth_raise_rules

    def squeezed(key, value, key_cache, value_cache, slot_mapping, *, k_scale_cache, v_scale_cache):
        if key.shape[1] == 1 and key.shape[0] > 1:
            raise RuntimeError(f"shape mismatch: value tensor of shape [{key.shape[0]}] cannot be broadcast")
        example.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale_cache=k_scale_cache,
                                  v_scale_cache=v_scale_cache)
    impl = Implementation("pth", squeezed, convention=get_convention("vllm-per-token-head"))
    one_head = dataclasses.replace(_CASE, case=_CASE.case.replace(num_heads=1))
    rules = pth_raise_rules(one_head, impl, CPU, "RuntimeError: shape mismatch")
    assert [r.name for r in rules] == ["heads-below:2", "tokens-above:1"], rules


def test_a_named_scale_rule_gets_no_rule_on_d_from_the_values_a_size_happens_to_draw(monkeypatch):
    """A guard that floors only zero heads, on one head whose one value at D = 1 is small: at larger D the
    seeded values are not, and the plain replay passes, which read as "only when D is below 2" beside the
    same rule keyed without it (held-out batch 59). Replayed with special heads too, every size shows the
    rule, so none is named; a real rule on D (masked lanes in the amax) is still found that way."""
    from conformance.diagnosis.pth_causes import pth_size_rule
    impl = Implementation("pth", example.reshape_and_cache, convention=get_convention("vllm-per-token-head"))
    monkeypatch.setattr(example, "_quantize", _quantize_with(_zero_guard))
    one = dataclasses.replace(_CASE, case=_CASE.case.replace(num_tokens=1, num_heads=1, head_dim=1, cache_loc=(5,),
                                                             seed=3))
    assert pth_cause(one, impl, CPU).key == "per-token-head:floor-on-zero"
    plain = pth_size_rule(one, impl, CPU)
    assert plain is not None and plain.name == "dim-below:2", plain  # what the plain replay reads
    assert pth_size_rule(one, impl, CPU, special=True) is None
    monkeypatch.setattr(example, "_quantize", _quantize_with(_padded_amax))
    odd = dataclasses.replace(_CASE, case=_CASE.case.replace(head_dim=12))
    rule = pth_size_rule(odd, impl, CPU, special=True)
    assert rule is not None and rule.name == "dim-not-pow2", rule
