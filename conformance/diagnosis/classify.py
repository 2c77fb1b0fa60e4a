"""Classify a failure: what kind of defect does it show? By its byte diff, or else by its error.

A failing Case is replayed (reference and implementation on fresh builds of the same bytes) and its
diff read slot by slot, then byte by byte; a failure without a Case (an argument check, a graph
capture) is read from the ConformanceFailure message. Each result is a `Finding`; findings with
the same `key` are one defect, however many tests found it (conformance.diagnosis.report groups them).

Classes (the key starts with the class):
- rounding: the written bytes are another recipe's (key `rounding:<recipe>`, chosen by the report
  over all findings: every finding lists the recipes that explain it, see `Finding.facts`);
- encoding: overflow or NaN encoding (keeps a NaN's sign, saturates where the recipe says NaN, ...);
- zero-sign: +0 for -0 or the reverse;
- scale: the bytes are the held recipe's under another scale (ignored, the other cache's, inverted);
- wrong-slot: a token's bytes at another token's slot, or a slot left unwritten;
- outside: bytes changed outside the written slots (a padding or out-of-range token's bytes, or
  others), or beyond the cache view (the guard bands);
- input-modified: k, v, cache_loc or a scale tensor changed;
- raises: an exception on a valid call (type and message, numbers normalized);
- crash: the process died (an illegal memory access ends the xdist worker);
- graph: CUDA-graph capture fails, syncs or warns; a replay is stale or empty;
- validation: an invalid argument is not rejected (one key per argument-error class);
- wrong-bytes: a difference none of the above explains;
- unclassified: a failure this module cannot read (a Hypothesis error, a suite assertion).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from conformance.cachemap import CACHES, byte_index, guard_mask, written_mask
from conformance.harness import raised_by_implementation, run_impl, run_reference
from conformance.impls import Implementation
from kernel import RECIPES
from kernel.plan import ScaleArg
from kernel.recipe import get_recipe
from kernel.reference import quantize
from strategies.build import Built, build
from strategies.case import Case, Override, Scale
from strategies.fp import FORMATS, round_to, to_bits

#: The capability cell each class shows as.
CELLS = {
    "rounding": "wrong bytes", "encoding": "wrong bytes", "zero-sign": "wrong bytes", "scale": "wrong bytes",
    "wrong-slot": "wrong bytes", "wrong-bytes": "wrong bytes", "outside": "writes outside",
    "input-modified": "writes outside", "raises": "raises", "crash": "crashes", "graph": "raises",
    "validation": "does not validate", "unclassified": "wrong bytes",
    "flush-to-zero": "wrong bytes", "rounds-toward-zero": "wrong bytes", "approximate-division": "wrong bytes",
    "off-by-one-ulp": "wrong bytes", "storage": "wrong bytes", "strides": "wrong bytes", "padding": "writes outside",
    "out-of-range": "writes outside", "big-cache": "wrong bytes", "per-token-head": "wrong bytes",
    "rounds-ties-away": "wrong bytes", "saturates-low": "wrong bytes", "input-rounded": "wrong bytes",
    "format": "wrong bytes", "state": "wrong bytes", "kv-mixed": "wrong bytes", "carry-lost": "wrong bytes",
    "input-misread": "wrong bytes", "rounds-ties-toward-zero": "wrong bytes", "sign": "wrong bytes",
    "rounds-ties-to-odd": "wrong bytes",
    "input-clamped": "wrong bytes", "rounds-sticky-lost": "wrong bytes", "overrun": "writes outside",
    "subnormal-grid": "wrong bytes", "double-rounding": "wrong bytes", "subnormal-shift": "wrong bytes",
    "subnormal-path": "wrong bytes", "exponent-bias": "wrong bytes",
}
CLASS_TITLES = {
    "rounding": "rounding", "encoding": "overflow or NaN encoding", "zero-sign": "sign of zero",
    "scale": "wrong scale", "wrong-slot": "wrong slot", "outside": "writes outside", "input-modified":
    "input modified", "raises": "raises on valid input", "crash": "crash", "graph": "CUDA graph",
    "validation": "does not validate an argument", "wrong-bytes": "wrong bytes", "unclassified": "unclassified",
    "flush-to-zero": "flush to zero", "rounds-toward-zero": "rounding toward zero",
    "approximate-division": "not correctly rounded", "off-by-one-ulp": "not correctly rounded",
    "storage": "storage type", "strides": "strides", "padding": "padding slots", "out-of-range": "out-of-range slots",
    "big-cache": "caches above 2**31 bytes", "per-token-head": "dynamic per-(token, head) scales",
    "rounds-ties-away": "rounding ties away from zero", "rounds-ties-toward-zero": "rounding ties toward zero",
    "rounds-ties-to-odd": "rounding ties to odd",
    "sign": "sign", "saturates-low": "overflow bound",
    "input-rounded": "double rounding of the input", "format": "cache format",
    "state": "state kept between calls", "kv-mixed": "K and V mixed up", "carry-lost": "rounding carry lost",
    "input-misread": "input dtype misread", "input-clamped": "input clamped before the scale",
    "rounds-sticky-lost": "rounding without sticky bits", "overrun": "writes past a head's row",
    "subnormal-grid": "subnormals on another format's grid",
    "subnormal-shift": "subnormals at twice or half their value",
    "subnormal-path": "subnormal encoding", "exponent-bias": "exponent bias",
    "double-rounding": "double rounding through a 16-bit float",
}
NAN_BYTES = (0x7F, 0xFF)
EDGE_BYTES = (0x7E, 0xFE, 0x7F, 0xFF)  # ±448 and the NaN bytes
SAVED = re.compile(r"failure case saved: (\S+)")
#: The argument-contract test of a float8 cache of a format beyond e4m3 and no format argument
#: (conformance/fp8_formats.py), and the argument it names in each module.
ALONE_TEST = "test_a_float8_cache_alone_is_written_in_its_format_or_refused"
ALONE_MUTATIONS = {"test_e5m2": "a float8_e5m2 cache and no format argument",
                   "test_fnuz": "a float8_e4m3fnuz cache and no format argument"}
OUTSIDE_TOKENS = {  # whose bytes landed outside the written slots: (key, title)
    "padding": ("outside:padding", "writes the bytes of padding tokens (negative cache_loc) into the cache"),
    "out-of-range": ("outside:out-of-range", "writes the bytes of out-of-range tokens (cache_loc >= num_slots) "
                                             "into the cache"),
    "token": ("outside:slots", "changes bytes of slots no token names"),
}


@dataclass
class Finding:
    """One defect seen in one failure: its class, grouping key, one-line title and evidence."""

    cls: str
    key: str
    title: str
    cell: str = ""
    case_file: str | None = None  # the failure file holding the Case (None: no Case, e.g. an argument check)
    case_size: int | None = None  # tokens * heads * dim of that Case (the report keeps the smallest)
    replayable: bool = True  # `python -m tools.repro case_file` shows it (False: input-modified, graph, ...)
    facts: dict[str, Any] = field(default_factory=dict)  # class-specific: recipes, held, which, scale kind
    excerpt: str = ""  # the first lines of the report

    def __post_init__(self) -> None:
        self.cell = self.cell or CELLS[self.cls]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Finding:
        return Finding(**d)


def case_size(case: Case) -> int:
    return case.num_tokens * case.num_heads * case.head_dim


def normalize(message: str, limit: int = 160) -> str:
    """An error's first line with numbers and addresses made generic, so that equal errors group."""
    first = next((line.strip() for line in str(message).splitlines() if line.strip()), "")
    first = re.sub(r"0x[0-9a-fA-F]+", "0x…", first)
    first = re.sub(r"(?<![\w.])-?\d+(\.\d+)?(e[-+]?\d+)?(?![\w.])", "N", first)
    first = re.sub(r"N(,? N)+", "N, …", first)  # a list of values: its length is the Case's, not the error's
    return first[:limit]


def error_line(text: str) -> str:
    """The first 'SomeError: message' line of a text (an exception as a report prints it), normalized; ''."""
    found = re.search(r"(?:^|\s)(\w+(?:Error|Exception)): (.+)", text, re.MULTILINE)
    return normalize(f"{found.group(1)}: {found.group(2)}") if found else ""


#: describe_error's first line, '<impl> raised Type: message'; a per-token-head property's, 'Type: message'.
DESCRIBED = r" raised (\w+(?:\.\w+)*): (.*)$"
TYPE_FIRST = r"^(\w+(?:\.\w+)*): (.*)$"


def raised(error: str, first_line: str = DESCRIBED) -> Finding:
    """A Finding for an error's text whose first line `first_line` splits into type and message (else the
    type is Exception and the message that line), the traceback after it."""
    head = error.split("\n", 1)[0]
    m = re.search(first_line, head)
    etype, msg = (m.group(1), m.group(2)) if m else ("Exception", head)
    text = f"{etype}: {normalize(msg)}"
    return Finding("raises", f"raises:{text}", f"raises {text}", excerpt=error[:800],
                   facts={"exception": etype})


# -- the byte diff of one replayed Case ---------------------------------------------------------------

def _scale_value(scale: Scale) -> float:
    return 1.0 if scale.kind == "none" else scale.value


def _quantized(x: torch.Tensor, value: float, recipe: str, cache_format: str = "fp8_e4m3") -> torch.Tensor:
    """uint8 [T, H, D]: what each token writes under `recipe` with a scale of `value`, in the cache's format (CPU)."""
    return quantize(x, ScaleArg("float", value, None), get_recipe(recipe), cache_format).cpu()


class _Rows:
    """One cache's written slots as rows [n, H, D]: actual, expected, before, and the token of each."""

    def __init__(self, case: Case, which: str, expected: Built, actual: Built, before: dict[str, torch.Tensor]):
        self.case, self.which = case, which
        self.index = byte_index(case, which).flatten(0, 1)  # [slots, H, D] -> flat buffer index
        self.exp = expected.buffers[which].cpu()
        self.act = actual.buffers[which].cpu()
        self.before = before[which].cpu()
        self.x = (actual.k_logical if which == "k_cache" else actual.v_logical).cpu()
        self.other_x = (actual.v_logical if which == "k_cache" else actual.k_logical).cpu()
        self.scale = case.k_scale if which == "k_cache" else case.v_scale
        self.other = case.v_scale if which == "k_cache" else case.k_scale
        writers: dict[int, list[int]] = {}
        for t, s in enumerate(case.cache_loc):
            if 0 <= s < case.num_slots:
                writers.setdefault(s, []).append(t)
        self.writers = writers
        self._cache: dict[tuple[float, str], torch.Tensor] = {}

    def q(self, recipe: str, value: float | None = None) -> torch.Tensor:
        value = _scale_value(self.scale) if value is None else value
        key = (value, recipe)
        if key not in self._cache:
            self._cache[key] = _quantized(self.x, value, recipe, self.case.cache_format)
        return self._cache[key]

    def row(self, buf: torch.Tensor, slot: int) -> torch.Tensor:
        return buf[self.index[slot]]

    def token_kind(self, t: int) -> str:
        s = self.case.cache_loc[t]
        return "padding" if s < 0 else "out-of-range" if s >= self.case.num_slots else "token"

    def whose(self, row: torch.Tensor, exclude: Iterable[int] = ()) -> int | None:
        """A token (not in exclude) whose bytes, under any recipe, are exactly this row."""
        excluded = set(exclude)
        if self.x.shape[0] == 0:
            return None
        for recipe in RECIPES:
            hits = (self.q(recipe) == row[None]).flatten(1).all(1).nonzero().flatten().tolist()
            hits = [t for t in hits if t not in excluded]
            if hits:
                return hits[0]
        return None


def _outside(rows: _Rows, diff: torch.Tensor, written: torch.Tensor) -> list[Finding]:
    """Findings for bytes that changed outside the written slots."""
    case, which = rows.case, rows.which
    out = diff & ~written
    if not out.any():
        return []
    findings = []
    guard = guard_mask(case, which)
    if (out & guard).any():
        findings.append(Finding("outside", "outside:beyond", "writes beyond the cache view (into the bytes around it)",
                                facts={"which": which}))
    in_slot = torch.zeros_like(out)
    kinds: dict[str, list[int]] = {}
    for slot in range(case.num_slots):
        idx = rows.index[slot].flatten()
        in_slot[idx] = True
        if slot in rows.writers or not out[idx].any():
            continue
        t = rows.whose(rows.row(rows.act, slot))
        kinds.setdefault("token" if t is None else rows.token_kind(t), []).append(slot)
    for kind, slots in kinds.items():
        key, title = OUTSIDE_TOKENS[kind]
        findings.append(Finding("outside", key, title, facts={"which": which, "slots": slots[:8]}))
    if (out & ~guard & ~in_slot).any():
        findings.append(Finding("outside", "outside:gaps", "changes bytes between the cache view's elements",
                                facts={"which": which}))
    return findings


def _recipes_matching(rows: _Rows, slots: list[int], mask: torch.Tensor, held: str) -> list[str]:
    """The other recipes whose bytes equal the actual ones at every masked position of these slots."""
    toks = [rows.writers[s][-1] for s in slots]
    actual = torch.stack([rows.row(rows.act, s) for s in slots])
    return [r for r in RECIPES if r != held and bool((rows.q(r)[toks] == actual)[mask].all())]


def _rounded_scale(value: float, dtype: torch.dtype) -> float:
    return torch.tensor(value, dtype=torch.float32).to(dtype).float().item()


#: The widest tolerance of a "unit scale" fast path modelled: |s - 1| <= 2**-7 taken for 1 (a bf16-rounded 1.0, an
#: allclose); only at such a scale is scale:near-one-ignored a model, so that a call at other scales never refutes it.
NEAR_ONE = 2.0**-7


def _scale_variant_values(rows: _Rows) -> dict[str, float]:
    """The scale each scale variant uses in place of the cache's own: None, the other cache's, 1/s, and the
    scale held in bf16 or fp16 (a writer that stores its scale narrower than the reader's fp32)."""
    own = _scale_value(rows.scale)
    near_one = own != 1.0 and abs(own - 1.0) <= NEAR_ONE
    variants = [(1.0, "scale:ignored"), (1.0 if near_one else None, "scale:near-one-ignored"),
                (_scale_value(rows.other), "scale:swapped"),
                (1.0 / own if 0 < own < float("inf") else None, "scale:inverted"),
                (_rounded_scale(own, torch.float16), "scale:held-float16"),
                (_rounded_scale(own, torch.bfloat16), "scale:held-bfloat16")]
    # A held scale may underflow to 0 or overflow to inf (fp16's range): x / 0 is what such a writer computes.
    return {key: value for value, key in variants if value is not None and value != own
            and (0 < value < float("inf") or (key.startswith("scale:held-") and value == value))}


def _scale_variants(rows: _Rows, slots: list[int], mask: torch.Tensor, held: str) -> list[str]:
    """The keys of the scale variants (None, the other cache's scale, 1/s) under which the held
    recipe's bytes equal the actual ones at every masked position."""
    toks = [rows.writers[s][-1] for s in slots]
    actual = torch.stack([rows.row(rows.act, s) for s in slots])
    return [key for key, value in _scale_variant_values(rows).items()
            if bool((rows.q(held, value)[toks] == actual)[mask].all())]


def _predicts(rows: _Rows, explanation: str, held: str, elements: int) -> bool:
    """Whether an explanation (rounding:R, or a scale variant of the held recipe) gives the actual bytes
    of the first `elements` inputs (in token order) that land in a slot of their own, but for the signs
    of NaN and zero and the overflow rule (defects of their own). An arithmetic is judged by its finite
    bytes: torch 2.11's 0-d tensor division on CUDA, say, is unfused-tensor0d's arithmetic with NaN past
    the range, which no recipe of the table has (the H200 report of examples/sglang_unfused.py)."""
    variants = _scale_variant_values(rows)
    if explanation.startswith("rounding:"):
        predicted = rows.q(explanation.split(":", 1)[1])
    elif explanation in variants:
        predicted = rows.q(held, variants[explanation])
    else:
        return True  # nothing to predict with: keep it
    per_token = predicted[0].numel() if predicted.shape[0] else 1
    slot_of = {toks[0]: s for s, toks in rows.writers.items() if len(toks) == 1}
    said, written = [], []
    for i in range(elements):
        t, j = divmod(i, per_token)
        if t in slot_of:
            said.append(predicted[t].flatten()[j])
            written.append(rows.row(rows.act, slot_of[t]).flatten()[j])
    return not said or _signs_only(torch.stack(said), torch.stack(written), overflow_rule=True)


def explanation_title(key: str, which: str, held: str) -> str:
    """The title of a rounding or scale finding, by its explanation key."""
    name = "k_scale" if which == "k_cache" else "v_scale"
    if key == "rounding:unrounded":
        return f"does not round {held}'s quotient or product to fp32 before the fp8 rounding"
    if key.startswith("rounding:"):
        return f"computes {key.split(':', 1)[1]} where {held} is asked"
    return {"scale:ignored": f"ignores a scale: writes {which} as if {name} were None",
            "scale:near-one-ignored": f"takes {name} near 1 for 1 and skips it (a unit-scale fast path with a "
                                      "tolerance)",
            "scale:swapped": f"writes {which} with the other cache's scale",
            "scale:inverted": f"multiplies {which} by {name} instead of dividing by it",
            "scale:held-float16": f"holds {name} in float16 (rounds it before using it)",
            "scale:held-bfloat16": f"holds {name} in bfloat16 (rounds it before using it)"}.get(
                key, f"writes {which} with another scale ({key})")


def _encoding(e: torch.Tensor, a: torch.Tensor) -> list[Finding]:
    """Findings for overflow and NaN bytes (e, a: expected and actual bytes at those positions)."""
    findings = []
    nan_e = (e & 0x7F) == 0x7F
    nan_a = (a & 0x7F) == 0x7F
    sat_e, sat_a = (e & 0x7F) == 0x7E, (a & 0x7F) == 0x7E
    if (nan_e & sat_a).any():
        findings.append(Finding("encoding", "encoding:saturates", "saturates to ±448 where the recipe gives NaN"))
    if (sat_e & nan_a).any():
        findings.append(Finding("encoding", "encoding:nan-past-448", "gives NaN past ±448 where the recipe saturates"))
    if (nan_a & ~nan_e & ~sat_e).any():
        findings.append(Finding("encoding", "encoding:nan-produced", "writes NaN where the recipe gives a finite byte"))
    if (nan_e & ~nan_a & ~sat_a).any():
        findings.append(Finding("encoding", "encoding:nan-lost", "writes a finite byte where the recipe gives NaN"))
    if (sat_e & sat_a & (((e ^ a) & 0x80) != 0)).any():
        findings.append(Finding("encoding", "encoding:overflow-sign", "saturates with the wrong sign (±448 of the "
                                "other sign)"))
    return findings


def _sign_pairs(e: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the bytes e and a are both NaN, and where both are zero: they can differ only in sign."""
    return ((e & 0x7F) == 0x7F) & ((a & 0x7F) == 0x7F), ((e & 0x7F) == 0) & ((a & 0x7F) == 0)


def _signs_only(e: torch.Tensor, a: torch.Tensor, overflow_rule: bool = False) -> bool:
    """Whether the bytes e and a differ only where both are NaN, or both are zero (in sign); with
    overflow_rule, also where ±448 stands against NaN past the range. Each is an encoding finding of
    its own, never a rounding or scale one."""
    nan, zero = _sign_pairs(e, a)
    alike = nan | zero
    if overflow_rule:
        edge = ((e & 0x7F) >= 0x7E) & ((a & 0x7F) >= 0x7E)  # ±448 or NaN on both sides
        alike |= edge & ((((e ^ a) & 0x80) == 0) | ((e & 0x7F) == 0x7F) | ((a & 0x7F) == 0x7F))
    return not bool(((e != a) & ~alike).any())


def _written(rows: _Rows, diff: torch.Tensor, held: str) -> list[Finding]:
    """Findings for the written slots whose bytes differ."""
    case, which = rows.case, rows.which
    bad = [s for s in sorted(rows.writers) if diff[rows.index[s]].any()]
    findings: list[Finding] = []
    value_slots: list[int] = []
    elsewhere: list[tuple[int, Finding]] = []  # rows that equal another token's (or a pad's) row
    for s in bad:
        toks = rows.writers[s]
        act, exp, old = rows.row(rows.act, s), rows.row(rows.exp, s), rows.row(rows.before, s)
        kept = (act == old)[act != exp]
        if (torch.equal(act, old) or kept.numel() > 1) and bool(kept.all()):
            # Every differing byte kept its old value: the slot, or part of it (heads or dims past a tile), was
            # not written. Its old bytes are no value, sign or overflow rule's, whatever they happen to read as.
            # (One byte alone is no evidence: a seeded old byte is 0x00 one time in 256, as a flushed value is.)
            findings.append(Finding("wrong-slot", "wrong-slot:unwritten", "leaves a slot that a token names unwritten",
                                    facts={"which": which, "slots": [s]}))
            continue
        if len(toks) > 1:  # which of the tokens wins a shared slot is unspecified: nothing to say by value
            continue
        if not any(torch.equal(rows.q(r)[toks[0]], act) for r in RECIPES) and not _signs_only(exp, act):
            # A row that differs only in signs of NaN or zero is a value defect, even when another token's
            # row happens to equal it (negative overflow is 0xFF under unfused-nan, as a NaN kept negative).
            t = rows.whose(act, exclude=toks)
            if t is not None:
                kind = rows.token_kind(t)
                if kind == "token":
                    elsewhere.append((s, Finding("wrong-slot", "wrong-slot:other-token",
                                                 "writes a token's bytes to another token's slot",
                                                 facts={"which": which, "slots": [s]})))
                else:
                    key, title = OUTSIDE_TOKENS[kind]
                    elsewhere.append((s, Finding("outside", key, title, facts={"which": which, "slots": [s]})))
                continue
        value_slots.append(s)
    if elsewhere:
        # A short row can equal another token's by chance. When one recipe or scale variant explains
        # these rows from their own tokens together with the other wrong rows, they are that value defect.
        together = value_slots + [s for s, _ in elsewhere]
        e = torch.stack([rows.row(rows.exp, s) for s in together])
        a = torch.stack([rows.row(rows.act, s) for s in together])
        if _recipes_matching(rows, together, e != a, held) or _scale_variants(rows, together, e != a, held):
            value_slots = together
        else:
            findings += [f for _, f in elsewhere]
    if not value_slots:
        return findings
    e = torch.stack([rows.row(rows.exp, s) for s in value_slots])
    a = torch.stack([rows.row(rows.act, s) for s in value_slots])
    differ = e != a
    both_nan, both_zero = _sign_pairs(e, a)
    nan_sign, zero = differ & both_nan, differ & both_zero
    rest = differ & ~nan_sign & ~zero
    kind = (case.k_scale if which == "k_cache" else case.v_scale).kind
    where = {"which": which, "scale_kind": kind, "held": held}
    if nan_sign.any():
        keeps = bool(((e == 0x7F) & (a == 0xFF))[nan_sign].any())
        findings.append(Finding("encoding", "encoding:nan-sign",
                                "keeps the sign of a negative NaN (0xFF where every recipe writes 0x7F)" if keeps
                                else "writes a NaN byte with the wrong sign", facts=dict(where)))
    if zero.any():
        minus = bool(((e == 0x00) & (a == 0x80))[zero].any())
        findings.append(Finding("zero-sign", "zero-sign:" + ("minus" if minus else "plus"),
                                "writes -0 (0x80) for +0" if minus
                                else "writes +0 (0x00) for -0 (drops the sign of zero)", facts=dict(where)))
    if not rest.any():
        return findings
    recipes = _recipes_matching(rows, value_slots, rest, held)
    scales = _scale_variants(rows, value_slots, rest, held)
    if recipes or scales:  # every explanation is kept: the report picks, over the run, the one that explains most
        explanations = [f"rounding:{r}" for r in recipes] + scales
        cls = "rounding" if recipes else "scale"
        other_kind = (case.v_scale if which == "k_cache" else case.k_scale).kind
        title = explanation_title(explanations[0], which, held)
        findings.append(Finding(cls, "rounding" if recipes else scales[0], title,
                                facts={**where, "recipes": recipes, "explanations": explanations,
                                       "other_kind": other_kind}))
        return findings
    edge = rest & torch.isin(e, torch.tensor(EDGE_BYTES, dtype=e.dtype)) & torch.isin(a, torch.tensor(EDGE_BYTES,
                                                                                                     dtype=a.dtype))
    nan_any = rest & (((e & 0x7F) == 0x7F) | ((a & 0x7F) == 0x7F))
    findings += [f for f in _encoding(e[edge | nan_any], a[edge | nan_any])]
    for f in findings:
        f.facts = {**where, **f.facts}
    other = rest & ~edge & ~nan_any
    if other.any():
        findings.append(Finding("wrong-bytes", "wrong-bytes:values",
                                f"writes values that no recipe and no scale explains ({int(other.sum())} bytes)",
                                facts=dict(where)))
    return findings


def _inputs_modified(before: dict[str, torch.Tensor], actual: Built) -> list[Finding]:
    findings = []
    for name, old in before.items():
        if name in CACHES:
            continue
        new = actual.buffers[name]
        if not torch.equal(old.reshape(-1).view(torch.uint8).cpu(), new.reshape(-1).view(torch.uint8).cpu()):
            findings.append(Finding("input-modified", f"input-modified:{name}", f"modifies its input {name}",
                                    replayable=False))
    return findings


def classify_result(case: Case, expected: Built, actual: Built, error: str | None,
                    before: dict[str, torch.Tensor]) -> list[Finding]:
    """Findings for one call: `expected` from the reference, `actual` from the implementation on a
    build whose buffers were `before`; `error` the implementation's (describe_error), if it raised."""
    if error:
        return [raised(error)]
    findings = _inputs_modified(before, actual)
    for which in CACHES:
        exp, act = expected.buffers[which].cpu(), actual.buffers[which].cpu()
        if torch.equal(exp, act):
            continue
        rows = _Rows(case, which, expected, actual, before)
        diff = exp != act
        written = written_mask(case, which)
        findings += _outside(rows, diff, written)
        findings += _written(rows, diff & written, case.recipe)
    return dedupe(findings)


def dedupe(findings: list[Finding]) -> list[Finding]:
    seen: dict[str, Finding] = {}
    for f in findings:
        seen.setdefault(f"{f.key}:{','.join(f.facts.get('explanations', []))}", f)
    return list(seen.values())


def run_case(case: Case, impl: Implementation, device: torch.device,
             fill=None) -> tuple[Built, Built, str | None, dict[str, torch.Tensor], str | None]:
    """Reference and implementation on fresh builds (as tools.repro does); returns (expected, actual,
    error, actual's buffers before the call, the report tools.repro would print). `fill` edits a
    fresh Built before it runs (the exhaustive patterns)."""
    from conformance.bytediff import compare_caches
    fill = fill or (lambda b: b)
    expected = run_reference(case, device, fill(build(case, device)))
    actual = fill(build(case, device))
    before = actual.snapshot()
    actual, error = run_impl(case, impl, device, actual)
    report = error or compare_caches(expected, actual)
    return expected, actual, error, before, report


def classify_case(case: Case, impl: Implementation, device: torch.device, fill=None) -> list[Finding]:
    """Replay the Case and classify what differs (nothing: [])."""
    if impl.convention.why_not(case):
        return []
    expected, actual, error, before, _ = run_case(case, impl, device, fill)
    findings = classify_result(case, expected, actual, error, before)
    if fill is None:
        narrow(case, impl, device, findings)
    return findings


#: Ordinary values written over a Case's first inputs when its own bytes cannot tell explanations
#: apart: the builder scales inputs to the scale, so a tiny scale draws only zeros, and zero reads the
#: same divided by the scale, multiplied by it or left alone.
PLAIN_VALUES = (1.0, -2.5, 0.375, 96.0, -0.007, 3000.0)


def _plain_overrides(case: Case) -> tuple[Override, ...]:
    dtype = case.input_dtype
    bits = [to_bits(round_to(x, FORMATS[dtype]), dtype) for x in PLAIN_VALUES]
    n = case.num_tokens * case.num_heads * case.head_dim
    return tuple(Override(t, i, b, "plain") for t in ("k", "v") for i, b in enumerate(bits) if i < n)


def narrow(case: Case, impl: Implementation, device: torch.device, findings: list[Finding]) -> None:
    """Keep, of each value finding's explanations (recipes, scale variants), those that also give the
    bytes of a replay of the Case with plain values over its first inputs (PLAIN_VALUES), whether or
    not that replay differs from the reference."""
    ambiguous = [f for f in findings if len(f.facts.get("explanations", ())) > 1]
    if not ambiguous or not case.num_tokens:
        return
    variant = case.replace(overrides=case.overrides + _plain_overrides(case))
    try:
        expected, actual, error, before, _ = run_case(variant, impl, device)
    except Exception:  # the reference refused the variant: keep what the Case itself says
        return
    if error:
        return
    for f in ambiguous:
        rows = _Rows(variant, f.facts["which"], expected, actual, before)
        kept = [e for e in f.facts["explanations"] if _predicts(rows, e, case.recipe, len(PLAIN_VALUES))]
        if not kept:  # each was a coincidence of this Case's values (a tiny scale's zeros, say)
            ruled_out = ", ".join(f.facts["explanations"])
            f.facts.update(explanations=[], recipes=[], ruled_out=f.facts["explanations"])
            f.cls, f.key = "wrong-bytes", "wrong-bytes:values"
            f.title = (f"writes values that no recipe and no scale explains (a replay with plain values rules "
                       f"out {ruled_out})")
        elif len(kept) < len(f.facts["explanations"]):
            recipes = [e.split(":", 1)[1] for e in kept if e.startswith("rounding:")]
            f.facts.update(explanations=kept, recipes=recipes)
            f.cls, f.key = ("rounding", "rounding") if recipes else ("scale", kept[0])
            f.title = explanation_title(kept[0], f.facts["which"], case.recipe)


# -- failures read from the suite ------------------------------------------------------------------

def _lines_fallback(text: str) -> list[Finding]:
    """Classify from a report's byte lines alone ('expected 0xEE (..) actual 0xAA (..) at REGION ...')."""
    findings: list[Finding] = []
    pairs = re.findall(r"expected 0x([0-9A-F]{2}) \([^)]*\) actual 0x([0-9A-F]{2}) \([^)]*\) at (\S+)(.*)", text)
    if not pairs:
        return findings
    outside = [p for p in pairs if p[2] != "view" or "no token writes this slot" in p[3]]
    if any(p[2].startswith("guard") for p in outside):
        findings.append(Finding("outside", "outside:beyond", "writes beyond the cache view (into the bytes around it)"))
    if any(not p[2].startswith("guard") for p in outside):
        findings.append(Finding("outside", "outside:slots", "changes bytes of slots no token names"))
    inside = [(int(e, 16), int(a, 16)) for e, a, region, rest in pairs if (e, a, region, rest) not in outside]
    if inside:
        e = torch.tensor([p[0] for p in inside], dtype=torch.uint8)
        a = torch.tensor([p[1] for p in inside], dtype=torch.uint8)
        nan_sign, zero = _sign_pairs(e, a)  # the pairs differ already
        if nan_sign.any():
            findings.append(Finding("encoding", "encoding:nan-sign",
                                    "keeps the sign of a negative NaN (0xFF where every recipe writes 0x7F)"))
        if zero.any():
            findings.append(Finding("zero-sign", "zero-sign:plus", "writes +0 (0x00) for -0 (drops the sign of zero)"))
        rest = ~nan_sign & ~zero
        findings += _encoding(e[rest], a[rest])
        if not findings:
            findings.append(Finding("wrong-bytes", "wrong-bytes:values", "writes wrong bytes"))
    return findings


def _what(message: str) -> str:
    """The ConformanceFailure's first line without the implementation's name."""
    first = message.split("\n", 1)[0]
    return first.split(": ", 1)[1] if ": " in first else first


#: Graph defects read from a failure's text: each is kept only where the same experiment fails again.
RERUN_GRAPH = ("graph:capture", "graph:sync", "graph:warns", "graph:float-scale")


def _graph_on_plain(found: Finding, message: str, impl: Implementation | None,
                    device: torch.device | None) -> Finding:
    """A graph defect is keyed `@plain` when a capture of the plain call fails too (an experiment, as
    every other trigger); otherwise its key names no trigger (the graph properties are not ablated).
    A capture, sync, warning or float-scale failure is first run again on its own Case: one that passes
    then (a capture the card's memory, held by other processes, broke) is not reproduced, not a defect."""
    case = named_case(message)
    if case is not None:  # the report attributes an untriggered graph defect by it (report._attribute_graph)
        found.facts = {**found.facts, "case": case.to_dict()}
    if impl is None or device is None or case is None or device.type != "cuda":
        return found
    from conformance.diagnosis.ablation import words
    from conformance.diagnosis.diagnose import Diagnoser
    diagnoser = Diagnoser(impl, device)
    if found.key in RERUN_GRAPH:
        again = _graph_again(found.key, message, case, diagnoser)
        if again is not True:
            return not_reproduced(found, message, again)
    if diagnoser.captured_fails(diagnoser.plain_of(case)):
        found.key, found.title = f"{found.key}@plain", f"{found.title}, on the plain call"
    elif found.key in ("graph:stale", "graph:float-scale"):
        # stale: wrong bytes that eager calls of this Case did not show; float-scale: keyed by a trigger only
        # where the plain call passes the experiment (what else fails it is a symptom of that trigger's defect)
        run = _float_scale_run(message, case)
        trigger = sorted(diagnoser.graph_trigger(case) if found.key == "graph:stale"
                         else diagnoser.float_scale_trigger(*run) if run else [])
        if trigger:
            found.key, found.title = f"{found.key}@{'+'.join(trigger)}", f"{found.title}, {words(trigger)}"
    return found


def not_reproduced(found: Finding, message: str, again: bool | None) -> Finding:
    """A graph failure its experiment did not repeat: the GPU's memory ran out during the repeat (None), or it
    passed (False): no defect is established either way."""
    if again is None:
        return starved(message)
    return Finding("unclassified", "unclassified:no-repro", f"does not reproduce on replay: {found.title}",
                   replayable=False, facts=found.facts)


def _graph_again(key: str, message: str, case: Case, diagnoser) -> bool | None:
    """Whether the graph experiment that failed fails again (None: it could not tell, the GPU being full):
    the float-scale one on the Case it captured, with its factor; the others, a capture of the Case."""
    if key == "graph:float-scale":
        run = _float_scale_run(message, case)
        return True if run is None else diagnoser.float_scale_fails(*run)  # None: nothing to run, the text stands
    return diagnoser.captured_fails(case)


def _float_scale_run(message: str, case: Case) -> tuple[Case, float] | None:
    """The Case a float-scale experiment captured and its factor, read from the failure's text: an eager
    call's failure names the captured Case `captured:`; a replay's names it inline."""
    factor = re.search(r"with scale x([\d.]+)", message)
    captured = case_in(message, "captured") if "captured: {" in message else case
    return None if factor is None or captured is None else (captured, float(factor.group(1)))


def _graph(what: str, message: str) -> Finding:
    if "failed under CUDA-graph capture" in what:
        m = re.search(r"\n(\w+): (.*)", message)
        detail = f" ({m.group(1)}: {normalize(m.group(2), 100)})" if m else ""
        return Finding("graph", "graph:capture", "CUDA-graph capture fails" + detail, replayable=False)
    if "synchronizes with the host" in what:
        return Finding("graph", "graph:sync", "synchronizes with the host during the call (cannot be captured)",
                       replayable=False)
    if "warned under CUDA-graph capture" in what:
        return Finding("graph", "graph:warns", "warns under CUDA-graph capture", replayable=False)
    if "wrote nothing" in message:
        return Finding("graph", "graph:empty", "a replay of the captured graph writes nothing", cell="wrong bytes",
                       replayable=False)
    if "eager call with scale" in what or "keep its float" in what:
        return Finding("graph", "graph:float-scale", "a float scale is not captured as a constant",
                       cell="wrong bytes", replayable=False)
    return Finding("graph", "graph:stale", "a replay is stale: it does not follow the captured buffers' new contents",
                   cell="wrong bytes", replayable=False)


def _exhaustive_case(params: dict[str, Any], impl: Implementation, message: str = ""):
    """The exhaustive property's Case (and its pattern fill): the one its report saved (or, in older
    reports, printed as "case: {json}"), else the one the test's parameters make (the tests that loop
    over scales have no scale parameter)."""
    from conformance import test_exhaustive as ex
    named = named_case(message)
    if named is not None:
        return named, ex.fill_patterns
    scales = params.get("scales")
    if not isinstance(scales, tuple) or len(scales) != 2 or "dtype" not in params or "recipe" not in params:
        return None, None
    return impl.fit(ex.pattern_case(params["dtype"], *scales, params["recipe"])), ex.fill_patterns


def _bigcache_case(test: str, params: dict[str, Any], impl: Implementation | None) -> Case | None:
    """The Case a big-cache test ran, from its parameters (those tests save none: 4 buffers of 2 GiB)."""
    from conformance import test_bigcache as big
    if impl is None:
        return None
    if test == "test_cache_past_2_31_bytes" and {"cache_dtype", "loc_dtype"} <= set(params):
        return impl.fit(big._big_case(params["cache_dtype"], params["loc_dtype"], 4, "unfused"))
    if test == "test_flat_cache_past_2_31_bytes":
        return impl.fit(big._big_case("float8_e4m3fn", "int32", 3, "single"))
    if test == "test_input_rows_past_2_31_elements":  # its small twin: K's rows spread by a stride that fits
        return big._input_rows_case(impl, small=True)
    return None


def _load(path: str) -> Case | None:
    from conformance.artifacts import load_case
    try:
        return load_case(path)[0]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _equivalence_variants(test: str, case: Case) -> list[Case]:
    """The saved Case (the B side) and the A side each equivalence property compared it with."""
    from conformance.test_equivalence import CONTIGUOUS
    other = {"test_2d_and_3d_inputs_agree": dict(input_rank=2), "test_3d_and_4d_caches_agree": dict(cache_rank=3),
             "test_fp8_and_uint8_caches_agree": dict(cache_dtype="float8_e4m3fn"),
             "test_int32_and_int64_cache_loc_agree": dict(loc_dtype="int32"),
             "test_contiguous_and_strided_agree": CONTIGUOUS}.get(test)
    return [case] + ([case.replace(**other)] if other else [])


def unique_slots(case: Case) -> Case:
    """The Case with each repeated in-range slot after its first token moved to a new slot past the
    end (pages are added): the same values, every token written, no slot shared."""
    seen: set[int] = set()
    locs, fresh = [], case.num_slots
    for s in case.cache_loc:
        if 0 <= s < case.num_slots and s in seen:
            s, fresh = fresh, fresh + 1
        seen.add(s)
        locs.append(s)
    pages = max(case.num_pages, -(-fresh // case.page_size))
    return case.replace(cache_loc=tuple(locs), num_pages=pages)


def _with_case(findings: list[Finding], path: str | None, case: Case | None, replayable: bool = True) -> list[Finding]:
    for f in findings:
        if f.case_file is None and path and case is not None:
            f.case_file, f.case_size = path, case_size(case)
        elif f.facts.get("minimal") and f.case_file:
            continue  # a diagnosed defect's own minimal variant: its file replays it
        f.replayable = f.replayable and replayable
    return findings


UNREPEATABLE = ("gives other bytes for the same example when Hypothesis runs it again (its bytes depend on earlier "
                "calls, on where its tensors lie, or on a race)")


def classify_failure(exc: BaseException, test: str, module: str, params: dict[str, Any],
                     impl: Implementation | None, device: torch.device | None,
                     unrepeatable: bool = False) -> list[Finding]:
    """Findings for one exception a property test raised (a leaf of Hypothesis's group). `unrepeatable`: the
    leaf of a FlakyFailure (the example failed, then passed when run again: its Case is no evidence of a cause,
    the failing run was the implementation's, as the suite's tensors come from seeds)."""
    message = str(exc)
    excerpt = excerpt_of(message)
    if unrepeatable and out_of_memory(f"{type(exc).__name__}: {message}"):  # the card was full, then was not
        return [starved(message)]
    if unrepeatable and any(c.__name__ == "ConformanceFailure" for c in type(exc).__mro__):
        return [Finding("state", "state:unrepeatable", UNREPEATABLE, replayable=False, excerpt=excerpt)]
    attached = getattr(exc, "kvfp8_findings", None)
    if attached is not None:
        found = [Finding.from_dict(f) if isinstance(f, dict) else f for f in attached]
        path = next((f.case_file for f in found if f.case_file), None)
        case = _load(path) if path else None
        diagnosed = diagnosed_findings(case, impl, device) if case is not None else []
        for f in diagnosed:
            f.excerpt = f.excerpt or excerpt
        if case is not None and not diagnosed and impl is not None and device is not None:
            # The Case passes on replay (on a GPU, which of several racing writes lands differs between
            # calls): the probe's byte classes are one failure no replay explains, not a defect each.
            titles = "; ".join(dict.fromkeys(f.title for f in found))
            return [Finding("unclassified", "unclassified:no-repro", f"does not reproduce on replay: {titles}",
                            cell=found[0].cell if found else "", replayable=False, excerpt=excerpt,
                            case_file=path, case_size=case_size(case))]
        return diagnosed or found
    findings = _classify(exc, message, test, module, params, impl, device)
    for f in findings:
        f.excerpt = f.excerpt or excerpt
    return findings


def case_in(message: str, label: str = "case") -> Case | None:
    """The Case a report names as "case: {json}" (graph and exhaustive reports; another label: "captured",
    the Case a float-scale experiment captured), if it can be read."""
    start = message.find(f"{label}: {{")
    if start < 0:
        return None
    try:
        return Case.from_dict(json.JSONDecoder().raw_decode(message[start + len(label) + 2:])[0])
    except (ValueError, KeyError, TypeError):  # a report cut short, or a Case this version cannot read
        return None


def named_case(message: str) -> Case | None:
    """The Case a report names: inline ("case: {json}"), or as its saved failure file."""
    saved = SAVED.search(message)
    return case_in(message) or (_load(saved.group(1)) if saved else None)


def diagnosed_findings(case: Case, impl: Implementation | None, device: torch.device | None,
                       fill=None) -> list[Finding]:
    """The Case's defects by experiment (conformance.diagnosis.diagnose); [] when it passes on replay."""
    if impl is None or device is None:
        return []
    from conformance.diagnosis.diagnose import Diagnoser
    return Diagnoser(impl, device, fill).diagnose(case)


def _eager_findings(message: str, impl: Implementation | None, device: torch.device | None) -> list[Finding]:
    """The eager call's defects on the Case a graph report names ("case: {json}", or its saved failure
    file: a capture that raised, an eager call between captures), if any."""
    case = named_case(message)
    if impl is None or device is None or case is None:
        return []
    try:
        found = diagnosed_findings(case, impl, device)
    except Exception as exc:  # the replay itself failed: classify by the text, unless the card was full
        error = f"{type(exc).__name__}: {exc}"
        return [starved(error)] if out_of_memory(error) else []
    for f in found:
        f.replayable = False
    return found


def _saved_pth_case(path: str):
    """The PTHCase a per-token-head failure file holds (tools.repro replays it); None where it cannot be read."""
    from conformance.artifacts import load_case
    from strategies.per_token_head import PTHCase
    try:
        return PTHCase.from_dict(load_case(path)[1]["pth_case"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _is_scale_place(line: str) -> bool:
    return "stored scale" in line or "inline scale byte" in line


def _scales_misplaced(places: list[str]) -> bool:
    """Wrong bytes that are all scale bytes (a written token's, or a slot's no token writes) or outside the
    view, with a written token's scale among them: the scales stored at the wrong place, one cause (held-out
    batch 57: a scale cache's strides in another order, a block term dropped, the inline scale at the row's
    end), not wrong scales and writes outside as two."""
    written = [line for line in places if "outside the view" not in line]
    stray = [line for line in places if "outside the view" in line or "no token writes it" in line]
    if stray and all(line.lstrip().startswith(("k_scale_cache", "v_scale_cache")) for line in stray):
        return True  # only a scale store reaches a separate scale cache (wrong data beside them: another cause)
    return (any(_is_scale_place(line) and "token=" in line for line in written) and bool(stray)
            and all(_is_scale_place(line) for line in written))


def _per_token_head(message: str) -> Finding:
    """A per-token-head write's wrong bytes, by where conformance/pth_bytediff.py located them: outside the
    written slots, only in the stored scales, or in the data bytes."""
    places = [line for line in message.splitlines() if " expected 0x" in line]
    if "writes with no slot in range" not in message and _scales_misplaced(places):
        return Finding("per-token-head", "per-token-head:scales-misplaced", "with dynamic per-(token, head) scales, "
                       "stores its scales in the wrong place (the data bytes are right; scale bytes land in slots no "
                       "token writes, or outside the view)", replayable=False)
    # a call whose every slot is padding or out of range: any byte it changes is outside the written slots
    if "writes with no slot in range" in message or any("no token writes it" in line or "outside the view" in line
                                                        for line in places):
        return Finding("per-token-head", "per-token-head:writes-outside", "with dynamic per-(token, head) scales, "
                       "writes where no token's slot is", cell="writes outside", replayable=False)
    if places and all("stored scale" in line or "inline scale byte" in line for line in places):
        return Finding("per-token-head", "per-token-head:scales", "with dynamic per-(token, head) scales, stores "
                       "wrong scales (the data bytes are right)", replayable=False)
    return Finding("per-token-head", "per-token-head:values", "with dynamic per-(token, head) scales, writes wrong "
                   "bytes (no per-token-head recipe gives them)", replayable=False)


#: A test the GPU's memory stopped (other processes held it): the machine's, not a defect.
OUT_OF_MEMORY = "unclassified:out-of-memory"
#: What an allocation that found the card full says: torch's OutOfMemoryError, or the runtime's own error where a
#: context, a graph pool or a kernel's workspace could not be had (torch.AcceleratorError).
_FULL = re.compile(r"CUDA out of memory|CUDA error: out of memory|cudaErrorMemoryAllocation|OutOfMemoryError")
_ASKED = re.compile(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB|bytes)")
_CARD = re.compile(r"total capacity of ([\d.]+) GiB")
_UNITS = {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "bytes": 1}


def out_of_memory(text: str) -> bool:
    """Whether an error is the GPU's memory running out for an allocation the card could hold: other processes
    held it (reports run side by side), so the machine's and not the implementation's. An implementation that
    asks for more than the whole card is its own defect (a raise)."""
    if not _FULL.search(text):
        return False
    asked, card = _ASKED.search(text), _CARD.search(text)
    if asked and card:
        return float(asked.group(1)) * _UNITS[asked.group(2)] <= float(card.group(1)) * 2**30
    return True


def starved(message: str) -> Finding:
    """The finding of a test the GPU's memory stopped: no defect, and the report's verdict says incomplete."""
    return Finding("unclassified", OUT_OF_MEMORY, "not run to the end: the GPU ran out of memory (other processes "
                   f"held it); rerun with the GPU to itself: {normalize(message, 120)}", replayable=False)


def _classify(exc: BaseException, message: str, test: str, module: str, params: dict[str, Any],
              impl: Implementation | None, device: torch.device | None) -> list[Finding]:
    kind = type(exc).__name__
    conformance = any(c.__name__ == "ConformanceFailure" for c in type(exc).__mro__)
    what = _what(message)
    if out_of_memory(f"{kind}: {message}"):  # in any frame, the suite's or the implementation's
        return [starved(message)]
    # Hypothesis's own errors are never the implementation's exception, in any module
    if kind.startswith(("Flaky", "FailedHealthCheck", "Unsatisfiable", "DeadlineExceeded", "HypothesisException",
                        "InvalidArgument")):
        return [Finding("unclassified", f"unclassified:{kind}", f"Hypothesis: {kind}: {normalize(message, 100)}",
                        replayable=False)]
    refused_shape = module == "test_per_head" and test == "test_a_scale_of_another_shape_is_refused"
    alone = test == ALONE_TEST and module in ALONE_MUTATIONS  # a float8 cache of a format it does not read
    if module == "test_errors" or refused_shape or alone:
        mutation = (f"k_scale of shape {params.get('shape', '?')}" if refused_shape else ALONE_MUTATIONS[module]
                    if alone else params.get("mutation", "?"))
        if not conformance and kind == "Failed" and message.startswith("Timeout"):  # pytest-timeout, one process
            how, title = "crash", f"{mutation}: hangs on an invalid call ({normalize(message, 80)})"
        elif not conformance:
            how, title = "other-exception", f"{mutation}: raises {kind} ({normalize(message, 80)})"
        elif "does not validate" in what and alone:  # what it writes instead is the news
            how, title = "accepted", f"{mutation}: {what.split(': ', 1)[-1].rstrip(':')}"
        elif "does not validate" in what:
            how, title = "accepted", f"{mutation}: {what.split(':', 1)[0]}"
        elif "without naming it" in what:
            how, title = "unnamed", f"{mutation}: {what.rstrip(':')}"
        elif "before raising" in what:
            how, title = "writes", f"{mutation}: {what.rstrip(':')}"
        else:
            how, title = "wrong-error", f"{mutation}: {what.rstrip(':')}"
        cell = "crashes" if how == "crash" else ""
        facts = {"mutation": mutation}
        if how in ("unnamed", "wrong-error"):
            facts["error"] = error_line(message)
        elif how == "other-exception":
            facts["error"] = normalize(f"{kind}: {message}")
        return [Finding("validation", f"validation:{how}", title, cell=cell, replayable=False, facts=facts)]
    if module == "test_overlap" and conformance and "specific to the shared memory" in message:
        # The saved Case rebuilds separate buffers, where the implementation passes: the sharing is the defect
        # (a Case that fails on its own too goes the usual way below, replayed and classified by its bytes).
        raising = "raises on a valid call" in what
        exception = re.search(r" raised (\w+(?:\.\w+)*):", message)
        facts = {"exception": exception.group(1) if exception else ""} if raising else {}
        if "specific to k and v sharing memory" in message:  # the caches' sharing alone passes (test_overlap)
            cls = "raises" if raising else "wrong-bytes"
            return [Finding(cls, f"{cls}:inputs-shared", f"{'raises' if raising else 'writes wrong bytes'} when k "
                            "and v share memory (one tensor passed twice, or the halves of one buffer), and not "
                            "when they have buffers of their own", replayable=False, facts=facts)]
        if raising:
            return [Finding("raises", "raises:shared-memory", "raises when its caches share one buffer without "
                            "sharing a byte (an interleaved K/V pool, an arena)", replayable=False, facts=facts)]
        return [Finding("wrong-bytes", "wrong-bytes:shared-memory", "writes wrong bytes when its tensors share one "
                        "buffer without a cache sharing a byte", replayable=False)]
    if kind == "MemoryCorrupted":  # conformance.harness: an earlier call's stray write broke the reference's memory
        return [Finding("crash", "crash", "crashes the process: an earlier call wrote out of bounds, over memory "
                        "the suite's reference then read (an illegal address there)", replayable=False,
                        excerpt=normalize(what, 160))]
    if kind == "SuiteError":  # conformance.harness: the reference raised; never the implementation's defect
        return [Finding("unclassified", "unclassified:suite", f"a suite bug, not this implementation's: "
                        f"{normalize(what, 160)}", replayable=False)]
    if not conformance:
        if isinstance(exc, AssertionError) and not raised_by_implementation(exc):
            return [Finding("unclassified", "unclassified:assertion", f"a suite assertion failed: {normalize(message)}",
                            replayable=False)]
        if not raised_by_implementation(exc):  # raised in this suite's frames (a diagnosis bug): never a defect
            return [Finding("unclassified", "unclassified:suite", f"a suite bug, not this implementation's: {kind}: "
                            f"{normalize(message, 160)}", replayable=False)]
        return [Finding("raises", f"raises:{kind}: {normalize(message)}", f"raises {kind}: {normalize(message)}",
                        replayable=False, facts={"exception": kind})]
    if "raises on a valid call" in what and module in ("test_graphs", "test_bigcache"):
        # An eager call raised (a graph's warm-up or an eager call between replays; a big cache): its error.
        # A graph's saved Case is that eager call, replayed as every other property's (not a big cache's).
        m = SAVED.search(message)
        case = _load(m.group(1)) if m else None
        found = diagnosed_findings(case, impl, device) if module == "test_graphs" and case is not None else []
        found = [f for f in found if f.cls == "raises"] or [raised(message.split("\n", 1)[-1])]
        return _with_case(found, m.group(1) if m else None, case, replayable=module == "test_graphs")
    if module == "test_graphs":
        eager = _eager_findings(message, impl, device)  # a replay wrong the way an eager call is: not the graph
        return eager or [_graph_on_plain(_graph(what, message), message, impl, device)]
    if "modified its input" in what:
        name = what.split("modified its input ", 1)[1].split(" ", 1)[0]
        m = SAVED.search(message)
        case = _load(m.group(1)) if m else None
        found = diagnosed_findings(case, impl, device) if case is not None else []
        if found:  # the cause, by replay (an input written by a stray write is a symptom of it)
            return found
        return _with_case([Finding("input-modified", f"input-modified:{name}", f"modifies its input {name}",
                                   replayable=False)], m.group(1) if m else None, case, replayable=False)
    if impl is None or device is None:
        return _lines_fallback(message) or [Finding("unclassified", "unclassified:no-impl", normalize(what))]
    if module == "test_exhaustive" or test.endswith("_all_patterns"):  # the formats' exhaustive twins too
        case, fill = _exhaustive_case(params, impl, message)
        findings = diagnosed_findings(case, impl, device, fill) if case is not None else []
        findings = findings or _lines_fallback(message) or [Finding("wrong-bytes", "wrong-bytes:values",
                                                                    normalize(what))]
        m = SAVED.search(message)  # its failure file names the fill, so tools.repro replays it
        for f in _with_case(findings, m.group(1) if m else None, case, replayable=m is not None):
            f.case_size = f.case_size or (case_size(case) if case is not None else None)
        return findings
    if module == "test_bigcache":
        big = _bigcache_case(test, params, impl)
        if big is not None:
            from conformance.diagnosis.diagnose import Diagnoser
            what = "inputs above 2**31 elements" if test == "test_input_rows_past_2_31_elements" else \
                "caches above 2**31 bytes"
            found = Diagnoser(impl, device).big(big, what)
            for f in found:
                f.replayable = False
            return found
        found = _lines_fallback(message)
        cell = "writes outside" if any(f.cls == "outside" for f in found) else "wrong bytes"
        return [Finding("wrong-slot", "wrong-slot:past-2^31", "wrong bytes or slots on caches above 2**31 bytes "
                        "(offsets computed in 32 bits?)", cell=cell, replayable=False)]
    if module == "test_per_head" or "per_head_scales" in test:  # e5m2's and fnuz's per-head tests too: a Case
        # holds one scale a cache, so these are not replayed (not ablated); their per-tensor twin is: where it
        # fails too, the per-head scales are not the cause (padding that wraps fails with any scale)
        from conformance.test_per_head import UNLIKE_OWN
        if UNLIKE_OWN in message:  # measured against the implementation itself: its own arithmetic, any defect
            return [Finding("scale", "scale:per-head", "writes a head with a per-head ([H]) scale otherwise than "
                            "with that scale as its one per-tensor scale (the [H] scale read wrong)",
                            replayable=False)]
        twin = case_in(message)
        found = diagnosed_findings(twin, impl, device) if twin is not None else []
        if found:
            for f in found:
                f.replayable = False
                f.facts = {**f.facts, "symptom": "the same with per-head scales"}
            from conformance.diagnosis.per_head import beyond_twin
            return found + beyond_twin(twin, [f.key for f in found], message, impl, device)
        from conformance.diagnosis.per_head import (
            only_where_t_equals_h,
            per_head_cause,
            per_head_scales,
            raise_trigger,
        )
        scales = per_head_scales(message)
        runnable = twin is not None and scales and impl and device
        if "raises on a valid" in what:  # test_per_head's "valid call", e5m2's and fnuz's "valid e5m2 call"
            found = raised(message.split("\n", 1)[-1])
            trigger = raise_trigger(twin, *scales, impl, device) if runnable else []
            if trigger:
                from conformance.diagnosis.ablation import words
                found.key = f"raises:{found.facts['exception']}@{'+'.join(sorted(trigger))}"
                found.title = f"raises {found.facts['exception']} with per-head scales, {words(sorted(trigger))}"
            return [found]
        cause = per_head_cause(twin, *scales, impl, device) if runnable else None
        found = cause or Finding("scale", "scale:per-head", "writes wrong bytes with a per-head ([H]) scale",
                                 replayable=False)
        if runnable and only_where_t_equals_h(twin, *scales, impl, device):
            from conformance.diagnosis.ablation import BY_NAME
            found.key, found.title = f"{found.key}@tokens-equal-heads", f"{found.title}, " \
                                                                       f"{BY_NAME['tokens-equal-heads'].words}"
        elif runnable and "@" not in found.key:
            from conformance.diagnosis.per_head import per_head_size_rule, value_trigger
            rule = per_head_size_rule(twin, *scales, impl, device)
            if rule is not None:
                found.key, found.title = f"{found.key}@{rule.name}", f"{found.title}, {rule.words}"
            elif cause is None and (trigger := sorted(value_trigger(twin, *scales, impl, device))):
                from conformance.diagnosis.ablation import words  # no reading explains the bytes: where they go wrong
                found.key, found.title = f"{found.key}@{'+'.join(trigger)}", f"{found.title}, {words(trigger)}"
        return [found]
    if module == "test_per_token_head":  # its Cases are not replayed (not ablated): read by the located diff
        error = message.split("\n", 1)[-1]
        # every "raises on ..." of the family (a valid call, padding slots, a second call, all patterns)
        found = raised(error, TYPE_FIRST) if what.startswith("raises on ") else _per_token_head(message)
        saved = SAVED.search(message)  # its PTHCase, which tools.repro replays
        base = _load(saved.group(1)) if saved else None
        pc = _saved_pth_case(saved.group(1)) if base is not None and impl and device else None
        if pc is not None and found.key.startswith("raises:"):
            from conformance.diagnosis.pth_causes import pth_raise_rules
            rules = pth_raise_rules(pc, impl, device, error)
            if rules:  # grouped by what triggers it, not by its message
                found.key = f"raises:{found.facts['exception']}@{'+'.join(r.name for r in rules)}"
                found.title = f"raises {found.facts['exception']}, {', '.join(r.words for r in rules)}"
        elif pc is not None and found.key in ("per-token-head:values", "per-token-head:scales",
                                              "per-token-head:scales-misplaced", "per-token-head:writes-outside"):
            # the scale rule it follows where it is not the recipe's, and its rule on D
            from conformance.diagnosis.pth_causes import pth_cause, pth_size_rule, pth_unwritten
            cause = pth_cause(pc, impl, device)
            found = cause or pth_unwritten(pc, impl, device) or found
            rule = pth_size_rule(pc, impl, device, special=cause is not None)
            if rule is not None:
                found.key, found.title = f"{found.key}@{rule.name}", f"{found.title}, {rule.words}"
        if base is not None:
            found.case_file, found.case_size, found.replayable = saved.group(1), case_size(base), True
        return [found]
    m = SAVED.search(message)
    case = _load(m.group(1)) if m else None
    if case is None:
        return _lines_fallback(message) or [Finding("unclassified", "unclassified:no-case", normalize(what),
                                                    replayable=False)]
    path = m.group(1)
    if module == "test_equivalence":
        for variant in _equivalence_variants(test, case):
            found = diagnosed_findings(variant, impl, device)
            if found:
                return _with_case(found, path, case, replayable=variant == case)
        return _with_case([Finding("wrong-bytes", "wrong-bytes:inconsistent", f"{what.rstrip(':')} (each side "
                                   "alone matches the reference)")], path, case, replayable=False)
    if test == "test_duplicate_slots_hold_one_tokens_bytes":
        found = diagnosed_findings(unique_slots(case), impl, device)
        if found:
            return _with_case(found, path, case, replayable=False)
        return _with_case([Finding("wrong-slot", "wrong-slot:shared", "a slot named by several tokens holds a byte "
                                   "none of them writes")], path, case, replayable=False)
    found = diagnosed_findings(case, impl, device)
    if found:
        return _with_case(found, path, case)
    return _with_case(_lines_fallback(message) or [Finding("unclassified", "unclassified:no-repro",
                                                          f"does not reproduce on replay: {normalize(what)}")],
                      path, case, replayable=False)


def excerpt_of(text: str, lines: int = 14) -> str:
    """The first lines of a report, without the failure-file lines (the report names its own copy)."""
    kept = [ln for ln in text.splitlines() if not ln.startswith(("failure case saved:", "replay: python -m"))]
    return "\n".join(kept[:lines])


def saved_path(message: str) -> str | None:
    m = SAVED.search(message)
    return m.group(1) if m and Path(m.group(1)).exists() else None
