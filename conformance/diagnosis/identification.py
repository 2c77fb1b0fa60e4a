"""Which recipe does an implementation compute? The sweep behind `--recipe auto` and `tools.identify`.

Every bf16 and fp16 bit pattern (65,536 each) times a set of scales goes through the implementation,
called in its own convention, and its bytes are compared with the reference under every recipe.

The scale set is chosen so that every pair of recipes differs somewhere in it: a non-dyadic scale
(0.3) separates the roundings, and the smallest fp32 subnormal (2**-149, whose reciprocal is inf)
separates multiply-by-reciprocal from division. The quick set (the default on the CPU, where a
65,536-element interpreted call costs about a second) keeps those; the full set (the default on
CUDA) adds powers of two, more non-dyadic, tiny and huge scales, and passes each as a Python float,
a 0-d tensor and a 1-element tensor (implementations built on `div_` differ between those). A scale
kind the convention cannot pass (vLLM takes tensors only) is passed as one it can, same value.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from conformance.conventions import KVFP8, Convention
from conformance.impls import Implementation
from kernel import RECIPES, naive_fp8_set_kv_buffer

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
KINDS = ("float", "tensor0d", "tensor1")
# (kind, value): None for the overflow rules, 0.3 and 0.9 for the roundings (0.9 separates `single`
# from `divide` on 30 patterns a dtype, 0.3 on 2), 2**-149 for reciprocal versus division (only the
# zeros differ there: 0 * inf is NaN, 0 / 2**-149 is 0).
QUICK = (("none", 1.0), ("float", 0.3), ("float", 0.9), ("float", 2.0**-149))
FULL_SCALES = (1.0, 0.5, 2.0, 2.0**-6, 2.0**10,  # powers of two
               0.3, 0.9, 0.7, 1.7, 0.1,  # non-dyadic
               1e-30, 1e-38, 2.0**-149,  # tiny (1e-38 and 2**-149 are fp32 subnormals)
               1e30, 3e38)  # huge
APPROXIMATE = "within two fp32 ulps before the cast"
TIES_AWAY = "ties rounded away from zero"
# DAZ: fp32 arithmetic compiled with denormals-are-zero (nvcc/Triton fast-math, -ftz) or an explicit flush reads a
# subnormal input as 0; the byte written is the recipe's byte for +0 or for the input's signed zero
INPUTS_AS_ZERO = "subnormal inputs read as zero"
TOKENS, HEADS, DIM = 128, 4, 128  # 65,536 elements: one bit pattern each, one slot a token (page_size 1)
PAGED = 16  # the page size the sweep retries a point with when pages of one slot raise


@dataclass(frozen=True)
class Point:
    """One sweep point: all 65,536 patterns of `dtype` with one scale argument."""

    dtype: str
    kind: str  # "none" or one of KINDS
    value: float

    def __str__(self) -> str:
        return f"{self.dtype} scale=None" if self.kind == "none" else \
            f"{self.dtype} scale={self.value!r} ({self.kind})"

    def arg(self, device: torch.device) -> float | torch.Tensor | None:
        if self.kind == "none":
            return None
        if self.kind == "float":
            return self.value
        return torch.full(() if self.kind == "tensor0d" else (1,), self.value, dtype=torch.float32,
                          device=device)


@dataclass
class Result:
    points: list[Point]
    diffs: dict[str, dict[Point, torch.Tensor]] = field(default_factory=dict)  # recipe -> point -> bad patterns
    actual: dict[Point, torch.Tensor] = field(default_factory=dict)
    expected: dict[str, dict[Point, torch.Tensor]] = field(default_factory=dict)
    errors: dict[Point, str] = field(default_factory=dict)

    def count(self, recipe: str, kind: str | None = None) -> int:
        return sum(v.numel() for p, v in self.diffs[recipe].items() if kind is None or p.kind in (kind, "none"))

    def matches(self, kind: str | None = None) -> list[str]:
        if self.errors:
            return []
        return [r for r in self.diffs if self.count(r, kind) == 0]

    def closest(self) -> str:
        """The recipe it computes up to one deviation: first one that every plain-dtype point (bf16, the
        plain call's) matches, NaN's sign aside, then one whose differing bytes a single class explains (flush to zero,
        round toward zero, ties away from zero, within two fp32 ulps, double rounding), then the most points
        matched, then the fewest rounding steps (no intermediate rounding, no rounded scale), then the fewest differing
        bytes. A kernel that double-rounds fp16 only is held to what it computes for bf16;
        one that gives NaN past 464 to the recipe whose finite bytes it writes."""
        plain = [p for p in self.actual if p.dtype == "bfloat16"]

        def rank(recipe: str) -> tuple:
            bad = {p: self.finite_diffs(recipe, p) for p in self.actual}
            plain_ok = bool(plain) and all(not bad[p].numel() for p in plain)
            points = sum(not bad[p].numel() for p in self.actual)
            fitting = _fitting_classes(self, recipe)
            # an exact rule first; "within two fp32 ulps" also fits a double rounding near e4m3 ties
            exact = any(c != APPROXIMATE for c in fitting)
            steps = RECIPES[recipe].intermediate == "input", RECIPES[recipe].scale_dtype == "input"
            return (not plain_ok, not exact, not fitting, -points, sum(steps), sum(b.numel() for b in bad.values()))
        return min(self.diffs, key=rank)

    def finite_diffs(self, recipe: str, point: Point) -> torch.Tensor:
        """The bytes of a point that differ from `recipe`, less those where both are NaN bytes (a NaN's sign is
        an encoding rule, which the properties key on their own: a kernel that keeps it still computes a recipe,
        and every recipe misses it alike)."""
        bad = self.diffs[recipe][point]
        e, a = self.expected[recipe][point][bad], self.actual[point][bad]
        return bad[((e & 0x7F) != 0x7F) | ((a & 0x7F) != 0x7F)]

    @property
    def swept_bytes(self) -> int:
        return 2 * 65536 * len(self.actual)  # K and V


def expressible(point: Point, convention: Convention) -> Point:
    """The point with its scale kind replaced by one the convention can pass, when it cannot."""
    if point.kind in convention.scale_kinds:
        return point
    kind = next(k for k in ("tensor1", "tensor0d", "float") if k in convention.scale_kinds)
    return Point(point.dtype, kind, point.value)


def sweep_points(dtypes: list[str], full: bool, kinds: tuple[str, ...] = KINDS,
                 convention: Convention = KVFP8) -> list[Point]:
    """The quick set (its scales in the convention's plain kind: a 1-element tensor where it takes one), or
    None plus every full scale in every kind, for each dtype (as the convention can pass them; duplicates
    dropped)."""
    if not full:  # the scale as the plain call passes it: a defect of one other kind must not move the recipe
        points = [Point(d, k if k == "none" else convention.plain_scale_kind, s) for d in dtypes for k, s in QUICK]
    else:
        points = [p for d in dtypes
                  for p in [Point(d, "none", 1.0)] + [Point(d, k, s) for s in FULL_SCALES for k in kinds]]
    return list(dict.fromkeys(expressible(p, convention) for p in points))


def _patterns(dtype: str, device: torch.device) -> torch.Tensor:
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)  # wraps: 0x8000.. are the negatives
    return bits.view(DTYPES[dtype]).reshape(TOKENS, HEADS, DIM).to(device)


def _call(impl: Implementation, x: torch.Tensor, ks, vs, device: torch.device,
          recipe: str | None = None, page_size: int = 1, tokens: int = TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """A write of x as K (scale ks) and V (scale vs), token t to slot t, in calls of `tokens` tokens; returns
    both caches' bytes. Pages of `page_size` slots: the caches' bytes are in slot order whatever it is."""
    return _call_slots(impl, x, ks, vs, device, recipe, page_size, tokens, TOKENS)


def _call_alone(impl: Implementation, x: torch.Tensor, ks, vs, device: torch.device,
                recipe: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """As `_call`, but each token alone, to slot 0 of a cache of one slot (a kernel that computes any other
    slot wrongly still shows its recipe there), its bytes then taken as slot t's."""
    rows = [_call_slots(impl, x[t:t + 1], ks, vs, device, recipe, 1, 1, 1) for t in range(x.shape[0])]
    return tuple(torch.cat([r[i] for r in rows]) for i in range(2))


def _call_slots(impl: Implementation, x: torch.Tensor, ks, vs, device: torch.device, recipe: str | None,
                page_size: int, tokens: int, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (slots // page_size, page_size, HEADS, DIM)
    caches = [torch.zeros(shape, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn) for _ in "kv"]
    for start in range(0, x.shape[0], tokens):
        rows = slice(start, start + tokens)
        # each call its own scale tensors (equal values): a kernel that writes its scale in place (inverts it)
        # must not change the next call's, nor V's through K's (the isolation tests report the writing)
        fresh = [s.clone() if isinstance(s, torch.Tensor) else s for s in (ks, vs)]
        call = {"k": x[rows], "v": x[rows], "k_cache": caches[0], "v_cache": caches[1],
                "cache_loc": torch.arange(x.shape[0], device=device)[rows], "k_scale": fresh[0], "v_scale": fresh[1],
                "page_size": page_size, "checked": False}
        if recipe:
            call["recipe"] = recipe
        impl.invoke(call)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return tuple(c.view(torch.uint8).reshape(-1) for c in caches)


_REFERENCE = Implementation("reference", naive_fp8_set_kv_buffer)


@functools.lru_cache(maxsize=256)
def _reference(point: Point, recipe: str, device: str) -> torch.Tensor:
    """The reference's K and V bytes for one point (the same for every implementation: computed once)."""
    dev = torch.device(device)
    return torch.cat(_call(_REFERENCE, _patterns(point.dtype, dev), point.arg(dev), point.arg(dev), dev,
                           recipe)).cpu()


def identify(impl: Implementation, points: list[Point], device: torch.device, tokens: int = TOKENS,
             alone: bool = False) -> Result:
    """Run the sweep through impl and through the reference under every recipe.

    Each point is one call (or calls of `tokens` tokens) with the same scale for K and V, so that a defect in
    how one scale is passed (the properties' business) does not hide the recipe. Index i of a point's bytes is
    pattern i % 65536, of K below 65536 and of V above. `alone`: each token alone, to slot 0 of a one-slot
    cache (`_call_alone`).
    """
    res = Result(points, {r: {} for r in RECIPES}, {}, {r: {} for r in RECIPES})
    told = impl.recipe if impl.convention.told_recipe else None
    for p in points:
        scale = p.arg(device)
        try:
            try:
                x = _patterns(p.dtype, device)
                got = (_call_alone(impl, x, scale, scale, device, told) if alone
                       else _call(impl, x, scale, scale, device, told, tokens=tokens))
            except Exception:
                if alone:
                    raise
                # Pages of one slot are the sweep's simplest layout; a kernel that assumes the common page
                # size (a hard-coded 16) refuses them, and the recipe is still to be found.
                got = _call(impl, _patterns(p.dtype, device), scale, scale, device, told, PAGED, tokens)
        except Exception as exc:  # an implementation's crash is a result of the sweep, not an abort
            res.errors[p] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            continue
        res.actual[p] = torch.cat(got).cpu()
        for name in RECIPES:
            res.expected[name][p] = _reference(p, name, str(device))
            res.diffs[name][p] = (res.expected[name][p] != res.actual[p]).nonzero().flatten()
    return res


def identify_robustly(impl: Implementation, points: list[Point], device: torch.device) -> tuple[str, str]:
    """held_recipe of the sweep; where the whole batch matches no recipe (or raises), the sweep again one token
    a call, then (where it raised, or its residual is no value class) each token alone at slot 0 of a one-slot
    cache: a kernel whose defect is where tokens go (a tile's slots, a slot split into page and offset the
    wrong way round) still computes a recipe, and its defect is the properties' to find."""
    first = identify(impl, points, device)
    recipe, note = held_recipe(first)
    if note.startswith("identified"):
        return recipe, note
    if not first.actual:  # it raised on every point: a kernel may refuse one of the scale forms its convention has
        refused = next(iter(first.errors.values()), "")
        for kind, other in _other_scale_forms(points, impl.convention.scale_kinds):
            again, again_note = held_recipe(identify(impl, other, device))
            if again_note.startswith("identified"):
                return again, f"{again_note}, the scale as a {kind} (it raised on every sweep point: {refused})"
    tries = [("one token a call", False)]
    if first.errors or "class:" not in note:  # not a value residual the sweep already classed: a slot defect?
        tries.append(("each token alone at slot 0 of a one-slot cache", True))
    screen = _worst_points(first)
    for how, alone in tries:
        if screen and not _may_match(identify(impl, screen, device, tokens=1, alone=alone)):
            continue
        again, again_note = held_recipe(identify(impl, points, device, tokens=1, alone=alone))
        if again_note.startswith("identified"):
            return again, (f"{again_note}, {how} (a call of {TOKENS} tokens matches no recipe: "
                           f"{note.split(': ', 1)[-1]})")
    return recipe, note


SCALE_WORDS = {"float": "Python float", "tensor0d": "0-d tensor", "tensor1": "1-element tensor"}


def _other_scale_forms(points: list[Point], kinds: tuple[str, ...]) -> list[tuple[str, list[Point]]]:
    """The sweep again with its scales in each other kind the convention passes (a 0-d tensor where the plain
    call passes a 1-element one, say): a kernel that refuses one form of a valid scale still computes a recipe
    (held-out batch 57: a [1] scale taken for a per-head one), and its refusal is the properties' to find."""
    used = {p.kind for p in points}
    return [(SCALE_WORDS[k], [p if p.kind == "none" else Point(p.dtype, k, p.value) for p in points])
            for k in KINDS if k in kinds and k not in used]


def _worst_points(res: Result) -> list[Point]:
    """Each recipe's point of the most differing bytes: a retry that matches no recipe on these matches none on
    every point, so it is first tried there (a value defect shows at every point, and a retry of the whole
    sweep one token a call costs a call per token per point: minutes on a GPU)."""
    return list(dict.fromkeys(max(bad, key=lambda p: bad[p].numel()) for bad in res.diffs.values() if bad))


def _may_match(res: Result) -> bool:
    """Whether a recipe matches every point of the sweep that ran (or none ran: no evidence either way)."""
    return not res.actual or any(res.count(r) == 0 for r in res.diffs)


def held_recipe(res: Result) -> tuple[str, str]:
    """The recipe to hold an implementation to after a sweep, and a line saying how it was chosen."""
    swept = f"{res.swept_bytes:,} bytes swept"
    matched = [r for r in res.diffs if res.count(r) == 0] if res.actual else []
    errors = f"; it raised on {len(res.errors)} of {len(res.points)} sweep points" if res.errors else ""
    if matched:
        also = f" (indistinguishable here from {', '.join(matched[1:])})" if len(matched) > 1 else ""
        return matched[0], f"identified: matches {matched[0]}{also} ({swept}{errors})"
    if not res.actual:
        first = next(iter(res.errors.values()), "no sweep point ran")
        return "unfused", f"identification failed (it raised on every sweep point: {first}); held to unfused"
    best = res.closest()
    return best, (f"matches no recipe; held to the closest, {best} ({res.count(best):,} of {swept} "
                  f"differ{errors}): {residual(res, best)}")


def _pre_cast(point: Point, recipe: str) -> torch.Tensor:
    """fp32 [2 * 65536]: the recipe's value before the e4m3 rounding, for K's and V's patterns."""
    from kernel.plan import ScaleArg
    from kernel.recipe import get_recipe
    from kernel.reference import scaled
    x = _patterns(point.dtype, torch.device("cpu")).reshape(-1)
    y = scaled(x, ScaleArg("float", point.value, None), get_recipe(recipe))
    return torch.cat([y, y])


def _fitting_classes(res: Result, recipe: str) -> list[str]:
    """The classes of deviation that explain every byte differing from `recipe` ([] when none does, or
    when nothing differs)."""
    from kernel.recipe import get_recipe
    from kernel.reference import INPUT_FORMATS, encode_e4m3, round_to_input_dtype
    rule = get_recipe(recipe)
    from conformance.diagnosis.effects import encoding_key, nudged_bytes, ties_above
    classes = {"flush to zero": True, "round toward zero": True, TIES_AWAY: True, APPROXIMATE: True,
               "double rounding through the input dtype": True, "an overflow, NaN or zero-sign rule": True,
               INPUTS_AS_ZERO: True}
    any_bad = False
    for p, bad in res.diffs[recipe].items():
        if not bad.numel():
            continue
        any_bad = True
        e, a = res.expected[recipe][p][bad], res.actual[p][bad]
        y = _pre_cast(p, recipe)[bad]
        sub = ((e & 0x7F) >= 1) & ((e & 0x7F) <= 7)
        classes["flush to zero"] &= bool((sub & ((a & 0x7F) == 0)).all())
        one = (((e ^ a) & 0x80) == 0) & ((e & 0x7F).to(torch.int16) - (a & 0x7F).to(torch.int16) == 1)
        classes["round toward zero"] &= bool(one.all())
        classes[TIES_AWAY] &= bool((ties_above(y, e, "fp8_e4m3") & (((e ^ a) & 0x80) == 0)
                                    & ((a & 0x7F).to(torch.int16) - (e & 0x7F).to(torch.int16) == 1)).all())
        near = torch.zeros_like(a, dtype=torch.bool)
        for b in nudged_bytes(y, rule):
            near |= b == a
        classes[APPROXIMATE] &= bool(near.all())
        fmt = INPUT_FORMATS[torch.bfloat16 if p.dtype == "bfloat16" else torch.float16]
        classes["double rounding through the input dtype"] &= bool((encode_e4m3(round_to_input_dtype(y, fmt), rule)
                                                                    == a).all())
        classes["an overflow, NaN or zero-sign rule"] &= encoding_key(e, a) is not None
        classes[INPUTS_AS_ZERO] &= _inputs_as_zero(res.expected[recipe][p], a, bad, p.dtype)
        if not any(classes.values()):
            break
    return [name for name, ok in classes.items() if ok] if any_bad else []


def _inputs_as_zero(expected: torch.Tensor, a: torch.Tensor, bad: torch.Tensor, dtype: str) -> bool:
    """Whether each differing byte's input (pattern bad % 65536 of `dtype`) is subnormal or zero and its byte
    `a` is the recipe's byte (`expected`, the point's whole sweep) for +0 or for the input's signed zero."""
    pattern, half = bad % 65536, bad - bad % 65536
    mantissa_bits = 7 if dtype == "bfloat16" else 10
    exponent = (pattern & 0x7FFF) >> mantissa_bits
    if bool((exponent != 0).any()):
        return False
    return bool(((a == expected[half]) | (a == expected[half + (pattern & 0x8000)])).all())


def residual(res: Result, recipe: str) -> str:
    """What the bytes that differ from `recipe` have in common: which inputs, how many e4m3 ulps, and the
    class (flush to zero, round toward zero, within one fp32 ulp before the cast, double rounding
    through the input dtype), or the commonest byte pairs when no class fits all."""
    e_all = [res.expected[recipe][p][bad] for p, bad in res.diffs[recipe].items() if bad.numel()]
    a_all = [res.actual[p][bad] for p, bad in res.diffs[recipe].items() if bad.numel()]
    if not e_all:
        return "no byte differs"
    subnormal = sum(int((((e & 0x7F) >= 1) & ((e & 0x7F) <= 7)).sum()) for e in e_all)
    fitting = _fitting_classes(res, recipe)
    e, a = torch.cat(e_all), torch.cat(a_all)
    steps = ((e & 0x7F).to(torch.int16) - (a & 0x7F).to(torch.int16)).abs()
    same_sign = ((e ^ a) & 0x80) == 0
    ulps = f"at most {int(steps[same_sign].max())} e4m3 ulps" if bool(same_sign.all()) else "some with the sign flipped"
    which = f"{subnormal:,} of {e.numel():,} at e4m3 subnormal results"
    if fitting:
        return f"{which}; {ulps}; class: {' / '.join(fitting)}"
    pairs: dict[tuple[int, int], int] = {}
    for x, y in zip(e.tolist()[:20000], a.tolist()[:20000]):
        pairs[(x, y)] = pairs.get((x, y), 0) + 1
    top = sorted(pairs.items(), key=lambda kv: -kv[1])[:4]
    return f"{which}; {ulps}; no class fits every byte; commonest (expected->actual): " + ", ".join(
        f"0x{x:02X}->0x{y:02X} x{n}" for (x, y), n in top)
