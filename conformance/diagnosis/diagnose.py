"""Diagnosis by experiment: a failing Case -> its defects, each keyed by what it does and what triggers it.

For each kind of symptom the failing Case shows (it raises, its values are wrong, bytes land in the
wrong place, a NaN or zero sign, an overflow rule, an input modified), the Case is ablated one
dimension at a time toward the plain call (conformance.diagnosis.ablation), keeping each ablation
that the symptom survives. What is left is a minimal failing variant; its trigger is the set of
dimensions whose ablation makes the symptom vanish. The effect is read from that variant's whole diff
(conformance.diagnosis.effects). The defect's key is `effect@trigger`: symptoms of one cause (a wrong
slot and the slot it left unwritten, wrong values and rows that look like another token's) reach the
same key, and two causes with one symptom (a CompilationError for H and another for D) do not.

Replays are cached by Case, and only failing Cases of a run are diagnosed (a few dozen).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

from conformance.diagnosis.ablation import (
    ABLATIONS,
    BIG_CACHE_BYTES,
    BY_NAME,
    LARGE_TOKEN_PROBES,
    SCALE_TENSOR,
    SIZE_PROBES,
    SIZE_RULES,
    SLOTS_UNSORTED,
    Ablation,
    SizeRule,
    as_float_scales,
    cache_bytes,
    fitting_rule,
    resized,
    size_of,
    with_ordinary_values,
    words,
)
from conformance.diagnosis.classify import (
    Finding,
    case_size,
    classify_result,
    normalize,
    out_of_memory,
    raised,
    run_case,
)
from conformance.diagnosis.effects import (
    BOUNDS,
    TITLES,
    Effect,
    _unwritten,
    explain,
    explains,
    title_of,
    unexplained,
    unwritten_where,
    value_keys_fitting,
)
from conformance.impls import Implementation
from strategies.build import Built, build
from strategies.case import Case, Layout, Scale
from strategies.fp import f32, from_bits

#: Scales that tell value explanations apart: not 1.0, not each other's or their reciprocals, and not
#: exact in bf16 or fp16 (a recipe that first rounds the scale to the input dtype differs there).
TELLING_SCALES = (f32(0.3), f32(1.7))


@dataclass
class Replay:
    """One call of a Case: the implementation's error, its symptoms, and the buffers to read effects from."""

    error: str | None
    symptoms: set[str]
    report: str | None
    expected: Built
    actual: Built
    before: dict[str, torch.Tensor]


def _telling(case: Case) -> Case | None:
    """The Case with TELLING_SCALES (K's, V's) for its scales, their kinds kept; None without a scale."""
    scales = {w: Scale(s.kind, value) for (w, s), value in zip((("k_scale", case.k_scale),
                                                                ("v_scale", case.v_scale)), TELLING_SCALES)
              if s.kind != "none"}
    return case.replace(**scales) if scales else None


#: Tokens of the enlarged re-drawn variant (Diagnoser._corroborated).
REDRAWN_TOKENS = 32


def _redrawn(case: Case, seeds: int) -> list[Case]:
    """The Case with its values re-drawn from `seeds` other seeds (no overrides), then the first REDRAWN_SEEDS
    of them with REDRAWN_TOKENS tokens: a minimal Case may hold one element, whose re-drawn value seldom shows a
    defect that touches one value in a hundred (a scale held as fp16)."""
    redrawn = [case.replace(seed=(case.seed + k * 7919) % 2**31, overrides=()) for k in range(1, seeds + 1)]
    return redrawn + [v for v in map(_more_tokens, redrawn[:REDRAWN_SEEDS]) if v is not None]


def _more_tokens(case: Case) -> Case | None:
    """The Case with REDRAWN_TOKENS tokens in slots 0.. (pages added as needed), its H, D and layouts kept;
    None when it has that many already, or none (an empty batch)."""
    if case.num_tokens == 0 or case.num_tokens >= REDRAWN_TOKENS:
        return None
    pages = max(case.num_pages, -(-REDRAWN_TOKENS // case.page_size))
    return case.replace(num_tokens=REDRAWN_TOKENS, num_pages=pages, cache_loc=tuple(range(REDRAWN_TOKENS)))


def symptoms(error: str | None, findings: list[Finding]) -> set[str]:
    """The kinds of symptom of one call: 'raises:<Type>', 'input-modified', 'placement', 'values',
    'nan-sign', 'zero-sign' or 'overflow'."""
    if error:
        m = re.search(r" raised (\w+(?:\.\w+)*):", error.split("\n", 1)[0])
        return {f"raises:{m.group(1) if m else 'Exception'}"}
    kinds = set()
    for f in findings:
        if f.cls == "input-modified":  # one symptom, whichever inputs: a kernel dividing in place does both
            kinds.add("input-modified")
        elif f.cls in ("wrong-slot", "outside"):
            kinds.add("placement")
        elif f.key == "encoding:nan-sign":
            kinds.add("nan-sign")
        elif f.cls == "zero-sign":
            kinds.add("zero-sign")
        elif f.cls == "encoding":
            kinds.add("overflow")
        else:
            kinds.add("values")
    return kinds


#: Dimensions whose failure needs more than one token as a consequence: the slots several tokens name, and the
#: strides between tokens. Beside any other (H not a power of two, say), more than one token is a dimension of the
#: trigger: a head loop that steps by the number of token programs leaves heads unwritten only where H and T are
#: both above 2.
MULTI_TOKEN_DIMENSIONS = frozenset({
    "padding", "out-of-range", "duplicate-slots", "shared-page", "first-slot", "last-slot", "page-size", "strided-loc",
    "loc-int32", "padded-keys", "strided-input", "input-layouts-differ", "strided-cache", "cache-layouts-differ"})
#: Triggers whose other ablations' variants break them too, so those read as triggers as well: one token, or H a
#: power of two, is no longer T = H; one token, or a page of its own for each, is no more tokens than pages.
IMPLIED = {"tokens-equal-heads": ("many-tokens", "heads-not-pow2"),
           "tokens-above-pages": ("many-tokens", "shared-page")}
#: Symptoms of the values written: a placement effect read under one of them changes symptom when the values do.
VALUE_SYMPTOMS = frozenset({"values", "nan-sign", "zero-sign", "overflow"})
#: Calls of one Case on a GPU before it counts as passing (see Diagnoser._run).
GPU_TRIES = 3
#: Re-drawn calls that must agree with a value model read off a minimal Case (Diagnoser._corroborated).
REDRAWN_SEEDS = 2
#: Re-drawn calls of a value defect's ablated variant before a dimension counts as its trigger
#: (Diagnoser._value_trigger): a defect of one value in a hundred shows in a call of a few values by chance.
TRIGGER_SEEDS = 8


class Diagnoser:
    """Replays Cases of one implementation on one device (cached), and diagnoses failing ones."""

    def __init__(self, impl: Implementation, device: torch.device, fill: Callable[[Built], Built] | None = None):
        self.impl, self.device, self.fill = impl, device, fill
        self.plain = impl.convention.plain_scale_kind
        self._cache: dict[str, Replay | None] = {}
        self._bare: Diagnoser | None = None  # the same calls without the fill (_unfilled)
        self._raising: str | None = None  # the raise being diagnosed, type and normalized message (fails)

    def replay(self, case: Case) -> Replay | None:
        """The call's outcome; None when the convention cannot express it or the reference refuses it."""
        key = json.dumps(case.to_dict(), sort_keys=True)
        if key not in self._cache:
            self._cache[key] = self._run(case)
        return self._cache[key]

    def _run(self, case: Case) -> Replay | None:
        if self.impl.convention.why_not(case):
            return None
        # A GPU's scatter leaves undefined which of several writes to one byte lands (padding tokens sent
        # to a real slot, say): a call that passes once may fail the next time. The CPU is sequential.
        for _ in range(GPU_TRIES if self.device.type == "cuda" else 1):
            try:
                expected, actual, error, before, report = run_case(case, self.impl.telling(case), self.device,
                                                                   self.fill)
            except Exception:  # the reference refused the variant (the suite's own limit): not evidence
                return None
            if error and out_of_memory(error):  # the card was full (other processes): no evidence either way
                return None
            found = [] if error else classify_result(case, expected, actual, None, before)
            replay = Replay(error, symptoms(error, found), report, expected, actual, before)
            if replay.error or replay.symptoms:
                break
        return replay

    def fails(self, case: Case, symptom: str, also: frozenset[str] = frozenset()) -> bool | None:
        """Whether the Case shows this symptom (or one of `also`); None when it cannot be run. While a raise
        is diagnosed, only its own message counts (normalized): one exception type raised by two causes (an
        index op that wants int64, a view of an empty batch) is two symptoms, each shrunk and triggered apart."""
        r = self.replay(case)
        if r is None:
            return None
        if symptom in r.symptoms and symptom.startswith("raises:") and self._raising is not None:
            return raised(r.error).key == self._raising or bool(r.symptoms & also)
        return bool(r.symptoms & ({symptom} | also))

    def plain_of(self, case: Case) -> Case:
        """The Case with every dimension moved back to the plain call (each ablation's first variant)."""
        for ablation in self._ablations():
            case = next(iter(ablation.variants(case, self.plain)), case)
        return case

    def captured_fails(self, case: Case) -> bool | None:
        """Whether one CUDA-graph capture of the call, replayed, fails (raises, or writes wrong bytes);
        None when the convention cannot make the call or the GPU's memory ran out (other processes held it)."""
        from conformance import test_graphs as graphs
        if self.impl.convention.why_not(case):
            return None
        try:
            built, graph, pristine = graphs.captured(self.impl, case, self.device)
            graph.replay()
            graphs.check_replay(self.impl, built, pristine, self.device, "a replay of the plain call")
        except Exception as exc:
            return _failed(exc)
        return False

    def float_scale_fails(self, case: Case, factor: float) -> bool | None:
        """Whether test_graphs' float-scale experiment (capture `case`, an eager call with its floats times
        `factor`, a replay) fails on this Case; None when the call cannot be made or the GPU's memory ran out."""
        from conformance import test_graphs as graphs
        if self.impl.convention.why_not(case):
            return None
        try:
            graphs.float_scale_experiment(self.impl, case, factor, self.device)
        except Exception as exc:
            return _failed(exc)
        return False

    def graph_trigger(self, case: Case) -> list[str]:
        """The dimensions whose ablation makes a captured replay of the Case pass, when it fails: a replay
        that eager calls of the same Case get right (which of two racing writes lands can differ between a
        graph and an eager launch) is keyed by what triggers it. [] when the capture passes."""
        if not self.captured_fails(case):
            return []
        return self._vanishing(case, self.captured_fails)

    def float_scale_trigger(self, case: Case, factor: float) -> list[str]:
        """The dimensions whose ablation makes the float-scale experiment on the Case pass, when that
        experiment passes on the plain call: its failure is then a defect that the experiment's eager
        calls show too (a rounding at the other float, say), or a racing write landing otherwise under a
        graph, keyed by that trigger. A graph that keeps a stale float fails the plain call as well: []."""
        def failing(variant: Case) -> bool | None:  # a variant without a float scale has no experiment
            floats = "float" in (variant.k_scale.kind, variant.v_scale.kind)
            return self.float_scale_fails(variant, factor) if floats else None
        plain = self.plain_of(case).replace(k_scale=case.k_scale, v_scale=case.v_scale)
        if failing(plain) is not False:
            return []
        return self._vanishing(case, failing)

    def _ablations(self) -> list[Ablation]:
        return [a for a in ABLATIONS if a.keeps_shape or self.fill is None]

    def minimize(self, case: Case, symptom: str) -> tuple[Case, list[str]]:
        """The minimal variant that still shows the symptom, and the trigger: the dimensions whose
        ablation of that variant makes it vanish."""
        current = self._shrunk(case, lambda v: self.fails(v, symptom))
        return current, self._trigger(current, symptom)

    def _vanishing(self, case: Case, failing: Callable[[Case], bool | None]) -> list[str]:
        """The ablations whose every variant of the Case that runs passes (at least one runs)."""
        trigger = []
        for ablation in self._ablations():
            ran = [r for r in map(failing, ablation.variants(case, self.plain)) if r is not None]
            if ran and not any(ran):
                trigger.append(ablation.name)
        return trigger

    def _shrunk(self, case: Case, failing: Callable[[Case], bool | None]) -> Case:
        """The Case with each ablation's first variant that still fails taken in turn."""
        for ablation in self._ablations():
            for variant in ablation.variants(case, self.plain):
                if failing(variant):
                    case = variant
                    break
        return case

    def _trigger(self, current: Case, symptom: str, also: frozenset[str] = frozenset()) -> list[str]:
        """The dimensions whose ablation of the Case makes the symptom (and each of `also`) vanish, H, D and T
        named by what the failure needs of them."""
        trigger = self._vanishing(current, lambda v: self.fails(v, symptom, also))
        if "many-tokens" in trigger and set(trigger) & MULTI_TOKEN_DIMENSIONS:
            trigger.remove("many-tokens")  # a consequence of the other trigger (slots of several tokens), not a cause
        implied = {d for t in trigger for d in IMPLIED.get(t, ())}
        trigger = [t for t in trigger if t not in implied]
        if "last-slot" in trigger and "page-size" in trigger and self._last_slot_kept_fails(current, symptom):
            trigger.remove("page-size")  # another page size moved the last slot, not the cause
        for differ, strided, names in (("cache-layouts-differ", "strided-cache", ("k_cache_layout", "v_cache_layout")),
                                       ("input-layouts-differ", "strided-input", ("k_layout", "v_layout"))):
            if differ in trigger and strided in trigger:
                # One strided, the other not: is it the striding or the difference? Give both the strided
                # layout: a failure that stays is the striding's.
                same = self._same_strided_layouts(current, names)
                trigger.remove(strided if same is None or not self.fails(same, symptom) else differ)
        if symptom.startswith("raises:") and not any(t.startswith("scale-kind:") for t in trigger):
            # the plain call's scale is a tensor: a raise that the same value as a float does not make
            floats = as_float_scales(current)
            if floats is not None and self.fails(floats, symptom, also) is False:
                trigger.append(SCALE_TENSOR)
        return self._sized(current, symptom, trigger)

    def _fails_alike(self, case: Case, symptom: str) -> bool | None:
        """Whether the Case fails as a Case of another size may show the same cause: the same raise, or (for a
        symptom of the bytes) wrong bytes of any kind (a tail left unwritten is a wrong value where D is 12 and
        a slot left unwritten where D is 4). None: it cannot be run, or it raises where bytes were wrong."""
        r = self.replay(case)
        if r is None:
            return None
        if symptom.startswith("raises:"):
            return symptom in r.symptoms
        return None if r.error else bool(r.symptoms)

    def _sized(self, case: Case, symptom: str, trigger: list[str]) -> list[str]:
        """H, D or T named by what the failure needs of it. Where the trigger is H or D not a power of two, more
        than one token, or nothing, the Case is replayed at other sizes (ablation.SIZE_PROBES; a size that
        passes, once more with other values, so that a value defect's few elements do not pass by chance), and
        the first rule every outcome follows (not a power of two, not a multiple of m, below or above m) names
        that dimension of the trigger. From nothing, the rule must hold again on a cache of more pages: a bound
        read from H (pages x H) moves with H on one Case, and not as a rule of H."""
        prober = self._unfilled(case, symptom)
        if prober is None:
            return trigger
        for attr, pow2 in (("dim", "dim-not-pow2"), ("heads", "heads-not-pow2"), ("tokens", "many-tokens")):
            if trigger and pow2 not in trigger:
                continue
            rule = prober._size_rule(case, symptom, attr)
            if rule is not None and not trigger:
                more = case.replace(num_pages=2 * case.num_pages + 1)
                again = prober._size_rule(more, symptom, attr)
                rule = rule if again is not None and again.name == rule.name else None
            if rule is not None and rule.name != "tokens-above:1":  # that is many-tokens already
                trigger = [rule.name if t == pow2 else t for t in trigger] if pow2 in trigger else [rule.name]
        return trigger

    def _unfilled(self, case: Case, symptom: str) -> Diagnoser | None:
        """Who replays the Case at other sizes: this Diagnoser, or under a pattern fill (which keeps the Case's
        shape) one without it, where the Case shows the same symptom without the fill too (a fill-only
        symptom, a value the patterns hold, gets no size rule from another defect's failure); None else."""
        if self.fill is None:
            return self
        if self._bare is None:
            self._bare = Diagnoser(self.impl, self.device)
        r = self._bare.replay(case)
        return self._bare if r is not None and symptom in r.symptoms else None

    def _size_rule(self, case: Case, symptom: str, attr: str) -> SizeRule | None:
        own = size_of(case, attr)
        outcomes = {own: True}
        larger = tuple(n for n in LARGE_TOKEN_PROBES if n < own) if attr == "tokens" else ()
        for n in SIZE_PROBES[attr] + larger:
            variant = resized(case, attr, n)
            failed = None if n == own else self._fails_alike(variant, symptom)
            if failed is False:
                failed = self._fails_alike(variant.replace(seed=(case.seed + 7919) % 2**31), symptom)
            if attr == "tokens" and n < own and failed is not None:
                # fewer tokens: the first n and the last n must agree, or the outcome is which tokens were
                # kept (the one that shows the defect), not how many
                again = self._fails_alike(resized(case, attr, n, from_end=True), symptom)
                failed = failed if again == failed else None
            if failed is not None:
                outcomes[n] = failed
        return fitting_rule(attr, outcomes)

    @staticmethod
    def _same_strided_layouts(case: Case, names: tuple[str, str]) -> Case | None:
        layouts = [getattr(case, n) for n in names]
        plain = Layout.contiguous(len(layouts[0].order))
        strided = next((lay for lay in reversed(layouts) if lay != plain), None)
        return None if strided is None else case.replace(**{n: strided for n in names})

    def effects(self, case: Case, symptom: str) -> list[Effect]:
        r = self.replay(case)
        if r is None:
            return []
        if symptom.startswith("raises:"):
            etype = symptom.split(":", 1)[1]
            head = r.error.split("\n", 1)[0] if r.error else ""
            message = head.split(f"raised {etype}: ", 1)[-1]
            return [Effect(symptom, f"raises {etype}", normalize(message, 200))]
        if symptom == "input-modified":
            names = [n for n, old in r.before.items() if n not in ("k_cache", "v_cache")
                     and not torch.equal(old.cpu().reshape(-1).view(torch.uint8),
                                         r.actual.buffers[n].cpu().reshape(-1).view(torch.uint8))]
            # One key whichever inputs: a division in place changes K alone where only k_scale is not 1.0.
            return [Effect("input-modified", "modifies what it reads (its inputs, cache_loc or a scale)",
                           f"here: {', '.join(names) or '?'}")]
        effects = explain(case, r.expected, r.actual, r.before, self._fresh(case))
        effects = [self._told_apart(case, e) if e.alternatives else e for e in effects]
        effects = [self._bound_confirmed(case, e, symptom, r) if e.key == "out-of-range:wrong-bound" else e
                   for e in effects]
        effects = [x for e in effects for x in (self._placement_confirmed(case, e, r) if _placed(e) else [e])]
        return [self._corroborated(case, e, symptom, r) for e in effects]

    def _bound_confirmed(self, case: Case, effect: Effect, symptom: str, replay: Replay) -> Effect:
        """A wrong number of slots (pages x H, say) must be the same formula on a cache of other sizes: the
        Case is replayed with more pages, the slots it skipped moved below the larger bound, and where slots are
        still left unwritten the same bound must explain it (a token left unwritten for another reason, such as
        its place in the batch, stays unwritten there). A tile tail that leaves the last tokens unwritten can
        line up with such a bound once; refuted, the effect is the slots left unwritten (or what no model
        explains). The variant also names slot 0, which every such bound keeps: a kernel that writes nothing (a
        D it cannot handle) fits a bound on a Case whose every slot lies past it, and is refuted there."""
        if self._bound_refuted(case, effect, replay):
            return Effect("wrong-slot:unwritten", TITLES["wrong-slot:unwritten"],
                          unwritten_where(case, replay.expected, replay.actual))
        variant = case.replace(num_pages=2 * case.num_pages + 1)
        bound = _bound_of(effect)
        if bound is not None:  # the skipped slots moved below the larger cache's bound: the bound must write them
            old, new = bound(case), min(bound(variant), variant.num_slots)
            skipped = sorted({s for s in case.cache_loc if old <= s < case.num_slots})
            free = [s for s in range(old, new) if s not in case.cache_loc][:len(skipped)]
            if skipped and len(free) == len(skipped):
                moved = dict(zip(skipped, free))
                variant = variant.replace(cache_loc=tuple(moved.get(s, s) for s in case.cache_loc))
        if 0 not in variant.cache_loc:
            variant = variant.replace(num_tokens=case.num_tokens + 1, cache_loc=(*variant.cache_loc, 0))
            variant = with_ordinary_values(case, variant)  # a value defect must not show in the added token
        r = self.replay(variant)
        if r is None or r.error or symptom not in r.symptoms:
            return effect
        again = explain(variant, r.expected, r.actual, r.before, self._fresh(variant))
        if any(e.key == effect.key and e.detail == effect.detail for e in again):
            return effect
        key = ("wrong-slot:unwritten" if _unwritten(case, replay.expected, replay.actual, replay.before)
               else "wrong-slot:unexplained")
        if key == "wrong-slot:unwritten":
            return Effect(key, TITLES[key], unwritten_where(case, replay.expected, replay.actual))
        return Effect(key, TITLES[key], f"{effect.detail} fit these slots, not those of a cache with more pages")

    def _last_slot_kept_fails(self, case: Case, symptom: str) -> bool:
        """Whether the Case at the plain page size fails with its last slot's tokens at the new last slot."""
        last = case.num_slots - 1
        for variant in BY_NAME["page-size"].variants(case, self.plain):
            end = variant.num_slots - 1
            if end in variant.cache_loc:
                return False
            locs = tuple(end if s == last else v for s, v in zip(case.cache_loc, variant.cache_loc))
            if not self.fails(variant.replace(cache_loc=locs), symptom):
                return False
        return True

    def _bound_refuted(self, case: Case, effect: Effect, replay: Replay) -> bool:
        """Whether the same cache with the unwritten tokens at other slots past the bound (not the last, nor
        one a token names) is written right: a bound skips every slot past it, and a check off by one at the
        cache's end (`< n - 1`) skips the last slot alone, which a bound fits when it is the only slot named.
        Or whether the same slots with the out-of-range tokens last are written right: a bound skips the same
        slots in any order, and a loop that stops at the first out-of-range token (`break` for `continue`)
        leaves only the tokens after it."""
        formula = _bound_of(effect)
        if formula is None:
            return False
        out_last = (tuple(s for s in case.cache_loc if s < case.num_slots)
                    + tuple(s for s in case.cache_loc if s >= case.num_slots))
        if out_last != case.cache_loc:
            r = self.replay(case.replace(cache_loc=out_last))
            if r is not None and not r.error and not r.symptoms:
                return True
        bound = formula(case)
        named = [s for s in case.cache_loc if 0 <= s < case.num_slots]
        unwritten = {s for s in named if s >= bound}
        # past the largest bound that fits as well: every bound that fits skips the slots moved to
        bound = max(slots(case) for _, slots in BOUNDS if {s for s in named if s >= slots(case)} == unwritten)
        free = [s for s in range(bound, case.num_slots - 1) if s not in case.cache_loc][:len(unwritten)]
        if not unwritten or len(free) < len(unwritten):
            return False
        moved = dict(zip(sorted(unwritten), free))
        r = self.replay(case.replace(cache_loc=tuple(moved.get(s, s) for s in case.cache_loc)))
        return r is not None and not r.error and not r.symptoms

    def _order_trigger(self, case: Case, trigger: list[str]) -> list[str]:
        """Whole tokens at other slots that the same tokens in the order of their slots get right: a kernel that
        sorts the slots and not the rows. Its trigger is the order, with what else the Case needs (padding,
        which sorts first); more than one token, or some number of them, is a consequence."""
        sorted_case = next(SLOTS_UNSORTED.variants(case, self.plain), None)
        if sorted_case is None or self._fails_alike(sorted_case, "values") is not False:
            return trigger
        return sorted({t for t in trigger if t != "many-tokens" and not t.startswith("tokens-")} |
                      {SLOTS_UNSORTED.name})

    def _placement_confirmed(self, case: Case, effect: Effect, replay: Replay,
                             exclude: frozenset[str] = frozenset()) -> list[Effect]:
        """A placement model read off a minimal Case of one or two tokens may fit it by chance: padding that
        drops every later token reads as an int64 cache_loc's int32 words when the second word of -1 is -1
        again. So the Case is replayed with two more tokens (each on a page of its own), after its tokens and
        before them (a kernel that sorts the slots, not the rows, wrote (0, -1) as padding to slot 0), and
        without its NaNs and infinities; where such a call is wrong too, the effect or an alternative must explain
        it, or the minimal Case is explained again without the refuted ones (by value effects, one a cache, where
        no other placement model fits: zeros made NaN in both caches fit a tensor read from its storage's start)."""
        keys = [effect.key, *effect.alternatives]
        if self.device.type == "cuda" and effect.key.startswith(("padding:", "out-of-range:")):
            # Such a model sends tokens to a slot a real token writes too, and on a GPU which of them lands is
            # undefined: a larger call can land the other way (seen on the H200 for padding at slot 0).
            return [effect]
        variants = [resized(case, "tokens", case.num_tokens + 2, from_end=before) for before in (False, True)]
        if effect.key == "overrun:tile":  # and at twice D: a tile's lanes bounded by D fit a head left unwritten
            variants.append(resized(case, "dim", 2 * case.head_dim))  # where D is 2 by chance
        finite = tuple(o for o in case.overrides if math.isfinite(from_bits(o.bits, case.input_dtype)))
        if finite != case.overrides:  # and without its NaNs and infinities: where a NaN makes every byte 0x7F (a
            variants.append(case.replace(overrides=finite))  # scale made from the data), inputs read from the
            # poison around a tensor (quiet NaNs) fit by chance
        # and with its values re-drawn (no overrides), and at ordinary scales: where a misread argument puts
        # bytes depends on neither, so those calls must fail too. A value defect that makes whole rows alike (an
        # fp16 widening that turns zeros into 2**-15, all ±448 at a scale of 1e-30) fits "tokens moved" by
        # chance, and the call at ordinary scales passes.
        value_free = [v for v in (case.replace(seed=(case.seed + 7919) % 2**31, overrides=()), _telling(case))
                      if v is not None]
        for variant in value_free:  # their passing tells; their failing, only with the same symptoms (new values
            r = self.replay(variant)  # can show another defect of a pair too)
            if r is not None and not r.error and not r.symptoms:
                keys = []
                break
            if r is not None and not r.error and r.symptoms == replay.symptoms and _tiny(replay):
                # a Case of a byte or two fits a misread argument by chance (V read from its storage's start,
                # where K's one value lies): the same misreading must give the re-drawn call's bytes too
                keys = [k for k in keys if explains(k, variant, r.expected, r.actual, r.before, self._fresh(variant))]
        for variant in variants if keys else []:
            r = self.replay(variant)
            if r is None or r.error or not r.symptoms:
                continue
            keys = [k for k in keys if explains(k, variant, r.expected, r.actual, r.before, self._fresh(variant))]
        if keys == [effect.key, *effect.alternatives]:
            return [effect]
        if keys:
            detail = effect.detail if keys[0] == effect.key else ""
            return [Effect(keys[0], title_of(keys[0], case.recipe), detail, effect.value, keys[1:])]
        refuted = exclude | {effect.key, *effect.alternatives}
        rest = explain(case, replay.expected, replay.actual, replay.before, self._fresh(case), exclude=refuted)
        if len(rest) == 1 and _placed(rest[0]) and len(refuted) < 8:  # the next model, held to the same calls
            return self._placement_confirmed(case, rest[0], replay, refuted)
        if rest and not any(_placed(e) or e.key.endswith("unexplained") for e in rest):
            return rest
        return [unexplained("wrong-slot:unexplained", replay.expected, replay.actual,
                            f"{effect.title} fit these bytes, not those of the same call with more tokens, other "
                            "values or other scales")]

    def _fresh(self, case: Case) -> Callable[[], Built]:
        """The Case's tensors, new for each call: built once, then copied (a model check builds one per model,
        dozens a call, and copying buffers costs a fraction of building them)."""
        first: list[Built] = []

        def fresh() -> Built:
            if not first:
                built = build(case, self.device)
                first.append(self.fill(built) if self.fill else built)
            return first[0].copy()
        return fresh

    def _told_apart(self, case: Case, effect: Effect) -> Effect:
        """A value effect that several explanations fit (a scale ignored, or the other cache's scale of
        1.0): replay with scales of other values, each cache's distinct and not 1.0, and keep what fits
        both calls."""
        variant = _telling(case)
        if variant is None:
            return effect
        r = self.replay(variant)
        if r is None or r.error:
            return effect
        again: set[str] = set()
        keys = [effect.key, *effect.alternatives]
        for e in explain(variant, r.expected, r.actual, r.before, self._fresh(variant), only=frozenset(keys)):
            again |= {e.key, *e.alternatives}
        fits = [k for k in keys if k in again]
        if not fits:
            return effect
        return Effect(fits[0], title_of(fits[0], case.recipe), effect.detail, effect.value, fits[1:])

    def _corroborated(self, case: Case, effect: Effect, symptom: str, replay: Replay) -> Effect:
        """A value model read off a minimal Case may fit its few differing bytes by chance: a tie at 465
        that a kernel clamps to 448 before dividing lands one e4m3 step lower, which reads as rounding
        toward zero when it is the only byte that differs. So the Case is replayed with its values
        re-drawn (no overrides, REDRAWN_SEEDS other seeds, every other dimension kept; each also with
        REDRAWN_TOKENS tokens; then each with the telling scales, the scale kinds kept): where the symptom
        shows again, the effect or one of its alternatives must explain that call too, or nothing does
        (the defect is then unexplained, with the minimal call's byte pairs). Sign and overflow rules
        (`encoding:`, `zero-sign:`) are read from every differing byte pair's kind, which re-drawn ordinary
        values seldom show; they are held to a re-drawn call that shows them, or that writes wrong values
        (a float32 input read as bfloat16 writes -0 for +0 where its values are zeros, and garbage elsewhere)."""
        if not effect.value or self.fill is not None:
            return effect
        sign_rule = effect.key.startswith(("encoding:", "zero-sign:"))
        # a rule on the slot's old bytes shows as values, or as bytes left as they were (a new 0x00 ORed or added)
        old_bytes_rule = effect.key.startswith("storage:")
        keys = [effect.key, *effect.alternatives]
        redrawn = _redrawn(case, REDRAWN_SEEDS)
        # and with ordinary scales too: at an extreme one (3.4e38) every byte may be ±0 under several rules
        redrawn += [v for v in map(_telling, redrawn) if v is not None]
        for variant in redrawn:
            r = self.replay(variant)
            if r is not None and not r.error and not r.symptoms and not sign_rule:
                if variant.num_tokens != case.num_tokens:
                    continue  # right with more tokens: T may be the trigger (a decode path), no evidence
                # The call is right: a model that predicts other bytes there is refuted (a scale ignored where
                # the telling scales are right: a floor under the scale fit a tiny one's zeros).
                keys = value_keys_fitting(variant, r.expected, r.actual, r.before, keys)
            elif r is None or r.error or not (symptom in r.symptoms or (sign_rule and "values" in r.symptoms)
                                                or (old_bytes_rule and r.symptoms & {"values", "placement"})):
                moved = self._placement_behind(case, variant, r, replay)
                if moved is not None:
                    return moved
                continue  # the re-drawn values do not show it: no evidence either way
            elif not sign_rule and not old_bytes_rule and r.symptoms - replay.symptoms:
                continue  # another defect shows too (added tokens past a wrong bound): no evidence either way
            else:
                again: set[str] = set()
                # The value models alone: the question is whether this one fits again, and the placement models
                # (dozens of reference calls, each on new tensors) answer another. A sign rule's call shows both, so
                # they are asked too, but only where the value models alone do not fit: zeros made NaN in both
                # caches also fit a tensor read from its storage's start, which would hide the rule.
                for placement in (False, True) if sign_rule else (False,):
                    for e in explain(variant, r.expected, r.actual, r.before, self._fresh(variant),
                                     placement=placement, only=frozenset(keys)):
                        again |= {e.key, *e.alternatives}
                    if again & set(keys):
                        break
                keys = [key for key in keys if key in again]
            if not keys:
                return unexplained("wrong-bytes:unexplained", replay.expected, replay.actual,
                                   f"{title_of(effect.key, case.recipe)} fit these bytes, not those of the same "
                                   "call with re-drawn values")
        if keys == [effect.key, *effect.alternatives]:
            return effect
        return Effect(keys[0], title_of(keys[0], case.recipe), effect.detail, effect.value, keys[1:])

    def _placement_behind(self, case: Case, variant: Case, r: Replay | None, replay: Replay) -> Effect | None:
        """At an extreme scale every byte is ±0 or ±max, so whole tokens at the wrong slot differ in their signs
        alone and read as a sign rule; where two tokens' values nearly agree (ties, subnormals), a row taken from
        the wrong token differs in one byte and reads as a value rule. Where the call with re-drawn values shows
        bytes out of place instead, a placement model that explains it and the minimal Case's own bytes is the
        cause (V read one token ahead, seen with a v_scale of 1.4e-45; V's rows taken from the wrong tokens after
        padding, seen as a scale ignored on one subnormal byte)."""
        if r is None or r.error or "placement" not in r.symptoms:
            return None
        for e in explain(variant, r.expected, r.actual, r.before, self._fresh(variant)):
            if _placed(e) and explains(e.key, case, replay.expected, replay.actual, replay.before, self._fresh(case)):
                return e
        return None

    def _dimension_variants(self, case: Case, dim: str) -> list[Case]:
        """The Case with one trigger dimension moved back to the plain call (for a size rule: the two largest
        sizes the rule says pass, the most values); [] for a dimension of the values alone."""
        rule, ablation = SIZE_RULES.get(dim), BY_NAME.get(dim)
        if dim == SCALE_TENSOR:
            return [v for v in [as_float_scales(case)] if v is not None]
        if rule is not None:
            return [resized(case, rule.attr, n) for n in [n for n in SIZE_PROBES[rule.attr] if not rule.fails(n)][-2:]]
        return [] if ablation is None or ablation.value else list(ablation.variants(case, self.plain))

    def _value_trigger(self, case: Case, symptom: str, trigger: list[str]) -> list[str]:
        """A value defect that touches a few values in many (one subnormal band) vanishes from an ablation's
        variant by chance, when its values hold none of them: each dimension of its trigger that is not a value
        dimension is kept only if its variant (for a size rule: the two largest sizes the rule says pass), with
        its values re-drawn TRIGGER_SEEDS times (and with more tokens), never shows the symptom. A variant may
        show another defect too (a page size that moves the Case's slot past a wrong bound): only this symptom
        counts."""
        kept = []
        for dim in trigger:
            variants = self._dimension_variants(case, dim)
            if not variants:
                kept.append(dim)
                continue
            shown = (self.replay(v) for variant in variants for v in _redrawn(variant, TRIGGER_SEEDS))
            if not any(r is not None and not r.error and symptom in r.symptoms for r in shown):
                kept.append(dim)
        return kept

    def diagnose(self, case: Case) -> list[Finding]:
        """The Case's defects, one Finding per (effect, trigger); [] when the Case passes on replay."""
        if cache_bytes(case) >= BIG_CACHE_BYTES:  # never replayed whole here: 4 buffers of 2 GiB
            return self.big(case)
        first = self.replay(case)
        if first is None or not first.symptoms:  # passes, or differs only where the contract leaves it open
            return []  # (which token's bytes a shared slot holds): the caller reads the failure's own text
        findings: dict[str, Finding] = {}
        values: dict[str, Case] = {}  # the value effects found, and the minimal Case each was read from
        try:  # _raising names the raise under diagnosis, and no other call's
            for symptom in sorted(first.symptoms):
                self._raising = raised(first.error).key if symptom.startswith("raises:") and first.error else None
                minimal, trigger = self.minimize(case, symptom)
                effects = self.effects(minimal, symptom) or [Effect("wrong-bytes:unexplained", "writes wrong bytes")]
                for effect in effects:
                    if effect.value and not effect.key.endswith(":unexplained"):
                        values.setdefault(effect.key, minimal)
                    named = trigger
                    if _placed(effect) and symptom in VALUE_SYMPTOMS:
                        # Bytes out of place that differ in their signs alone (every moved byte ±0 at an extreme
                        # scale): an ordinary scale turns the symptom into misplaced bytes, and the failure stays.
                        named = self._trigger(minimal, symptom, also=frozenset({"placement"}))
                    if effect.key == "wrong-slot:tokens-moved":
                        named = self._order_trigger(minimal, named)
                    if effect.key == "overrun:rows" and "first-slot" in named:
                        named = self._stray_trigger(minimal, named)
                    if effect.value:
                        named = self._value_trigger(minimal, symptom, named)
                    f = finding(effect, named, minimal, case.recipe)
                    findings.setdefault(f.key, f)
        finally:
            self._raising = None
        kept = narrowest(self._one_trigger_per_effect(list(findings.values())))
        behind = self._behind_values(case, first, values) if values else None
        if behind is not None and not any(same_effect(f.key) == same_effect(behind[1].key) for f in kept):
            replaced, extra = behind
            kept = [f for f in kept if f.facts.get("effect") not in replaced] + [extra]
        for f in kept:
            self._save(f)
        return kept

    def _fits(self, key: str, value: bool, case: Case, r: Replay) -> bool:
        """Whether this effect (a value effect's model, or a placement or moved one) accounts for every differing
        cache byte of the call."""
        if not r.symptoms:
            return True
        found = explain(case, r.expected, r.actual, r.before, self._fresh(case), placement=False,
                        only=frozenset({key}))
        if found and all(key in (e.key, *e.alternatives) for e in found):
            return True
        return not value and explains(key, case, r.expected, r.actual, r.before, self._fresh(case))

    def _unexplained_by(self, keys: list[str], case: Case) -> bool | None:
        """Whether the Case writes wrong bytes that none of these value effects accounts for (None: it cannot
        be run, or it raises)."""
        r = self.replay(case)
        if r is None or r.error:
            return None
        return bool(r.symptoms) and not any(self._fits(k, True, case, r) for k in keys)

    def _behind_values(self, case: Case, first: Replay, values: dict[str, Case]) -> tuple[set[str], Finding] | None:
        """A value defect of every call (subnormal quotients rounded twice, say) survives every ablation, so each
        symptom's minimal Case shows it alone, and a second cause whose dimensions the ablations moved back is
        lost with them. So where none of the value effects found accounts for the failing Case's own bytes, the
        Case is minimized again on bytes they leave unexplained, and that variant's effect, named and not
        unexplained, is the second cause; its trigger, the dimensions whose ablation makes those bytes vanish.
        An effect that accounts for a value effect's own minimal Case too is its cause instead (returned as the
        keys it replaces): one cause the minimal Case showed under a narrower model."""
        keys = list(values)
        if first.error or not self._unexplained_by(keys, case):
            return None
        current = self._shrunk(case, lambda v: self._unexplained_by(keys, v))
        r = self.replay(current)
        if r is None or r.error:
            return None
        found = explain(current, r.expected, r.actual, r.before, self._fresh(current), exclude=frozenset(keys))
        if len(found) != 1 or found[0].key.endswith(":unexplained") or found[0].key in keys:
            return None  # no one effect of its own: leave the failure to the value effects found
        effect = found[0]
        trigger = self._vanishing(current, lambda v: self._unexplained_by(keys, v))
        implied = {d for t in trigger for d in IMPLIED.get(t, ())}
        trigger = [t for t in trigger if t not in implied]
        replaced = {k for k, minimal in values.items()
                    if (m := self.replay(minimal)) is not None and not m.error
                    and self._fits(effect.key, effect.value, minimal, m)}
        return replaced, finding(effect, trigger, current, case.recipe)

    def _stray_trigger(self, case: Case, trigger: list[str]) -> list[str]:
        """A token past the batch written at slot 0 shows as wrong values where a token names slot 0 (moving it
        makes that symptom vanish) and as a write outside the batch's slots where none does: its trigger is read
        where none does."""
        moved = next(BY_NAME["first-slot"].variants(case, self.plain), None)
        r = None if moved is None else self.replay(moved)
        if r is None or r.error or not r.symptoms:
            return trigger
        return self.minimize(moved, sorted(r.symptoms)[0])[1]

    def _one_trigger_per_effect(self, findings: list[Finding]) -> list[Finding]:
        """One effect found under several symptoms of one Case, with other triggers, is one cause: whole tokens
        moved at an extreme v_scale differ in V's signs alone, and the ablation that brings V's values back
        (an ordinary scale) turns the sign symptom into misplaced values, the failure kept. The effect's trigger
        is the one whose every dimension, moved back to the plain call, makes the whole failure vanish; where
        none or each does, all are kept."""
        groups: dict[str, list[Finding]] = {}
        for f in findings:
            groups.setdefault(same_effect(f.key), []).append(f)
        dropped: set[str] = set()
        for group in groups.values():
            if len(group) < 2:
                continue
            whole = [f for f in group if self._failure_vanishes(Case.from_dict(f.facts["minimal"]), f.facts["trigger"])]
            if whole and len(whole) < len(group):
                dropped |= {f.key for f in group if f not in whole}
        return [f for f in findings if f.key not in dropped]

    def _failure_vanishes(self, case: Case, trigger: list[str]) -> bool:
        """Whether each trigger dimension's variants of the Case run and pass (no symptom of any kind)."""
        for dim in trigger:
            ran = [r for r in map(self.replay, self._dimension_variants(case, dim)) if r is not None]
            if not ran or any(r.error or r.symptoms for r in ran):
                return False
        return bool(trigger)

    def _save(self, f: Finding) -> None:
        """Save the minimal variant as a failure file, so the report's replay command rebuilds it."""
        if self.fill is not None:
            return
        from conformance.artifacts import save_failure
        minimal = Case.from_dict(f.facts["minimal"])
        r = self.replay(minimal)
        saved = save_failure(minimal, self.impl, (r.error or r.report or f.title) if r else f.title, final=True)
        m = re.search(r"failure case saved: (\S+)", saved)
        if m:
            f.case_file = m.group(1)

    def big(self, case: Case, what: str = "caches above 2**31 bytes") -> list[Finding]:
        """A failure on a huge call: a defect of its own only if the same call made small passes."""
        small = next(BY_NAME["big-cache"].variants(case, self.plain), case)
        found = self.diagnose(small) if cache_bytes(small) < BIG_CACHE_BYTES else []
        if found:
            return found
        effect = Effect("big-cache:wrong-offsets", f"writes wrong bytes or slots on {what}, and not on the same "
                        "call made small (offsets computed in 32 bits?)")
        return [finding(effect, ["big-cache"], case, case.recipe)]


#: Differing bytes in a minimal Case at or below which a placement model must fit its re-drawn call too.
TINY_DIFF = 4


def _tiny(replay: Replay) -> bool:
    """Whether a call's caches differ from the reference's in at most TINY_DIFF bytes."""
    return sum(int((replay.expected.buffers[n].cpu().reshape(-1).view(torch.uint8)
                    != replay.actual.buffers[n].cpu().reshape(-1).view(torch.uint8)).sum())
               for n in ("k_cache", "v_cache")) <= TINY_DIFF


def _placed(effect: Effect) -> bool:
    """A placement effect (a misread argument, bytes moved), which a larger call confirms or refutes."""
    return (not effect.value and class_of(effect.key) not in ("raises", "input-modified")
            and effect.key not in ("wrong-slot:unwritten", "out-of-range:wrong-bound")
            and not effect.key.endswith(":unexplained"))


def narrowest(findings: list[Finding]) -> list[Finding]:
    """Of findings with one effect, those whose trigger holds no other's: a symptom that one ablation
    happens to hide (a sign pair gone with the values that made it) adds dimensions, not a cause. And of a
    placement effect found under several triggers, not one made of value dimensions alone: bytes written to the
    wrong place fall into other symptom classes (a sign, an overflow) as the values move, not out of place."""
    def parts(f: Finding) -> tuple[str, frozenset[str]]:
        return same_effect(f.key), trigger_set(f.key)
    kept = []
    for f in findings:
        effect, trig = parts(f)
        if any(parts(g)[0] == effect and parts(g)[1] < trig for g in findings):
            continue
        if keyed_by_values(f.key) and any(g is not f and parts(g)[0] == effect and not keyed_by_values(g.key)
                                          for g in findings):
            continue
        kept.append(f)
    return kept


def keyed_by_values(key: str) -> bool:
    """A placement (or other non-value) effect whose trigger is value dimensions alone: misplaced bytes change
    symptom class as the values move, so such a trigger is chance where the same effect has another."""
    trig = trigger_set(key)
    return class_of(key) not in VALUE_CLASSES and same_effect(key) != "unexplained" and bool(trig) and all(
        value_dimension(t) for t in trig)


def value_dimension(dimension: str) -> bool:
    """A trigger dimension of the values themselves (`values`, `scale-value`, `special-values`), not of the call."""
    return bool(BY_NAME.get(dimension) and BY_NAME[dimension].value)


#: The capability cell of an effect class.
EFFECT_CELLS = {"raises": "raises", "input-modified": "writes outside", "padding": "writes outside",
                "out-of-range": "writes outside", "wrong-slot": "writes outside", "overrun": "writes outside",
                "strides": "wrong bytes",
                "big-cache": "wrong bytes"}
#: Effect classes read from each token's own input (their identity leaves the value dimensions out).
VALUE_CLASSES = ("rounding", "scale", "flush-to-zero", "rounds-toward-zero", "rounds-ties-away",
                 "rounds-ties-toward-zero", "rounds-ties-to-odd", "approximate-division",
                 "off-by-one-ulp", "saturates-low", "input-rounded", "storage", "format", "encoding", "zero-sign",
                 "carry-lost", "input-misread", "sign", "input-clamped", "rounds-sticky-lost", "subnormal-grid",
                 "double-rounding", "subnormal-shift", "subnormal-path",
                 "exponent-bias")


# -- keys: effect@trigger ---------------------------------------------------------------------------

def class_of(key: str) -> str:
    """A key's class: 'rounding' of 'rounding:divide', 'flush-to-zero' of 'flush-to-zero@any'."""
    return key.split("@", 1)[0].split(":", 1)[0]


def trigger_of(key: str) -> str:
    """A diagnosed key's trigger ('' for a key without one)."""
    return key.split("@", 1)[1] if "@" in key else ""


def _bound_of(effect: Effect) -> Callable[[Case], int] | None:
    """The number of slots a wrong-bound effect names (BOUNDS' formula of its detail); None for another effect."""
    return next((slots for name, slots in BOUNDS if effect.detail == f"slots at or past {name} skipped"), None)


def same_effect(key: str) -> str:
    """A key's effect, for telling one cause's keys apart: what no model explains is one effect, whether
    the minimal variant that showed it also changed bytes outside the written slots or not."""
    effect = key.split("@", 1)[0]
    return "unexplained" if effect.endswith(":unexplained") else effect


def trigger_set(key: str) -> frozenset[str]:
    """A key's trigger dimensions ('plain' and 'any' are none)."""
    return frozenset(t for t in trigger_of(key).split("+") if t and t not in ("plain", "any"))


def _value_dimension(effect: Effect, dimension: str) -> bool:
    """A dimension of the values, for this effect: the scales differing is one, but for a cache written with
    the other cache's scale (which two equal scales hide)."""
    if dimension == "scales-differ":
        return effect.key != "scale:swapped"
    return value_dimension(dimension)


def _named(effect: Effect, trigger: list[str]) -> list[str]:
    """The trigger dimensions a defect is named by: a value effect's leave out the value dimensions."""
    return [t for t in trigger if not (effect.value and _value_dimension(effect, t))]


def identity(effect: Effect, trigger: list[str]) -> str:
    """effect@trigger: a value effect's identity, and its title, leave out the value dimensions (a flush
    to zero always needs subnormal results; which Case had them is not a cause): `@any` when no other
    dimension triggers it. `@plain`: any other effect on the plain call."""
    return f"{effect.key}@{'+'.join(sorted(_named(effect, trigger))) or ('any' if effect.value else 'plain')}"


#: The dimension a placement effect misreads: returning it to the plain call must make the failure vanish.
#: A model whose dimension is not in the trigger fit the bytes by chance (V written with K's strides reads
#: as V written contiguously when K's cache is contiguous; a head-major write can read as either).
MISREADS: dict[str, str | tuple[str, ...]] = {
    "strides:inputs-ignored": "strided-input", "strides:inputs-heads-ignored": "strided-input",
    "strides:cache-loc-ignored": "strided-loc", "strides:input-2d-as-dh": "input-2d",
    "strides:other-cache": "cache-layouts-differ", "strides:other-input": "input-layouts-differ",
    "strides:cache-ignored": "strided-cache", "strides:cache-page-stride": "strided-cache",
    "strides:cache-inner-stride": "strided-cache",
    "padding:wraps-to-end": "padding", "padding:slot-0": "padding",
    # the slots that write nothing dropped from cache_loc: padding's, or out-of-range ones too
    "padding:slots-compacted": ("padding", "out-of-range"),
    "out-of-range:written": "out-of-range"}


#: Slot rules that act on each token by its own slot: a token alone at that slot shows them too, so a trigger of
#: several tokens (every one of the minimal Case's tokens, alone, is right; the ablation tries the first four)
#: says the model fit by chance (a grid that skips some tokens' programs, read as a bound that skips slots).
PER_TOKEN = ("out-of-range:wrong-bound", "out-of-range:written")


def _misread_in(key: str, trigger: list[str]) -> bool:
    """Whether the dimension the effect misreads (one of them, where either can show it) is in the trigger."""
    dims = MISREADS[key]
    return any(d in trigger for d in ((dims,) if isinstance(dims, str) else dims))


def consistent(effect: Effect, trigger: list[str], tokens: int = 0) -> Effect:
    """The first of the effect and its alternatives whose misread dimension is in the trigger, and that is no
    per-token slot rule triggered by several tokens (of a Case of at most four); none such (every model fit
    by chance): what no model explains."""
    alone = "many-tokens" in trigger and 0 < tokens <= 4
    fits = [k for k in [effect.key, *effect.alternatives] if (k not in MISREADS or _misread_in(k, trigger))
            and not (alone and k in PER_TOKEN)]
    if fits == [effect.key, *effect.alternatives]:
        return effect
    if not fits:
        return Effect("wrong-slot:unexplained", title_of("wrong-slot:unexplained"),
                      f"{effect.key} fits its bytes, but its trigger refutes it (its misread argument is not "
                      "in it, or several tokens are, for a rule on each token's own slot)")
    detail = effect.detail if fits[0] == effect.key else ""  # the detail named the first model's misread
    return Effect(fits[0], title_of(fits[0]), detail, effect.value, fits[1:])


def _values_needed(effect: Effect, trigger: list[str], minimal: Case) -> str:
    """A value effect's value dimensions, in words, for its title (its key leaves them out): a reader learns
    that a NaN is lost only for a tiny scale, and which scale its smallest Case has."""
    values = [t for t in trigger if effect.value and _value_dimension(effect, t)]
    if not values:
        return ""
    said = [f"{words([t])} (here k_scale {minimal.k_scale.value:g}, v_scale {minimal.v_scale.value:g})"
            if t == "scale-value" else words([t]) for t in values]
    return f" (in its smallest Case: {'; '.join(said)})"


#: (effect, trigger dimension) -> the title of the one cause that effect has under that trigger.
CAUSE_TITLES = {("overrun:rows", "padded-keys"): "writes a padded key's row past the batch (T taken from the keys, "
                                                 "not from cache_loc: cache_loc read past its end)"}


def finding(effect: Effect, trigger: list[str], minimal: Case, held: str) -> Finding:
    effect = consistent(effect, trigger, minimal.num_tokens)
    key = identity(effect, trigger)
    cls = class_of(key)
    named = _named(effect, trigger)
    own = next((t for (k, dim), t in CAUSE_TITLES.items() if k == effect.key and dim in trigger), effect.title)
    title = f"{own}, {words(named)}" if named or not effect.value else own
    title += _values_needed(effect, trigger, minimal)
    alternatives = [identity(Effect(a, "", value=effect.value), trigger) for a in effect.alternatives]
    return Finding(cls, key, title, cell=EFFECT_CELLS.get(cls, "wrong bytes"), case_size=case_size(minimal),
                   facts={"effect": effect.key, "trigger": trigger, "detail": effect.detail, "held": held,
                          "explanations": [key, *alternatives] if alternatives else [],
                          **({"value_kinds": list(effect.value_kinds)} if effect.value_kinds else {}),
                          **({"beside": effect.beside} if effect.beside else {}),
                          "minimal": minimal.to_dict()})


def _failed(exc: BaseException) -> bool | None:
    """An experiment's exception: a failure, or None when the GPU's memory ran out (no evidence either way)."""
    return None if out_of_memory(f"{type(exc).__name__}: {exc}") else True
