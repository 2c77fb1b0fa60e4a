"""Which scale rule a per-(token, head) write follows where its bytes are not the recipe's.

A per-token-head Case (strategies/per_token_head.py) is not ablated; its failure is located by
conformance/pth_bytediff.py (data bytes, stored scales, or outside the written slots). Where the data or the
scales are wrong, the reference is run again with each scale rule real kernels get wrong in place of the
recipe's (kernel/per_token_head.py, `head_scales`), and one that gives every byte of every buffer (the caches,
inline scales and scale caches, untouched bytes included) names the cause:
- one amax over all of a token's heads (a per-token scale where the recipe has one a head);
- NaN left out of a head's amax (fmaxf), where the recipe makes the head's scale NaN;
- a NaN scale floored (the floor's max drops NaN): a NaN head gets the floor as its scale;
- ±inf left out of a head's amax (an amax kept "robust" to outliers), where the recipe's scale is inf;
- the NaN flag reduced over all of a token's heads: one NaN makes every head of its token NaN;
- the floor put on the other side of the division (vLLM floors the scale, FlashInfer the amax);
- no floor at all: an all-zero head's scale is 0, and 0/0 is NaN (BUGS.md: kernels-community#681);
- the floor as a guard against 0/0 only: an all-zero head floored, a tiny nonzero one not;
- the signed maximum for the amax (`x.amax(-1)`, the abs left out);
- the scale computed in the input dtype (bf16/fp16 torch ops on the un-widened amax): its quotient and its
  floor rounded to that dtype, then widened;
- the amax taken over a head cast to fp16 (a bf16 or fp32 value past 65504 makes it inf, so its scale is inf
  and its finite values are written as zeros), the bytes still quantized from the values themselves;
- the right scale used for the bytes, and the unfloored one stored beside them (a floor kept for the division);
- the right scale used for the bytes, and its reciprocal stored (the factor the quantizer multiplied by);
- the right scale used for the bytes, and stored rounded to a bf16/fp16 input's dtype (a staging buffer made
  like the input, `torch.empty_like(x[..., 0])`);
- a NaN head quantized with a reciprocal of 0 (a guard `s > 0 ? 1/s : 0` that NaN fails), its NaN scale stored;
- another floor: the value the kernel stored for an all-zero head, read off its own bytes (a constant copied
  from a sibling kernel, such as vLLM's per-token activation floor 1 / (448 * 512)).
Before them, an inline scale is tried stored first in its row (a header, the data after it), a strided
cache_loc is tried read as contiguous (tokens at other tokens' slots), and separate scale
caches addressed as contiguous from their first element (their strides ignored), where the scales land when a
kernel computes their offsets from the shape.
None: no such rule explains it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from conformance.diagnosis.ablation import SizeRule, probed_rule, resized
from conformance.diagnosis.classify import Finding
from conformance.diagnosis.effects import _contiguous_strides
from kernel.per_token_head import (
    FLOOR_FLASHINFER,
    FLOOR_ON,
    FLOOR_VLLM,
    SCALE_BYTES,
    PTHPlan,
    get_pth_recipe,
    head_scales,
    make_pth_plan,
    quantize_heads,
    write_per_token_head,
    written_slots,
)
from kernel.recipe import PTH_RECIPES, PerTokenHeadRecipe
from kernel.reference import E4M3
from strategies.fp import f32
from strategies.per_token_head import HEAD_KINDS, PTHBuilt, PTHCase, build_pth

Scales = Callable[[torch.Tensor, PerTokenHeadRecipe], torch.Tensor]


def _per_token(x32: torch.Tensor, recipe: PerTokenHeadRecipe) -> torch.Tensor:
    """The recipe's rule over each token's H x D values at once, the same scale for every head."""
    s = head_scales(x32.flatten(-2)[..., None, :], recipe)
    return s.expand(x32.shape[:-1])


def _nan_dropped(x32: torch.Tensor, recipe: PerTokenHeadRecipe) -> torch.Tensor:
    return head_scales(torch.where(torch.isnan(x32), 0.0, x32), recipe)


def _inf_dropped(x32: torch.Tensor, recipe: PerTokenHeadRecipe) -> torch.Tensor:
    """The recipe's rule on the head's finite values (`|x|.masked_fill(isinf, 0).amax()`, an amax kept "robust"
    to an outlier): a head holding ±inf gets a finite scale, where the recipe's is inf; NaN still wins."""
    return head_scales(torch.where(torch.isinf(x32), 0.0, x32), recipe)


def _nan_over_heads(x32: torch.Tensor, recipe: PerTokenHeadRecipe) -> torch.Tensor:
    """The recipe's rule with the NaN flag reduced over all of a token's heads (an axis left out of the flag's
    reduction, the amax's kept): one NaN makes every head of its token NaN."""
    token_nan = torch.isnan(x32).flatten(-2).any(-1)[..., None].expand(x32.shape[:-1])
    return torch.where(token_nan, torch.nan, head_scales(x32, recipe))


def _signed_amax(x32: torch.Tensor, recipe: PerTokenHeadRecipe) -> torch.Tensor:
    """The recipe's rule on the signed maximum (`x.amax(-1)`, the abs left out): a head whose largest magnitude
    is negative gets a smaller scale, or the floor when all its values are negative."""
    nan = torch.isnan(x32)
    top = torch.where(nan, -torch.inf, x32).amax(-1)
    head = torch.zeros_like(x32)
    head[..., 0] = top.clamp(min=0)  # a head whose one value is that maximum (or 0): the recipe's rule on it
    return torch.where(nan.any(-1), torch.nan, head_scales(head, recipe))


def _nan_floored(x32: torch.Tensor, recipe: PerTokenHeadRecipe) -> torch.Tensor:
    """The recipe's rule with a floor that drops NaN (`torch.fmax`, C's fmaxf, Triton's compiled tl.maximum): a
    head holding a NaN gets the floored scale an all-zero head gets, where the recipe's scale is NaN."""
    s = head_scales(x32, recipe)
    return torch.where(torch.isnan(s), head_scales(torch.zeros_like(x32), recipe), s)


def _floored(where: str) -> Scales:
    """The recipe's rule with its floor on the amax ("amax"), on the scale ("scale"), or none ("none")."""
    return lambda x32, recipe: head_scales(x32, recipe, floor_on=where)


def _floor_on_zero(x32: torch.Tensor, recipe: PerTokenHeadRecipe) -> torch.Tensor:
    """The floor as a guard against 0/0 (`amax == 0 ? floor : amax / 448`): an all-zero head gets the recipe's
    floored scale, a nonzero head below the floor keeps its tiny one."""
    zero = torch.where(torch.isnan(x32), 1.0, x32).abs().amax(-1) == 0
    return torch.where(zero, head_scales(torch.zeros_like(x32), recipe), head_scales(x32, recipe, floor_on="none"))


def _by_reciprocal(x32: torch.Tensor, recipe: PerTokenHeadRecipe) -> torch.Tensor:
    """The recipe's rule with amax / 448 computed as amax * (1/448), the reciprocal rounded to fp32 first (a
    constant `1.0f / 448`, or fast-math turning the division by a constant into that multiply)."""
    return head_scales(x32, recipe, by_reciprocal=True)


def _in_dtype(dtype: torch.dtype) -> Scales:
    """The recipe's rule in `dtype`, as torch computes `amax / 448` and the floor's compare on a bf16/fp16 amax:
    each operation in fp32, rounded to the dtype; the scale widened after."""
    def scales(x32: torch.Tensor, recipe: PerTokenHeadRecipe) -> torch.Tensor:
        def r(t: torch.Tensor) -> torch.Tensor:
            return t.to(dtype).to(torch.float32)
        nan = torch.isnan(x32)
        amax = torch.where(nan, 0.0, x32.abs()).amax(-1)  # exact: |x| and max are exact in the dtype
        floor = r(torch.tensor(FLOOR_VLLM if recipe.rule == "vllm" else FLOOR_FLASHINFER, device=x32.device))
        if FLOOR_ON[recipe.rule] == "amax":
            s = r(torch.where(amax < floor, floor, amax) / 448.0)
        else:
            s = r(amax / 448.0)
            s = torch.where(s < floor, floor, s)
        return torch.where(nan.any(-1), torch.nan, s)
    return scales


def _amax_in_fp16(x32: torch.Tensor, recipe: PerTokenHeadRecipe) -> torch.Tensor:
    """The recipe's rule on the head rounded to fp16 (`x.half().abs().amax()`): past 65504 the amax is inf."""
    return head_scales(x32.to(torch.float16).to(torch.float32), recipe)


def _rounded_to(dtype: torch.dtype) -> Scales:
    """The recipe's scales rounded to `dtype` and widened back."""
    return lambda x32, recipe: head_scales(x32, recipe).to(dtype).to(torch.float32)


#: key, title, scale rule; the floor the recipe itself has (FLOOR_ON) is skipped for it.
RULES: tuple[tuple[str, str, Scales], ...] = (
    ("per-token-head:amax-over-heads", "takes one amax over all of a token's heads (a per-token scale)", _per_token),
    ("per-token-head:nan-dropped", "leaves NaN out of a head's amax (fmaxf), where the recipe's scale is NaN",
     _nan_dropped),
    ("per-token-head:nan-over-heads", "takes the NaN flag over all of a token's heads (one NaN makes every head of "
     "its token NaN), the amax per head", _nan_over_heads),
    ("per-token-head:nan-floored", "floors a NaN scale (a max that drops NaN: fmaxf, torch.fmax, a compiled "
     "tl.maximum), so a head holding a NaN gets the floor as its scale, where the recipe's is NaN", _nan_floored),
    ("per-token-head:inf-dropped", "leaves ±inf out of a head's amax, so a head holding one gets a finite scale "
     "where the recipe's is inf", _inf_dropped),
    ("per-token-head:floor-on-amax", "floors the amax, where the recipe floors the scale", _floored("amax")),
    ("per-token-head:floor-on-scale", "floors the scale, where the recipe floors the amax", _floored("scale")),
    ("per-token-head:no-floor", "has no floor: an all-zero head's scale is 0, and 0/0 is NaN", _floored("none")),
    ("per-token-head:floor-on-zero", "floors only an all-zero head's scale (a guard against 0/0): a nonzero head "
     "below the floor keeps its tiny scale", _floor_on_zero),
    ("per-token-head:scale-by-reciprocal", "computes each head's scale as amax times a float32 1/448, not "
     "amax / 448 (one float32 ulp off for about half of all amaxes)", _by_reciprocal),
    ("per-token-head:amax-signed", "takes each head's signed maximum, not its largest magnitude (the abs left out)",
     _signed_amax),
)


def _reciprocal(x32: torch.Tensor, recipe: PerTokenHeadRecipe) -> torch.Tensor:
    """1 / s in float32, correctly rounded: the factor a quantizer multiplied by, returned as the scale."""
    s = head_scales(x32, recipe)
    return torch.ones_like(s) / s


def _nan_reciprocal_zero(x32: torch.Tensor, recipe: PerTokenHeadRecipe) -> torch.Tensor:
    """The scales the bytes were quantized with where a NaN head's reciprocal is 0 (a guard `s > 0 ? 1/s : 0`
    that NaN fails): as if its scale were inf, its finite values become ±0, its NaN and inf ones NaN."""
    s = head_scales(x32, recipe)
    return torch.where(torch.isnan(s), torch.inf, s)


#: key, title, the rule of the scales quantized with, and the rule of those stored beside the bytes.
STORED_RULES: tuple[tuple[str, str, Scales, Scales], ...] = (
    ("per-token-head:stored-unfloored", "stores each head's scale before its floor, where the bytes use the "
     "floored one (an all-zero head stores 0)", head_scales, _floored("none")),
    ("per-token-head:stored-reciprocal", "stores each head's reciprocal scale (1/s, the factor it multiplied by) "
     "where the scale belongs", head_scales, _reciprocal),
    ("per-token-head:nan-reciprocal-zero", "quantizes a NaN head with a reciprocal of 0 (a guard such as "
     "`s > 0 ? 1/s : 0`, which NaN fails): its finite values are written as zeros, its NaN scale stored",
     _nan_reciprocal_zero, head_scales),
)


def _floor_read(plain: dict[str, torch.Tensor], got: dict[str, torch.Tensor], floor_word: int) -> float | None:
    """The one scale the kernel stored wherever the reference stores its floor (an all-zero head's scale, whose
    fp32 bits as int32 are `floor_word`), when that differs: the kernel's own floor. None where no such word
    differs, or they disagree."""
    found = set()
    for name, p in plain.items():
        n = p.numel() // 4 * 4
        ours, theirs = p[:n].view(torch.int32), got[name][:n].view(torch.int32)
        found |= set(theirs[(ours == floor_word) & (theirs != ours)].tolist())
    if len(found) != 1:
        return None
    value = torch.tensor([found.pop()], dtype=torch.int32).view(torch.float32).item()
    return value if math.isfinite(value) and value > 0 else None


def _floor_rule(plain: list[dict[str, torch.Tensor]], got: list[dict[str, torch.Tensor]],
                recipe: PerTokenHeadRecipe) -> tuple[str, str, Scales] | None:
    """The recipe's rule with the floor the kernel stored for an all-zero head (a constant copied from a sibling
    kernel, say), where the recipe's floor lands on the scale it stores; None where it stores none."""
    zero = head_scales(torch.zeros(1, 1), recipe)
    floors = {_floor_read(p, g, int(zero.view(torch.int32).item())) for p, g in zip(plain, got)} - {None}
    if len(floors) != 1:
        return None
    stored = floors.pop()
    # where the recipe floors the amax, the stored scale is floor / 448: the kernel's amax floor is that times 448
    value = stored if FLOOR_ON[recipe.rule] == "scale" else f32(stored * E4M3.max_finite)
    ours = FLOOR_VLLM if recipe.rule == "vllm" else FLOOR_FLASHINFER
    return ("per-token-head:floor-value", f"floors each head at {value:.6g}, not the recipe's {ours:.6g} (heads whose "
            "amax is below the floor get another scale)", lambda x32, r: head_scales(x32, r, floor=value))


def _whole(b: PTHBuilt) -> dict[str, torch.Tensor]:
    return {name: buf.cpu().reshape(-1).view(torch.uint8) for name, buf in b.buffers.items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[n], b[n]) for n in a)


def _as_contiguous(sc: torch.Tensor | None) -> torch.Tensor | None:
    """A scale cache addressed as if contiguous: its shape with contiguous strides, from its first element (over
    its own storage, which a strided cache's gaps make larger, and a permuted one's order leaves as large)."""
    if sc is None:
        return None
    return sc.as_strided(sc.shape, _contiguous_strides(sc.shape), sc.storage_offset())


def _scale_caches_contiguous(plan: PTHPlan) -> PTHPlan:
    return dataclasses.replace(plan, k_scale_cache=_as_contiguous(plan.k_scale_cache),
                               v_scale_cache=_as_contiguous(plan.v_scale_cache))


def _loc_contiguous(call: dict) -> dict:
    """cache_loc read as contiguous from its first element (its stride ignored: `slot_mapping_ptr + token_idx`)."""
    loc = call["cache_loc"]
    return {**call, "cache_loc": loc.as_strided(loc.shape, (1,), loc.storage_offset())}


def _reference_with(pc: PTHCase, device: torch.device, recipe: PerTokenHeadRecipe, scales: Scales,
                    stored: Scales | None = None, place: Callable[[PTHPlan], PTHPlan] | None = None,
                    read: Callable[[dict], dict] | None = None) -> dict[str, torch.Tensor]:
    """The reference's bytes with `scales` in place of the recipe's rule; with `stored`, the data quantized by
    `scales` and the scales `stored` gives written beside it; with `place`, the plan as a kernel misreads it;
    with `read`, the call's arguments as a kernel misreads them."""
    b = build_pth(pc, device)
    plan = make_pth_plan(**(b.call() if read is None else read(b.call())))
    plan = plan if place is None else place(plan)

    def quantize(x: torch.Tensor, _held: PerTokenHeadRecipe) -> tuple[torch.Tensor, torch.Tensor]:
        data, s = quantize_heads(x, recipe, scales)
        return data, s if stored is None else stored(x.to(torch.float32), recipe)
    if plan.num_tokens:
        write_per_token_head(plan, quantize)
    return _whole(b)


def _scale_first(pc: PTHCase, device: torch.device) -> dict[str, torch.Tensor]:
    """The reference's bytes with each written inline row's scale first: its 4 bytes at 0..3, its D bytes
    after them (a scale kept as a row header)."""
    b = build_pth(pc, device)
    plan = make_pth_plan(**b.call())
    if plan.num_tokens:
        write_per_token_head(plan)
        _, index = written_slots(plan)  # a slot named twice gathers and rolls the same row twice: one roll
        for cache in (plan.k_cache, plan.v_cache):
            rows = cache.view(torch.uint8) if cache.dtype != torch.uint8 else cache
            rows[index] = torch.roll(rows[index], SCALE_BYTES, dims=-1)
    return _whole(b)


def _with_special_heads(pc: PTHCase) -> list[PTHCase]:
    """The PTHCase with every head of K a special one (HEAD_KINDS in turn) and V as it was: a scale rule
    that differs from the recipe's only on zero, tiny, subnormal, inf or NaN heads shows there. Where the Case
    has fewer heads than kinds (one token of one head, say), several such Cases, each kind in one of them; none
    where the Case has no token."""
    c = pc.case
    n = c.num_tokens * c.num_heads
    if n == 0:
        return []
    return [dataclasses.replace(pc, heads=tuple(("k", t, h, HEAD_KINDS[(shift + t * c.num_heads + h) % len(HEAD_KINDS)])
                                                for t in range(c.num_tokens) for h in range(c.num_heads)))
            for shift in range(0, len(HEAD_KINDS), n)]


def _written(pc: PTHCase, impl, device: torch.device) -> dict[str, torch.Tensor] | None:
    from conformance.test_per_token_head import _run  # the property's own call of the implementation
    actual = build_pth(pc, device)
    return None if _run(impl, actual) is not None else _whole(actual)


def pth_cause(pc: PTHCase, impl, device: torch.device, held_only: bool = False) -> Finding | None:
    """The one scale rule of RULES under which the reference gives every byte the implementation wrote, on the
    failing PTHCase and on it with special heads (where a failing Case shows the rule only as the other
    recipe's rounding, say); the rule must differ from its recipe on one of them. Under the held recipe first,
    then under the other (a kernel of vLLM's arithmetic with FlashInfer's floor is closer to FlashInfer's
    recipe, so it is held to that). held_only: the held recipe's rules alone."""
    cases = [pc, *_with_special_heads(pc)]
    got = [_written(c, impl, device) for c in cases]
    if got[0] is None:
        return None
    cases, got = zip(*[(c, g) for c, g in zip(cases, got) if g is not None])
    held = get_pth_recipe(pc.mode)
    rules, stored_rules = list(RULES), list(STORED_RULES)
    if pc.case.input_dtype in ("bfloat16", "float16"):
        rules.append(("per-token-head:scale-in-input-dtype", f"computes each head's scale in {pc.case.input_dtype} "
                      "(the amax divided and floored before widening)", _in_dtype(getattr(torch, pc.case.input_dtype))))
        stored_rules.append(("per-token-head:stored-in-input-dtype", f"stores each head's scale rounded to "
                             f"{pc.case.input_dtype}, where the bytes use the float32 one", head_scales,
                             _rounded_to(getattr(torch, pc.case.input_dtype))))
    if pc.case.input_dtype in ("bfloat16", "float32"):
        rules.append(("per-token-head:amax-in-float16", "takes each head's amax over its values cast to float16 "
                      "(past 65504 the amax and the scale are inf, and the head's finite values are written as "
                      "zeros)", _amax_in_fp16))
    plains = {held.name: [_reference_with(c, device, held, head_scales) for c in cases]}
    if pc.case.loc_step != 1 and pc.case.num_tokens > 1:  # where the tokens go: a strided cache_loc read as contiguous
        want = [_reference_with(c, device, held, head_scales, read=_loc_contiguous) for c in cases]
        if all(_same(w, g) for w, g in zip(want, got)):
            return Finding("per-token-head", "per-token-head:cache-loc-stride-ignored", "with dynamic "
                           "per-(token, head) scales, reads cache_loc ignoring its stride (as if contiguous from its "
                           "first element), so tokens land at other tokens' slots", replayable=False)
    if pc.layout == "inline" and all(_same(_scale_first(c, device), g) for c, g in zip(cases, got)):
        return Finding("per-token-head", "per-token-head:inline-scale-first", "with dynamic per-(token, head) "
                       "scales, stores each head's inline scale before its D bytes (at 0..3, the data at 4..D+3), "
                       "where the layout puts it after them", replayable=False)
    if pc.layout == "separate":  # where the scales go, under the held recipe
        want = [_reference_with(c, device, held, head_scales, place=_scale_caches_contiguous) for c in cases]
        plain = plains[held.name]
        if not all(_same(w, p) for w, p in zip(want, plain)) and all(_same(w, g) for w, g in zip(want, got)):
            return Finding("per-token-head", "per-token-head:scale-caches-as-contiguous", "with dynamic "
                           "per-(token, head) scales, writes its scale caches ignoring their strides (as if "
                           "contiguous [pages, page_size, H] from their first element)", replayable=False)
    for recipe in [held, *(r for r in PTH_RECIPES.values() if r != held and not held_only)]:
        plain = plains.get(recipe.name) or [_reference_with(c, device, recipe, head_scales) for c in cases]
        floor = _floor_rule(plain, got, recipe)
        for key, title, scales, *stored in [*rules, *([floor] if floor else []), *stored_rules]:
            if key == f"per-token-head:floor-on-{FLOOR_ON[recipe.rule]}":
                continue
            want = [_reference_with(c, device, recipe, scales, *stored) for c in cases]
            if all(_same(w, p) for w, p in zip(want, plain)):  # the rule changes nothing here: not told apart
                continue
            if recipe != held and all(_same(w, p) for w, p in zip(want, plains[held.name])):
                continue  # another recipe's rule that gives the held recipe's bytes: no defect
            if all(_same(w, g) for w, g in zip(want, got)):
                other = "" if recipe == held else f" (under {recipe.name}, not the held {held.name})"
                return Finding("per-token-head", key, f"with dynamic per-(token, head) scales, {title}{other}",
                               replayable=False)
    return None


def pth_unwritten(pc: PTHCase, impl, device: torch.device) -> Finding | None:
    """Rows that tokens name left with their old bytes, where the call's every other byte is the reference's
    (a token taken for padding: a key of zeros read as a CUDA-graph padding row, say)."""
    from conformance.pth_bytediff import _slot_rows
    from conformance.test_per_token_head import _reference, _run
    case = pc.case
    before, expected, actual = (build_pth(pc, device) for _ in range(3))
    _reference(expected)
    if _run(impl, actual) is not None:
        return None
    named = {s for s in case.cache_loc if 0 <= s < case.num_slots}
    kept = set()
    for name in ("k_cache", "v_cache"):
        e, a, old = (_slot_rows(b, name) for b in (expected, actual, before))
        for slot in range(case.num_slots):
            if torch.equal(a[slot], e[slot]):
                continue
            if slot not in named or not torch.equal(a[slot], old[slot]):
                return None
            kept.add(slot)
    if not kept:
        return None
    return Finding("per-token-head", "per-token-head:unwritten", "with dynamic per-(token, head) scales, leaves "
                   f"slots that tokens name unwritten (their old bytes: slots {sorted(kept)})", replayable=False)


def pth_size_rule(pc: PTHCase, impl, device: torch.device, special: bool = False) -> SizeRule | None:
    """The rule on D a per-token-head failure follows (masked lanes filled with a value that wins the amax,
    where D is padded to a power of two): the PTHCase replayed at each probed D, with its own seed and the
    next (a size passes only where both calls are the held recipe's bytes); None where every size fails alike,
    no rule gives the outcomes, or the rule does not hold for the failing D.
    special: the failure is a named scale rule, which shows only on heads whose values tell it (a head below
    the floor, say), and new seeded values at another D may hold none: there the Case with special heads
    (`_with_special_heads`) must pass too. Else a guard that floors only zero heads, seen on a Case whose one
    value at D = 1 was small, read as a rule on D (held-out batch 59)."""
    held = get_pth_recipe(pc.mode)

    def fails(n: int) -> bool:
        for seed in (pc.case.seed, pc.case.seed + 1):
            variant = dataclasses.replace(pc, case=resized(pc.case, "dim", n).replace(seed=seed))
            for case in [variant, *(_with_special_heads(variant) if special else [])]:
                got = _written(case, impl, device)
                if got is None or not _same(_reference_with(case, device, held, head_scales), got):
                    return True
        return False
    return probed_rule(pc.case, "dim", fails)


def pth_raise_rules(pc: PTHCase, impl, device: torch.device, error: str) -> list[SizeRule]:
    """The rules on H, T and D a per-token-head call's raise follows (`probed_rule`): the PTHCase replayed at
    each probed size, a size failing where the call raises the same exception type. So one cause's raises
    group by what triggers them, whatever their messages (a shape in the message follows the layout)."""
    from conformance.test_per_token_head import _run
    etype = error.split(":", 1)[0]
    rules = []
    for attr in ("heads", "tokens", "dim"):
        def fails(n: int, attr: str = attr) -> bool:
            case = resized(pc.case, attr, n)
            heads = tuple(h for h in pc.heads if h[1] < case.num_tokens and h[2] < case.num_heads)
            got = _run(impl, build_pth(dataclasses.replace(pc, case=case, heads=heads), device))
            return got is not None and got.split(":", 1)[0] == etype
        rule = probed_rule(pc.case, attr, fails)
        if rule is not None:
            rules.append(rule)
    return rules
