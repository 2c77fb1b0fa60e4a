"""Which scale each head was written with: the cause of a per-head failure whose per-tensor twin passes.

A per-head property's Case holds one scale a cache; its [H] scales travel in the failure's message
(conformance/test_per_head.py, `per_tensor_twin`). Where the same call with per-tensor scales conforms, the defect
is in how the [H] scale is read, and the real ways to read it wrong are few: one head's scale for every head (the
first, the largest or the smallest), the heads in the other order, the tensor read as contiguous (a strided view's
gaps), the scale held in the input dtype, the other cache's [H] scale, or one scale a tile of heads (the tile's
first head's, or the one at the tile's index, as a program that loads `scale[pid_h]` reads it). Each is a reference
call with other per-head scales; one that gives every byte of the wrong cache names the cause. Where none does, the
[H] scales read right and the bytes encoded in another cache format (a per-head path that never reads the format it
is told), or computed by another recipe (a per-head path that multiplies by reciprocals where the one-scale path
divides). None: nothing of these explains it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable

import torch

from conformance.cachemap import byte_index
from conformance.diagnosis.ablation import SizeRule
from conformance.diagnosis.classify import Finding
from conformance.diagnosis.effects import SUBNORMAL_ONLY, _same_caches
from conformance.harness import SuiteError, run_impl, run_reference
from conformance.impls import Implementation
from conformance.test_per_head import Steps, _per_head, step_of
from kernel.reference import CACHE_FORMATS as FP8_FORMATS
from strategies.build import Built, build
from strategies.case import CACHE_FORMATS, Case
from strategies.fp import FORMATS, round_to

Values = tuple[float, ...]
#: key, title, and the per-head values a wrong reading gives (None: it cannot differ here).
Reading = tuple[str, str, Callable[[Values, int, str, Values | None], Values | None]]


def _first(values: Values, _step: int, _dtype: str, _other: Values | None) -> Values | None:
    return (values[0],) * len(values)


def _largest(values: Values, _step: int, _dtype: str, _other: Values | None) -> Values | None:
    """One scale for every head, the [H] scales reduced by their maximum (`scale.max()`: a path that takes one
    scale a cache, handed the largest so that no head overflows)."""
    return (max(values),) * len(values)


def _smallest(values: Values, _step: int, _dtype: str, _other: Values | None) -> Values | None:
    return (min(values),) * len(values)


def _reversed(values: Values, _step: int, _dtype: str, _other: Values | None) -> Values | None:
    return tuple(reversed(values))


def _buffer(values: Values, step: int) -> list[float]:
    """The [H] scale's whole buffer as the property builds it (test_per_head._per_head): every step-th element a
    scale, the gaps NaN."""
    return [values[i // step] if i % step == 0 else float("nan") for i in range(len(values) * step)]


def _contiguous(values: Values, step: int, _dtype: str, _other: Values | None) -> Values | None:
    """Element h of the buffer, not h * step: every step-th element is a scale, the gaps hold NaN."""
    if step == 1:
        return None
    return tuple(_buffer(values, step)[:len(values)])


def _input_dtype(values: Values, _step: int, dtype: str, _other: Values | None) -> Values | None:
    if dtype not in ("bfloat16", "float16"):
        return None
    return tuple(round_to(v, FORMATS[dtype]) for v in values)


def _other_cache(_values: Values, _step: int, _dtype: str, other: Values | None) -> Values | None:
    return other


def _tiled(heads: int, index: Callable[[int], int]) -> Callable[[Values, int, str, Values | None], Values | None]:
    """A kernel that loads one scale a tile of `heads` heads: head h gets values[index(h)]."""
    def reading(values: Values, _step: int, _dtype: str, _other: Values | None) -> Values | None:
        if len(values) <= heads:
            return None  # one tile: the first head's scale for all, which _first already reads
        return tuple(values[min(index(h), len(values) - 1)] for h in range(len(values)))
    return reading


def _table(heads: int) -> Callable[[Values, int, str, Values | None], Values | None]:
    """A kernel that keeps `heads` scales (an array sized for grouped-query models): head h gets
    values[min(h, heads - 1)], the heads past the table the last one's."""
    def reading(values: Values, _step: int, _dtype: str, _other: Values | None) -> Values | None:
        if len(values) <= heads:
            return None
        return tuple(values[min(h, heads - 1)] for h in range(len(values)))
    return reading


def _other_stride(other_step: int) -> Reading:
    """A scale's buffer read with the other [H] scale's stride (a wrapper that passes one stride for both, "the
    two [H] scales are rows of one table"): head h gets element h * other_step, a gap's NaN where that is not a
    scale, None (unknown: memory past the buffer) where it lies past the end; None where the strides agree."""
    def reading(values: Values, step: int, _dtype: str, _other: Values | None) -> Values | None:
        if other_step == step:
            return None
        buffer = _buffer(values, step)
        return tuple(buffer[h * other_step] if h * other_step < len(buffer) else None for h in range(len(values)))
    return ("scale:per-head-other-stride", "reads a [H] scale with the other [H] scale's stride", reading)


# Tiles of 2 to 64 heads, as a Triton program's BLOCK_H makes them; tables of 4 to 32 heads.
TILES = tuple(2 ** i for i in range(1, 7))
TABLES = (4, 8, 16, 32)

READINGS: tuple[Reading, ...] = (
    ("scale:per-head-first", "scales every head by the first head's scale", _first),
    ("scale:per-head-largest", "scales every head by the largest of the [H] scales", _largest),
    ("scale:per-head-smallest", "scales every head by the smallest of the [H] scales", _smallest),
    ("scale:per-head-reversed", "scales head h by head H-1-h's scale", _reversed),
    ("scale:per-head-stride-ignored", "reads a strided [H] scale as if contiguous", _contiguous),
    ("scale:per-head-rounded", "holds the per-head scales in the input dtype", _input_dtype),
    ("scale:per-head-other-cache", "scales one cache by the other cache's per-head scales", _other_cache),
    *(("scale:per-head-tile-first", f"scales each tile of {g} heads by its first head's scale",
       _tiled(g, lambda h, g=g: h - h % g)) for g in TILES),
    *(("scale:per-head-tile-index", f"scales each tile of {g} heads by the scale at the tile's index (h // {g})",
       _tiled(g, lambda h, g=g: h // g)) for g in TILES),
    *(("scale:per-head-table", f"scales heads past the {n}th by head {n - 1}'s scale (a table of {n} scales)",
       _table(n)) for n in TABLES),
)

_SCALES = re.compile(r"per-head scales: (\{[^\n]*?\}); per-tensor twin")


def per_head_scales(message: str) -> tuple[dict[str, Values], Steps] | None:
    m = _SCALES.search(message)
    if m is None:
        return None
    try:
        d = json.loads(m.group(1))
        values = {k: tuple(float(x) for x in v) for k, v in d["values"].items()}
        step = d["step"]
        return values, (int(step) if not isinstance(step, dict) else {k: int(step[k]) for k in values})
    except (ValueError, KeyError, TypeError):
        return None


def _with(case: Case, device: torch.device, values: dict[str, Values], step: Steps) -> Built:
    built = build(case, device)
    for name, vals in values.items():
        built = _per_head(built, name, vals, step_of(step, name))
    return built


def _bytes(built: Built, cache: str) -> torch.Tensor:
    return built.buffers[cache].cpu().reshape(-1).view(torch.uint8)


def _differing(a: Built, b: Built) -> list[str]:
    """The caches whose bytes differ between two calls."""
    return [c for c in ("k_cache", "v_cache") if not torch.equal(_bytes(a, c), _bytes(b, c))]


def _per_head_call(case: Case, values: dict[str, Values], step: Steps, impl: Implementation,
                   device: torch.device) -> tuple[Built, Built] | None:
    """The reference's and the implementation's call with these [H] scales; None where the implementation raises."""
    actual, error = run_impl(case, impl, device, _with(case, device, values, step))
    if error:
        return None
    return run_reference(case, device, _with(case, device, values, step)), actual


#: Effects that move a byte one step (one e4m3 or e5m2 code) at most.
ONE_STEP = ("off-by-one-ulp", "approximate-division", "rounds-toward-zero", "rounds-ties-away",
            "rounds-ties-toward-zero", "rounds-ties-to-odd", "rounds-sticky-lost")


def _beyond(expected: Built, actual: Built, one_step: bool, subnormal: bool, cache_format: str) -> bool:
    """Whether a cache byte differs from the reference's in a way the twin's defects cannot: in its sign (zero's
    aside), or by more than one code of its magnitude order (unless `one_step`) where the reference's byte is
    above the format's smallest normal (unless `subnormal`)."""
    smallest_normal = 1 << FP8_FORMATS[cache_format].mantissa_bits  # its magnitude code
    for name in ("k_cache", "v_cache"):
        e, a = (getattr(b, name).view(torch.uint8).cpu().to(torch.int16) for b in (expected, actual))
        differ = e != a
        sign_flip = ((e ^ a) & 0x80).bool() & ((e & 0x7F) | (a & 0x7F)).bool()
        explained = (((e & 0x7F) - (a & 0x7F)).abs().le(1) & one_step) | ((e & 0x7F).le(smallest_normal) & subnormal)
        if bool((differ & (sign_flip | ~explained)).any()):
            return True
    return False


def beyond_twin(twin: Case, twin_keys: list[str], message: str, impl: Implementation,
                device: torch.device) -> list[Finding]:
    """A per-head failure whose per-tensor twin fails too is the twin's defect, unless the per-head scales are
    wrong as well: the twin with its defects' triggers moved back to the plain call (a strided cache_loc made
    contiguous, say) passes, and the per-head call on it still fails. Then that is a second defect, named by
    the wrong reading of the [H] scales that explains it ([] otherwise). Seen: a held-out kernel ignoring
    cache_loc's stride hid its per-head bug."""
    from conformance.diagnosis.ablation import BY_NAME
    from conformance.diagnosis.diagnose import Diagnoser, same_effect, trigger_set
    found = per_head_scales(message)
    if found is None:
        return []
    values, step = found
    if twin_keys and all(same_effect(k) in ONE_STEP + SUBNORMAL_ONLY for k in twin_keys):
        # a rounding defect everywhere ("any": no trigger to move back) moves a byte one step at most, and a
        # subnormal one leaves normal values right; a byte beyond that with per-head scales is the [H] scales'
        # own (seen: a tile's scales read at the tile's index, behind subnormals rounded toward zero)
        called = _per_head_call(twin, values, step, impl, device)
        effects = {same_effect(k) for k in twin_keys}
        if called is not None and _beyond(*called, one_step=bool(effects & set(ONE_STEP)),
                                          subnormal=bool(effects & set(SUBNORMAL_ONLY)),
                                          cache_format=twin.cache_format):
            return [Finding("scale", "scale:per-head", "writes wrong bytes with a per-head ([H]) scale (more than "
                            "one step from the reference's, past its rounding defect)", replayable=False)]
        return []
    cleaned = twin
    for dim in sorted({d for k in twin_keys for d in trigger_set(k)}):
        ablation = BY_NAME.get(dim)
        if ablation is None or not ablation.keeps_shape or ablation.value:
            return []  # a trigger the [H] scales cannot be kept through: no clean twin
        cleaned = next(iter(ablation.variants(cleaned, impl.convention.plain_scale_kind)), cleaned)
    if cleaned == twin:
        return []
    replay = Diagnoser(impl, device).replay(cleaned)
    if replay is None or replay.error or replay.symptoms:
        return []
    called = _per_head_call(cleaned, values, step, impl, device)
    if called is not None and _same_caches(*called):
        return []  # the per-head call is right there too
    cause = None if called is None else _reading(cleaned, values, step, *called, device, impl)
    return [cause or Finding("scale", "scale:per-head", "writes wrong bytes with a per-head ([H]) scale",
                             replayable=False)]


def raise_trigger(case: Case, values: dict[str, Values], step: Steps, impl: Implementation,
                  device: torch.device) -> list[str]:
    """The dimensions of a per-head call's raise: each ablation that keeps the Case's shape, moved back to the
    plain call with the same [H] scales, and named where a variant's call then does not raise (an element's scale
    indexed with the cache's head stride raises on a head-major cache alone)."""
    from conformance.diagnosis.ablation import HEAD_SCALE_ZERO
    trigger = [name for name, variants in _ablated(case, values, impl)
               if any(_per_head_call(v, values, step, impl, device) is not None for v in variants)]
    nonzero = {name: _zero_heads_set(v) for name, v in values.items()}
    if nonzero != values and _per_head_call(case, nonzero, step, impl, device) is not None:
        trigger.append(HEAD_SCALE_ZERO.name)  # a check such as `(scale <= 0).any()` refusing a calibrated zero
    return trigger


def _ablated(case: Case, values: dict[str, Values], impl: Implementation) -> list[tuple[str, list[Case]]]:
    """Each ablation that keeps the Case's shape and is not of its values, with its variants (moved back to the
    plain call) that change what a per-head call gets: one that only moves a scale the [H] values replace
    tells nothing."""
    from conformance.diagnosis.ablation import ABLATIONS
    out = []
    for ablation in ABLATIONS:
        if not ablation.keeps_shape or ablation.value:
            continue
        variants = [v for v in ablation.variants(case, impl.convention.plain_scale_kind)
                    if v != case.replace(**{name: getattr(v, name) for name in values})]
        if variants:
            out.append((ablation.name, variants))
    return out


def _right(case: Case, values: dict[str, Values], step: Steps, impl: Implementation, device: torch.device,
           reseeded: bool = False) -> bool:
    """Whether the per-head call with these [H] scales writes the reference's bytes; with `reseeded`, also once
    more with other values (a defect of a few values does not pass both by chance)."""
    called = _per_head_call(case, values, step, impl, device)
    right = called is not None and _same_caches(*called)
    return right and (not reseeded or _right(case.replace(seed=(case.seed + 7919) % 2**31), values, step, impl,
                                             device))


def value_trigger(case: Case, values: dict[str, Values], step: Steps, impl: Implementation,
                  device: torch.device) -> list[str]:
    """The dimensions of a per-head call's wrong bytes that no reading explains: each ablation of `_ablated`
    named where every variant's call is right, twice (`_right`), where the failure repeats."""
    if _right(case, values, step, impl, device):  # the failure does not repeat: nothing to locate
        return []
    return [name for name, variants in _ablated(case, values, impl)
            if all(_right(v, values, step, impl, device, reseeded=True) for v in variants)]


def _zero_heads_set(values: Values) -> Values:
    """The [H] scales with each zero head set to the first nonzero one (all zeros: 1.0)."""
    other = next((v for v in values if v != 0.0), 1.0)
    return tuple(other if v == 0.0 else v for v in values)


def per_head_cause(case: Case, values: dict[str, Values], step: Steps, impl: Implementation,
                   device: torch.device) -> Finding | None:
    """The one wrong reading of the [H] scales that gives every byte of each cache the call got wrong."""
    called = _per_head_call(case, values, step, impl, device)
    if called is None:
        return None
    return (_reading(case, values, step, *called, device, impl) or _other_format(case, values, step, *called, device)
            or _other_recipe(case, values, step, *called, device))


def _other_recipe(case: Case, values: dict[str, Values], step: Steps, expected: Built, actual: Built,
                  device: torch.device) -> Finding | None:
    """Another recipe with the same [H] scales, where it gives every byte of each cache the call got wrong: a
    per-head path with arithmetic of its own (the H reciprocals computed once, every element multiplied by
    its head's, where the one-scale path divides)."""
    from kernel.recipe import RECIPES
    wrong = _differing(expected, actual)
    held = RECIPES[case.recipe]

    def distance(name: str) -> int:  # a Case of zeros tells few recipes apart: the nearest to the held first
        steps = ("scale_op", "scale_dtype", "intermediate", "overflow")
        return sum(getattr(RECIPES[name], f) != getattr(held, f) for f in steps)
    for name in sorted(RECIPES, key=distance) if wrong else ():
        if name == case.recipe:
            continue
        told = case.replace(recipe=name)  # the built tensors' call passes their Case's recipe
        try:
            r = run_reference(told, device, _with(told, device, values, step))
        except SuiteError:
            continue
        if not set(wrong) & set(_differing(r, actual)):
            return Finding("rounding", f"rounding:{name}@per-head", f"computes {name} where {case.recipe} is asked, "
                           "with per-head ([H]) scales (its per-head path has arithmetic of its own)",
                           replayable=False)
    return None


def _other_format(case: Case, values: dict[str, Values], step: Steps, expected: Built, actual: Built,
                  device: torch.device) -> Finding | None:
    """The reference on the same tensors told another cache format (the caches as their bytes, the format
    passed as `cache_dtype`), where it gives every byte of each cache the call got wrong."""
    wrong = _differing(expected, actual)
    for fmt in CACHE_FORMATS if wrong else ():
        if fmt == case.cache_format:
            continue
        told = case.replace(cache_dtype="uint8", cache_format=fmt, format_alias=False)
        built = _with(case, device, values, step)
        built = dataclasses.replace(built, case=told, k_cache=built.k_cache.view(torch.uint8),
                                    v_cache=built.v_cache.view(torch.uint8))
        try:
            r = run_reference(told, device, built)
        except SuiteError:
            continue
        if not set(wrong) & set(_differing(r, actual)):
            name = fmt.removeprefix("fp8_")
            return Finding("format", f"format:{name}-bytes@per-head", f"writes {name} bytes where the cache is "
                           f"{case.cache_format.removeprefix('fp8_')}, with per-head ([H]) scales (its per-head path "
                           "ignores the format it is told)", replayable=False)
    return None


def only_where_t_equals_h(case: Case, values: dict[str, Values], step: Steps, impl: Implementation,
                          device: torch.device) -> bool:
    """Whether the per-head call fails only where T = H: the same [H] scales with a token added and with one
    dropped give right bytes (a scale put on "the axis of length H" by its length, seen held out)."""
    from conformance.diagnosis.ablation import resized
    t = case.num_tokens
    if t < 2 or t != case.num_heads:
        return False
    for n in (t + 1, t - 1):
        called = _per_head_call(resized(case, "tokens", n), values, step, impl, device)
        if called is None or not _same_caches(*called):
            return False
    return True


def per_head_size_rule(case: Case, values: dict[str, Values], step: Steps, impl: Implementation,
                       device: torch.device) -> SizeRule | None:
    """The rule on D a per-head failure follows: the per-head call replayed at each probed D with the same [H]
    scales (a size that passes, once more with other values), and the first rule every outcome follows, where
    it holds for the failing D (a scale indexed by an element's offset over the padded head width, seen held
    out, is wrong only where D is not a power of two)."""
    from conformance.diagnosis.ablation import probed_rule, resized
    return probed_rule(case, "dim", lambda n: not _right(resized(case, "dim", n), values, step, impl, device,
                                                         reseeded=True))


def _distinct(heads: int) -> Values:
    """[H] scales that differ from head to head (non-dyadic, so that the recipes' roundings differ too): a
    shrunk failure's scales are often equal but for one head, where several readings give the same bytes."""
    return tuple(float(torch.tensor(0.3 + 0.05 * h, dtype=torch.float32)) for h in range(heads))


def _known(alt: tuple[float | None, ...]) -> Values:
    """A reading's values with its unknown heads (None: read past the buffer) at 1.0, for the reference."""
    return tuple(1.0 if v is None else v for v in alt)


def _same_known(case: Case, cache: str, alt: tuple[float | None, ...], a: Built, b: Built) -> bool:
    """Whether two calls write the same bytes of `cache`, but for the heads a reading cannot know (None in alt),
    where at least one head is known."""
    unknown = [h for h, v in enumerate(alt) if v is None]
    if len(unknown) == len(alt):
        return False
    same = _bytes(a, cache) == _bytes(b, cache)
    if unknown:
        same[byte_index(case, cache)[..., unknown, :].reshape(-1)] = True
    return bool(same.all())


def _holds_on_distinct(case: Case, values: dict[str, Values], step: Steps, name: str, cache: str,
                       other: Values | None, reading: Reading, impl: Implementation, device: torch.device) -> bool:
    """Whether the reading gives the implementation's bytes of `name`'s cache again with distinct scales for
    `name` (`other`: the other cache's [H] scales), on the Case and on it with DISTINCT_SEEDS - 1 other seeds (a
    scale held in bf16 moves few e4m3 bytes of a small Case); True where a call raises or the reading cannot
    differ there: nothing against it."""
    vals = _distinct(case.num_heads)
    alt = reading[2](vals, step_of(step, name), case.input_dtype, other)
    if alt is None or alt == vals:
        return True
    # values drawn for a per-tensor scale of 1 (a failing Case's own tiny scale makes them all zeros, which
    # every reading writes alike)
    own = getattr(case, name)
    base = case if own.kind == "none" else case.replace(**{name: dataclasses.replace(own, value=1.0)})
    for seeded in (base.replace(seed=(case.seed + 7919 * i) % 2**31) for i in range(DISTINCT_SEEDS)):
        actual, error = run_impl(seeded, impl, device, _with(seeded, device, {**values, name: vals}, step))
        if error:
            return True
        try:
            r = run_reference(seeded, device, _with(seeded, device, {**values, name: _known(alt)}, 1))
        except SuiteError:
            return True
        if not _same_known(seeded, cache, alt, r, actual):
            return False
    return True


#: Seeds the distinct-scales check replays a fitting reading with.
DISTINCT_SEEDS = 4


def _reading(case: Case, values: dict[str, Values], step: Steps, expected: Built, actual: Built,
             device: torch.device, impl: Implementation) -> Finding | None:
    """per_head_cause on the call's bytes; a reading that fits is held to distinct scales too."""
    named: dict[str, Reading] = {}
    for name, vals in values.items():
        cache = "k_cache" if name == "k_scale" else "v_cache"
        if torch.equal(_bytes(expected, cache), _bytes(actual, cache)):
            continue
        other_name = "v_scale" if name == "k_scale" else "k_scale"
        other = values.get(other_name)
        readings = READINGS if other is None else (_other_stride(step_of(step, other_name)), *READINGS)
        for reading in readings:
            alt = reading[2](vals, step_of(step, name), case.input_dtype, other)
            if alt is None or alt == vals:
                continue
            try:
                r = run_reference(case, device, _with(case, device, {**values, name: _known(alt)}, 1))
            except SuiteError:  # a reading the reference cannot take (a NaN scale it refuses)
                continue
            if _same_known(case, cache, alt, r, actual) and \
                    _holds_on_distinct(case, values, step, name, cache, other, reading, impl, device):
                named[name] = reading
                break
        else:
            return None
    if len({r[0] for r in named.values()}) != 1:
        return None
    key, title, _ = next(iter(named.values()))
    return Finding("scale", key, f"{title} ({' and '.join(named)})", replayable=False)
