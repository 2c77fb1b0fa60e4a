"""The conformance report: a run's records (conformance.diagnosis.recorder) -> capability table and defects,
as JSON (the schema is in docs/conformance.md) and as markdown; and the diff of two reports.

A defect is one `Finding.key`, however many tests found it. Rounding findings list every recipe
that explains their bytes; each is assigned to the recipe that explains the most findings of the
run (a greedy cover), so an implementation that always computes `divide` has one rounding defect.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.cachemap import CACHES
from conformance.diagnosis.ablation import (
    BY_NAME,
    ROW_BYTES,
    SCALE_TENSOR,
    SIZE_RULES,
    SLOTS_UNSORTED,
    as_float_scales,
    row_bytes_words,
    words,
)
from conformance.diagnosis.capabilities import PROBE_TEST, InputClass
from conformance.diagnosis.classify import CLASS_TITLES, OUT_OF_MEMORY, Finding, error_line
from conformance.diagnosis.diagnose import (
    IMPLIED,
    VALUE_CLASSES,
    class_of,
    keyed_by_values,
    same_effect,
    trigger_of,
    trigger_set,
    value_dimension,
)
from conformance.diagnosis.effects import SUBNORMAL_ONLY
from conformance.diagnosis.fresh import Fresh
from kernel import RECIPES
from strategies.build import DTYPES
from strategies.case import Case

#: The run's findings by key: (nodeid, finding) pairs; one key, one defect of the report.
Groups = dict[str, list[tuple[str, Finding]]]

SCHEMA = "kvfp8-conformance-report/2"  # 2: keys are effect@trigger
#: How bad a cell is; a cell whose rank rises between two reports is a regression. Unranked: n/a, not run.
RANK = {"conforms": 0, "validates": 0, "does not validate": 1, "raises": 2, "wrong bytes": 3, "writes outside": 4,
        "crashes": 5}
#: Ties between explanations: the simpler one first.
PREFERENCE = ["scale:ignored", "scale:swapped", "scale:inverted"] + [f"rounding:{r}" for r in RECIPES]
GROUP_TITLES = {
    "validation:accepted": "accepts an invalid argument (the call does not raise)",
    "validation:other-exception": "rejects an invalid argument with an exception other than TypeError/ValueError",
    "validation:unnamed": "rejects an invalid argument without naming it",
    "validation:writes": "writes the cache before rejecting an invalid argument",
    "validation:wrong-error": "rejects an invalid argument with another error type or message than the contract's",
    "validation:crash": "crashes or hangs on an invalid argument (the process died, or the call never returned)",
    "scale:ignored": "ignores a scale: writes a cache as if its scale were None",
    "scale:swapped": "writes a cache with the other cache's scale",
    "scale:inverted": "multiplies by the scale instead of dividing by it",
    "scale:held-float16": "holds the scale in float16 (rounds it before using it)",
    "scale:held-bfloat16": "holds the scale in bfloat16 (rounds it before using it)",
    "state:earlier-calls": "writes bytes that depend on earlier calls: its failing calls are right when each is "
                           "the first call of a fresh process (state kept between calls, such as a memoized scale "
                           "or reciprocal; or a race)",
}


@dataclass
class Node:
    """One test of the run: its outcome, parameters, skip reason and findings."""

    nodeid: str
    outcome: str = "passed"  # passed | failed | skipped | crashed
    params: dict[str, Any] = field(default_factory=dict)
    skip: str = ""
    findings: list[Finding] = field(default_factory=list)
    text: str = ""
    diagnosis_seconds: float = 0.0  # classifying its failures (replays, ablations), in the test's process

    @property
    def module(self) -> str:
        return self.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")

    @property
    def test(self) -> str:
        return self.nodeid.split("::", 1)[-1].split("[", 1)[0]


def read_records(path: Path) -> list[dict[str, Any]]:
    """The record file's lines; a test reported without parameters (its worker crashed) gets them
    from the collected tests' parameters (recorder.params_file), so its capability row shows the crash."""
    from conformance.diagnosis.recorder import params_file
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut off when the run was stopped
            continue
    collected = params_file(path)
    params = json.loads(collected.read_text()) if collected.exists() else {}
    for r in records:
        if not r.get("params"):
            r["params"] = params.get(r["nodeid"], {})
    return records


def nodes_from(records: Iterable[dict[str, Any]], failures: Path | None = None) -> dict[str, Node]:
    """Combine each test's phases into one Node; crashes and unreadable failures get findings here."""
    nodes: dict[str, Node] = {}
    for r in records:
        node = nodes.setdefault(r["nodeid"], Node(r["nodeid"]))
        node.params = r.get("params") or node.params
        if r["outcome"] == "skipped" and node.outcome == "passed":
            node.outcome, node.skip = "skipped", r.get("skip", "")
        if r["outcome"] == "failed":
            node.outcome = "failed"
            for leaf in r.get("leaves", []):
                node.findings += [Finding.from_dict(f) for f in leaf.get("findings", [])]
                node.diagnosis_seconds += leaf.get("seconds", 0.0)
            text = r.get("longrepr", "")
            if text and not r.get("leaves"):
                node.text = text
                node.findings.append(_unread(node, text, failures))
                if node.findings[-1].cell == "crashes":
                    node.outcome = "crashed"
    return nodes


def _unread(node: Node, text: str, failures: Path | None) -> Finding:
    """A failure that reached the controller as text only: a crashed worker, or an error in a hook."""
    tail = "\n".join(text.strip().splitlines()[-14:])
    crashed = "crashed while running" in text or "node down" in text.lower()
    if crashed and node.module == "test_errors":
        # An invalid call that kills the process (or hangs until pytest-timeout kills it): the argument
        # contract's finding, naming the mutation (from the collected parameters), not a crash on valid input.
        mutation = node.params.get("mutation", "?")
        return Finding("validation", "validation:crash", f"{mutation}: an invalid call crashes or hangs the process "
                       "(an xdist worker died)", cell="crashes", replayable=False, excerpt=tail,
                       facts={"mutation": mutation})
    if crashed:
        finding = Finding("crash", "crash", "crashes the process (an xdist worker died: an illegal memory access "
                                            "loses the CUDA context, or a segfault)", excerpt=tail)
        for path in sorted(failures.glob("*.json")) if failures and failures.is_dir() else []:
            try:
                record = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if record.get("test") == node.nodeid:  # harness._abandon saved the case before the process ended
                case = record.get("case", {})
                finding.case_file = str(path)
                finding.case_size = case.get("num_tokens", 0) * case.get("num_heads", 0) * case.get("head_dim", 0)
        # A dead process answers no more questions: the trigger is what the crashed test varied, when it
        # varied one thing (a capability row, the big-cache family); else none is claimed.
        if node.module == "test_bigcache" and not any(f.cls == "crash" for f in node.findings):
            # (a big-cache test whose reference found memory an earlier call corrupted crashed for that call)
            finding.cls, finding.key = "big-cache", "big-cache:wrong-offsets@big-cache"
            finding.title = "crashes on caches above 2**31 bytes (offsets computed in 32 bits?)"
        elif node.nodeid.startswith(PROBE_TEST) and ROW_TRIGGERS.get(str(node.params.get("row"))):
            trigger = ROW_TRIGGERS[str(node.params["row"])]
            finding.key = f"crash@{trigger}"
            finding.title += f", {words(trigger.split('+'))}"
        return finding
    return Finding("unclassified", "unclassified:error", f"an error outside the test body: {_first(text)}",
                   replayable=False, excerpt=tail)


#: The dimension each capability row varies from the plain call, as diagnose's triggers name it.
ROW_TRIGGERS = {"not-pow2": "dim-not-pow2+heads-not-pow2", "input-2d": "input-2d", "cache-3d": "cache-3d",
                "cache-4d": "page-size", "cache-uint8": "cache-uint8", "loc-int32": "loc-int32",
                "input-fp32": "input-float32", "input-fp16": "input-float16", "padding": "padding",
                "out-of-range": "out-of-range",
                "strided-inputs": "strided-input+strided-loc", "strided-caches": "strided-cache",
                "special-values": "special-values", "empty": "empty-batch", "many-tokens": "many-tokens",
                "format-alias": "format-alias",
                **{f"{w}-{kind}": f"scale-kind:{kind}" for w in ("k_scale", "v_scale")
                   for kind in ("none", "float", "tensor0d")}}


def _first(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("E ")]
    return (errors[0][1:].strip() if errors else lines[-1] if lines else "")[:160]


def _greedy(todo: list[Finding], assigned: Counter) -> None:
    while todo:
        counts = Counter(e for f in todo for e in f.facts["explanations"])
        best = max(counts, key=lambda e: (counts[e], -PREFERENCE.index(e) if e in PREFERENCE else -99))
        for f in [f for f in todo if best in f.facts["explanations"]]:
            f.key, f.cls = best, class_of(best)
            assigned[best] += 1
            todo.remove(f)


def _cover(findings: list[Finding]) -> None:
    """Give each rounding or scale finding one of its explanations (`facts["explanations"]`).

    Findings explained by one class only (recipes, or scales) go first, greedily to the explanation
    that explains the most of them (ties: PREFERENCE). A finding that a recipe and a scale explain
    alike (a tiny scale writes zeros both ways) then joins the explanation already given to most
    findings, so it never decides the recipe. An implementation that always divides has one rounding
    defect; the recipes that no Case of the run told apart are named in the defect's detail.
    """
    todo = [f for f in findings if f.facts.get("explanations")]
    pure = [f for f in todo if len({class_of(e) for e in f.facts["explanations"]}) == 1]
    mixed = [f for f in todo if f not in pure]
    assigned: Counter = Counter()
    _greedy(pure, assigned)
    rest = []
    for f in mixed:
        known = [e for e in f.facts["explanations"] if assigned[e]]
        if known:
            best = max(known, key=lambda e: (assigned[e], -PREFERENCE.index(e) if e in PREFERENCE else -99))
            f.key, f.cls = best, class_of(best)
        else:
            rest.append(f)
    _greedy(rest, assigned)


def _indistinguishable(key: str, group: list[Finding]) -> list[str]:
    """The other explanations that every finding of the group also has."""
    sets = [set(f.facts.get("explanations", [])) for f in group]
    if not sets or not all(sets):
        return []
    return [e for e in PREFERENCE if e != key and all(e in s for s in sets)]


def _where(f: Finding) -> str:
    facts = f.facts
    parts = []
    if facts.get("which"):
        kind = facts.get("scale_kind")
        parts.append(facts["which"] + (f" with a {kind} scale" if kind else ""))
        if facts.get("other_kind") and f.cls == "scale":
            parts[-1] += f" (the other scale {facts['other_kind']})"
    if facts.get("mutation"):
        parts.append(str(facts["mutation"]))
    return ", ".join(parts)


@dataclass
class Defect:
    id: str
    key: str
    cls: str
    title: str
    cell: str
    tests: list[str]
    findings: list[Finding]
    detail: str = ""
    case: str | None = None
    case_size: int | None = None
    replay: str = ""
    excerpt: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "key": self.key, "effect": self.key.split("@", 1)[0], "trigger": trigger_of(self.key),
                "class": self.cls, "class_title": CLASS_TITLES.get(self.cls, self.cls),
                "title": self.title, "detail": self.detail, "cell": self.cell, "tests": self.tests,
                "count": len(self.tests), "case": self.case, "case_size": self.case_size, "replay": self.replay,
                "excerpt": self.excerpt}


def _title(key: str, group: list[Finding]) -> str:
    if "@" in key:  # diagnosed: the finding says effect and trigger in words
        own = [f for f in group if f.key == key and not f.facts.get("symptom_of")] or group
        # the findings keyed so by their own diagnosis: a wider trigger merged in would name the wrong one (the
        # exhaustive tests' "on the plain call" under `@heads-above:4`)
        own = [f for f in own if not f.facts.get("merged_from")] or own
        # a finding merged in under this key (nested triggers, one explanation) keeps its own effect's title
        own = [f for f in own if f.facts.get("effect") == key.split("@", 1)[0]] or own
        return Counter(f.title for f in own).most_common(1)[0][0]
    if key.startswith("rounding:"):
        asked = sorted({f.facts.get("held") for f in group if f.facts.get("held")}, key=list(RECIPES).index)
        return f"computes {key.split(':', 1)[1]} where {', '.join(asked) or 'another recipe'} is asked"
    own = [f for f in group if not f.facts.get("symptom_of")] or group  # a named cause, not the symptoms moved in
    return GROUP_TITLES.get(key) or Counter(f.title for f in own).most_common(1)[0][0]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:70] or "defect"


def defects_from(nodes: dict[str, Node], cases_dir: Path, replay_base: dict[str, str],
                 fresh: Fresh | None = None) -> list[Defect]:
    """Group the run's findings by key; copy each defect's smallest Case into cases_dir. With `fresh`, the
    defects whose smallest Case passes in a fresh process are one defect of the history (`_merge_history`)."""
    findings = [f for n in nodes.values() for f in n.findings]
    _cover(findings)
    for n in nodes.values():
        _crash_symptoms(n)
    groups: Groups = {}
    for n in nodes.values():
        for f in n.findings:
            groups.setdefault(f.key, []).append((n.nodeid, f))
    _merge_narrower(groups)
    _merge_joint_triggers(groups)
    _merge_raises(groups)
    _merge_wrong_bound(groups)
    _merge_same_exception(groups)
    _merge_explained(groups)
    _merge_ignored_into_swapped(groups)
    _merge_overrun(groups)
    _merge_old_bytes_symptoms(groups)
    _merge_wider(groups)
    _merge_subnormals_beside(groups)
    _merge_moved_padding(groups)
    _merge_raises(groups)  # again: two hosts a raise could not choose between may be one defect by now
    _merge_misplaced_scales(groups)
    _merge_kv_raises(groups)
    _merge_validation_kinds(groups)
    _merge_raised_before_checks(groups)
    _merge_misread_raise(groups)
    _merge_misread_unexplained(groups)
    _merge_storage_raise(groups)
    _attribute_unrepeatable(groups)
    _merge_scale_kinds(groups)
    _merge_row_bytes(groups)
    _merge_input_dtypes(groups)
    _merge_stride_source(groups)
    _attribute_row_findings(groups, nodes)
    _attribute_crashes(groups)
    _attribute_shared_memory(groups)
    _attribute_graph(groups)
    _attribute_combined(groups)
    _merge_skipped_tokens(groups)
    _merge_raises_outside_cache(groups)
    _merge_per_head(groups)
    _attribute_to_plain_call(groups)
    _merge_plain_call(groups)
    _merge_page_size_raise(groups)
    _merge_unwritten_into_moved(groups)
    # again: with the unwritten slots joined to the moved tokens, a raise or a shared buffer that had two hosts
    # of one trigger to choose between may have one now
    _merge_raises(groups)
    _attribute_shared_memory(groups)
    _merge_encoding(groups)
    _merge_nan_to_num(groups)
    _merge_value_trigger(groups)
    _attribute_misplaced(groups)
    _attribute_unexplained(groups)
    _attribute_to_the_one_defect(groups)
    if fresh is not None:
        _merge_history(groups, fresh)
    order = sorted(groups, key=lambda k: (list(CLASS_TITLES).index(class_of(k)) if class_of(k) in CLASS_TITLES
                                           else 99, k))
    defects = []
    for i, key in enumerate(order, 1):
        pairs = groups[key]
        group = [f for _, f in pairs]
        tests = sorted({t for t, _ in pairs})
        cell = max((f.cell for f in group), key=lambda c: RANK.get(c, 0))
        wheres = sorted({w for w in map(_where, group) if w})
        detail = ("seen in: " + "; ".join(wheres[:6]) + (f"; and {len(wheres) - 6} more" if len(wheres) > 6 else "")
                  if wheres else "")
        alike = _indistinguishable(key, group)
        if alike:
            detail += ("; " if detail else "") + "no case of the run tells it from " + ", ".join(alike)
        effect_detail = next((f.facts["detail"] for f in group if f.facts.get("detail")), "")
        if effect_detail:
            detail += ("; " if detail else "") + effect_detail
        also = sorted({f.facts["symptom"] for f in group if f.facts.get("symptom")})
        if also:
            detail += ("; " if detail else "") + "also shows as: " + "; ".join(also)
        d = Defect(f"D{i}", key, class_of(key), _title(key, group), cell, tests, group, detail)
        owner = {id(f): t for t, f in pairs}
        with_case = [f for f in group if f.case_file and Path(f.case_file).is_file()]
        best = min(with_case, key=lambda f: (not f.replayable, f.case_size or 0, f.case_file)) if with_case else None
        if best is not None:
            cases_dir.mkdir(parents=True, exist_ok=True)
            target = cases_dir / f"{_slug(key)}.json"
            shutil.copyfile(best.case_file, target)
            d.case, d.case_size, d.excerpt = str(target), best.case_size, best.excerpt
            if best.replayable and key != HISTORY:  # a history defect's Case passes when replayed alone
                d.replay = f"python -m tools.repro {target}"
        d.excerpt = d.excerpt or group[0].excerpt
        if not d.replay:
            d.replay = pytest_command(owner[id(best if best is not None else group[0])], replay_base)
        defects.append(d)
    return defects


HISTORY = "state:earlier-calls"
#: Classes a fresh replay (tools.repro: both caches' bytes, or the raise) cannot show: arguments, crashes,
#: graphs, inputs modified, caches past 2**31 bytes, dynamic per-(token, head) scales.
NOT_REPLAYED = ("validation", "unclassified", "crash", "graph", "input-modified", "big-cache", "per-token-head")
#: Keys a failure gets when its Case cannot be replayed, or passes when it is (its own text classified).
UNREPRODUCED = ("wrong-bytes:values", "wrong-bytes:inconsistent", "unclassified:no-case", "unclassified:no-repro",
                "state:unrepeatable")


def _replayable_case(group: list[tuple[str, Finding]]) -> str | None:
    cases = [f for _, f in group if f.replayable and f.case_file and Path(f.case_file).is_file()]
    return min(cases, key=lambda f: (f.case_size or 0, f.case_file)).case_file if cases else None


def _merge_history(groups: Groups, fresh: Fresh) -> None:
    """Defects whose smallest Case fails in the run and passes in a fresh process (the implementation's first
    call there) are one defect: its bytes depend on earlier calls. The run's failures that no replay could
    reproduce (classified by their text alone) are symptoms of it too, and so are wrong values, slots or
    writes outside that a capability row saw without a Case (held-out batch 55's launch cache that kept the
    first call's cache_loc)."""
    cases = {key: _replayable_case(group) for key, group in groups.items()
             if class_of(key) not in NOT_REPLAYED}
    cases = {key: path for key, path in cases.items() if path}
    if not cases:
        return
    outcome = fresh(list(cases.values()))
    stale = [key for key, path in cases.items() if outcome.get(path) is True]
    if not stale:
        return
    groups.setdefault(HISTORY, [])
    for key in stale:
        _move(groups, key, lambda _n, _f: (HISTORY, " (right when it is the first call, in a fresh process)"))
    for key in [k for k in groups if k in UNREPRODUCED or k.startswith(tuple(u + "@" for u in UNREPRODUCED))]:
        _move(groups, key, lambda _n, _f: (HISTORY, " (not reproduced when replayed)"))
    # and the wrong values or places no Case was kept for (a capability row's text: its call came after
    # others in its process), which no replay can tell from it
    for key in [k for k in groups if k not in cases and "@" not in k
                and class_of(k) in (*VALUE_CLASSES, "wrong-bytes", "wrong-slot", "outside")]:
        _move(groups, key, lambda _n, _f: (HISTORY, " (no Case kept to replay)"))


def _move(groups: Groups, key: str, host_of) -> None:
    """List key's findings under another defect: host_of(nodeid, finding) gives (host, why), or None to
    keep the finding where it is. A moved finding keeps its own title as the symptom it shows."""
    kept = []
    for nodeid, f in groups.pop(key):
        found = host_of(nodeid, f)
        if found is None:
            kept.append((nodeid, f))
            continue
        host, why = found
        if why is not None:  # None: the same defect under another key (nested triggers), not a symptom
            f.facts = {**f.facts, "symptom_of": host, "symptom": f"{f.title}{why}"}
        else:  # its title names its own trigger, not the host's (_title)
            f.facts = {**f.facts, "merged_from": key}
        f.key = host
        groups[host].append((nodeid, f))
    if kept:
        groups[key] = kept


def _merge_narrower(groups: Groups) -> None:
    """One effect under two triggers, one inside the other (E@uint8 and E@uint8+int32): one defect, under
    the narrower trigger; the wider one's extra dimensions came from a Case that needed them for its
    symptom, not from the cause."""
    # An exhaustive test's Case keeps its shape, so its trigger never names a size: beside the same effect under
    # that trigger and a size rule (`dim-above:128`), it is that one
    for key in [k for k in groups if "@" in k and _exhaustive_only(groups[k])]:
        sized = [k for k in groups if k != key and "@" in k and same_effect(k) == same_effect(key)
                 and trigger_set(k) > trigger_set(key) and _unsized(groups[key], trigger_set(k) - trigger_set(key))]
        if len(sized) == 1:
            _move(groups, key, lambda _n, _f, host=sized[0]: (host, None))
            continue
        # nor does it where its Cases hold another key's whole trigger, a size rule, that ablation found for the
        # same named effect (a word's halves swapped where D is a multiple of 8, and in an fnuz sweep's Case,
        # whose format ablation alone moved: held-out batch 62)
        held = [k for k in groups if k != key and "@" in k and same_effect(k) == same_effect(key)
                and not same_effect(k).endswith("unexplained") and _holds_trigger(groups[key], k)
                and any(d in SIZE_RULES for d in trigger_set(k))]
        if len(held) == 1:
            _move(groups, key, lambda _n, _f, host=held[0]: (host, None))
    for key in sorted(groups, key=lambda k: -len(trigger_set(k))):
        narrower = [k for k in groups if k != key and "@" in k and "@" in key and same_effect(k) == same_effect(key)
                    and (trigger_set(k) < trigger_set(key) or (keyed_by_values(key) and not keyed_by_values(k))
                         or _implied(trigger_set(k), trigger_set(key)))
                    and not _unsized(groups[k], trigger_set(key) - trigger_set(k)) and not _combined(k)]
        if narrower:
            host = min(narrower, key=lambda k: len(trigger_set(k)))
            _move(groups, key, lambda _n, _f, host=host: (host, None))


def _merge_joint_triggers(groups: Groups) -> None:
    """One named effect under two triggers, neither inside the other, where every Case of each has the other's
    whole trigger too (rows permuted across tokens where H > 1, and where T > 1): each ablation made the failure
    vanish from its own minimal Case, so the cause needs both. One defect, under both triggers."""
    for key in sorted(groups):
        if key not in groups or "@" not in key or same_effect(key).endswith("unexplained") or not trigger_set(key):
            continue
        others = [k for k in groups if k != key and "@" in k and same_effect(k) == same_effect(key) and trigger_set(k)
                  and not (trigger_set(k) <= trigger_set(key) or trigger_set(key) <= trigger_set(k))
                  and _holds_trigger(groups[key], k) and _holds_trigger(groups[k], key)]
        if len(others) != 1:
            continue
        joint = sorted(trigger_set(key) | trigger_set(others[0]))
        target = f"{same_effect(key)}@{'+'.join(joint)}"
        groups.setdefault(target, [])
        for k in (key, others[0]):
            for _, f in groups[k]:
                said = words(sorted(trigger_set(k)))
                f.title = f.title.replace(said, words(joint)) if said in f.title else f.title
            _move(groups, k, lambda _n, _f, target=target: (target, None))


def _implied(narrow: frozenset[str], wide: frozenset[str]) -> bool:
    """Whether every dimension of `narrow` is implied by one of `wide`, which is not implied back: D above 128
    implies D above 64, so `E@dim-above:128+strided-cache` is `E@dim-above:64` (a head group of 256 // D's next
    power of two elements: where the bound on D moves with H, each Case names its own)."""
    def bound(dim: str) -> tuple[str, int] | None:  # "dim-above:128" -> ("dim-above", 128)
        rule, _, m = dim.rpartition(":")
        return (rule, int(m)) if dim in SIZE_RULES and rule.endswith(("-above", "-below")) else None

    def implies(a: str, b: str) -> bool:
        ba, bb = bound(a), bound(b)
        if a == b or ba is None or bb is None or ba[0] != bb[0]:
            return a == b
        return ba[1] >= bb[1] if ba[0].endswith("-above") else ba[1] <= bb[1]

    def covers(x: frozenset[str], y: frozenset[str]) -> bool:
        return bool(x) and all(any(implies(b, a) for b in y) for a in x)
    return narrow != wide and covers(narrow, wide) and not covers(wide, narrow)


def _combined(key: str) -> bool:
    """What no model explains with no trigger: where two defects show at once in its Case, no ablation made it
    vanish (each left the other's failure), so its empty trigger is no narrower one (_attribute_combined)."""
    return same_effect(key) == "unexplained" and not trigger_set(key)


def _unsized(pairs: list[tuple[str, Finding]], extra: frozenset[str]) -> bool:
    """Whether the findings come from exhaustive tests alone and `extra` is size rules alone: dimensions their
    Cases could not have found."""
    return bool(extra) and all(d in SIZE_RULES for d in extra) and _exhaustive_only(pairs)


#: Classes that say what happened, not why: a raise, a crash, bytes no model explains.
SYMPTOM_ONLY = ("raises", "crash", "input-modified")
#: Classes of defect that write out of place: the only kind that can make a process crash or change
#: memory it was not given.
PLACEMENT = ("strides", "padding", "out-of-range", "big-cache", "overrun")
#: Per-token-head effects that write out of place (scales put where their caches' strides do not say, bytes in
#: slots no token names): the family's Cases are not ablated, so these keys carry no placement class.
PTH_PLACEMENT = ("per-token-head:scale-caches-as-contiguous", "per-token-head:writes-outside",
                 "per-token-head:cache-loc-stride-ignored", "per-token-head:scales-misplaced")
#: Effects that store one cache's bytes through the other's pointer: out of place, past that buffer's end when
#: the caches differ in size or offset (a crash under Triton's interpreter). K stored through value_cache's
#: pointer is not among them: V's bytes overwrite it where the layouts agree, so it reads as key_cache unwritten.
KV_THROUGH = ("kv-mixed:v-into-k-cache",)
#: Per-token-head effects on which rows are written (raised apart from wrong values: test_per_token_head.py).
PTH_ROWS = (*PTH_PLACEMENT, "per-token-head:unwritten")
EXHAUSTIVE_PTH = "test_per_token_head.py::test_every_input_pattern"
#: Placement effects that only read out of place (inputs read with the wrong strides; a [H] scale read with the
#: other's larger stride, past its buffer): they change no memory.
READS_ONLY = ("strides:inputs-ignored", "strides:inputs-heads-ignored", "strides:other-input",
              "scale:per-head-other-stride")
#: The properties that an input or cache_loc is left unchanged: what fails them was written.
ISOLATION_TEST = "conformance/test_isolation.py::"
CUDA_ERRORS = ("illegal memory access", "CUDA error", "cudaError", "AcceleratorError")


def _crash_symptoms(node: Node) -> None:
    """A CUDA error raised by a call is a crash (the context is lost); and once a test crashed, what else it
    reported came after the corruption: symptoms of that crash, not defects of their own."""
    for f in node.findings:
        if f.cls == "raises" and any(m in f.title or m in f.excerpt for m in CUDA_ERRORS):
            f.facts = {**f.facts, "symptom": f.title}
            f.cls, f.key, f.cell = "crash", "crash", "crashes"
            f.title = "crashes the process (a CUDA error: an illegal memory access loses the CUDA context)"
    crash = next((f for f in node.findings if f.cls == "crash"), None)
    if crash is None:
        return
    for f in node.findings:
        if f is not crash and f.cls not in ("crash", "validation"):
            f.facts = {**f.facts, "symptom": f.title, "symptom_of": crash.key}
            f.key = crash.key


def _merge_explained(groups: Groups) -> None:
    """A defect whose every minimal variant another defect's effect also explains is that defect: Triton's
    approximate `/` lands on the correctly rounded quotient of another recipe in one Case (`rounding:divide`
    fits it, and so does `approximate-division`) and off it in another (only `approximate-division` fits)."""
    for key in list(groups):
        if key not in groups:
            continue
        # By effect: the findings merged under this key (E@uint8 and E@uint8+int32) name their explanations
        # with their own triggers.
        shared = None
        for _, f in groups[key]:
            effects = {same_effect(e) for e in f.facts.get("explanations") or [] if "@" in e}
            shared = effects if shared is None else shared & effects
        # A defect of an explanation's effect under a nested trigger is that explanation's defect too (the
        # other Case needed one more dimension for its symptom): it takes the narrower trigger.
        # So is one whose every Case holds that defect's whole trigger: its effect is there, and explains it (a
        # tile's lanes past T writing slot 0 read as padding's dummy writes where the one token is padding).
        mine = trigger_of(key)
        hosts = sorted({(f"{e}@{mine}", k) for e in (shared or set()) - {same_effect(key)} for k in groups
                        if k != key and "@" in k and "@" in key and same_effect(k) == e
                        and (_nested(trigger_set(k), trigger_set(key)) or _holds_trigger(groups[key], k))})
        if len({k for _, k in hosts}) != 1:
            continue
        explanation, host = hosts[0]
        target = explanation if trigger_set(explanation) <= trigger_set(host) else host
        if target != host:
            groups.setdefault(target, [])
            _move(groups, host, lambda _n, _f, target=target: (target, None))
        _move(groups, key, lambda _n, _f, target=target: (target, f" (also explained as {target})"))


def _holds_trigger(pairs: list[tuple[str, Finding]], host: str) -> bool:
    """Whether the Case of every finding has the host's whole (non-empty) trigger."""
    return bool(trigger_set(host)) and all(_triggered(_case_of(f), [host]) for _, f in pairs)


def _merge_overrun(groups: Groups) -> None:
    """A tile's unmasked lanes under several triggers (past D where H is a power of two, past H where D is: a
    mask `|` for `&`) are one defect: one mask, under the key of the fewest trigger dimensions."""
    keys = sorted((k for k in groups if same_effect(k) == "overrun:tile"), key=lambda k: (len(trigger_set(k)), k))
    for key in keys[1:]:
        _move(groups, key, lambda _n, _f, host=keys[0]: (host, " (the same tile's lanes under another trigger)"))


def _merge_old_bytes_symptoms(groups: Groups) -> None:
    """A store that ORs or adds its bytes into the slot's old ones leaves a slot as it was where its new bytes are
    0x00 (zero inputs), and adds up the bytes that skipped tokens park in one slot: beside the run's one such
    defect, slots left unwritten under a value trigger, and bytes no model places under a skipped-slot trigger,
    are its symptoms (held-out batch 25's accumulating scatter read as three defects)."""
    hosts = [k for k in groups if same_effect(k) in ("storage:or-old", "storage:added-to-old")]
    if len(hosts) != 1:
        return
    skipped = {"out-of-range", "padding", "duplicate-slots"}
    for key in list(groups):
        dims = trigger_set(key)
        unwritten = same_effect(key) == "wrong-slot:unwritten" and dims and all(value_dimension(d) for d in dims)
        parked = key.split("@", 1)[0] == "wrong-slot:unexplained" and dims and dims <= skipped
        if unwritten or parked:
            _move(groups, key, lambda _n, _f: (hosts[0], " (its new bytes 0x00, or a parking slot's added up)"))


def _merge_ignored_into_swapped(groups: Groups) -> None:
    """A scale read as ignored in a minimal Case whose other scale is 1.0 was as much the other cache's scale
    (held-out batch 25's `repeat` for `repeat_interleave`: K's odd heads took V's scale, 1.0 there): beside
    the run's one `scale:swapped` defect it is that defect."""
    hosts = [k for k in groups if same_effect(k) == "scale:swapped"]
    if len(hosts) != 1:
        return

    def ambiguous(_nodeid: str, f: Finding) -> tuple[str, str] | None:
        case = _case_of(f)
        values = {1.0 if s.kind == "none" else s.value for s in (case.k_scale, case.v_scale)} if case else set()
        return (hosts[0], " (its Case's other scale was 1.0)") if 1.0 in values and len(values) == 2 else None
    for key in [k for k in groups if same_effect(k) == "scale:ignored"]:
        _move(groups, key, ambiguous)


#: An effect class inside a wider one: within two fp32 ulps before the e4m3 cast is within one e4m3 ulp after;
#: a flush or a shift of subnormals alone is a wrong subnormal path (a Case whose few subnormals an encoder's
#: dropped implicit bit writes as ±0 reads as a flush).
WIDER = {"approximate-division": "off-by-one-ulp", "flush-to-zero": "subnormal-path",
         "subnormal-shift": "subnormal-path"}


def _merge_subnormals_beside(groups: Groups) -> None:
    """Subnormal bytes no rule gives, seen only in calls whose normal values one rule gives (never alone), are
    that rule's defect: one encoder step wrong on both kinds of value. A wrong subnormal path seen alone too is
    a defect of its own (held-out batch 61's pair: a flush bound one binade high beside an e5m2 bias)."""
    for key in [k for k in groups if same_effect(k) == "subnormal-path"]:
        besides = {f.facts.get("beside", "") for _, f in groups[key]}
        if "" in besides or len(besides) != 1:
            continue
        [rule] = besides
        hosts = [k for k in groups if same_effect(k) == rule]
        if len(hosts) == 1:
            why = " (its values below the smallest normal, wrong by no rule, were seen only beside it)"
            _move(groups, key, lambda _n, _f, host=hosts[0], why=why: (host, why))


def _merge_wider(groups: Groups) -> None:
    """A defect of a class inside a wider one found too, under a nested trigger, is that defect: a reciprocal
    held in bf16 is within two fp32 ulps of the quotient in some Cases and only within one e4m3 ulp in
    others; both say "not correctly rounded", and it is one cause."""
    for key in list(groups):
        wide = WIDER.get(same_effect(key))
        if wide is None or key not in groups:
            continue
        hosts = [k for k in groups if same_effect(k) == wide and _nested(trigger_set(k), trigger_set(key))]
        if len(hosts) == 1:
            why = f" (also {same_effect(key)}, the narrower class)"
            _move(groups, key, lambda _n, _f, host=hosts[0], why=why: (host, why))


def _nested(a: frozenset[str], b: frozenset[str]) -> bool:
    return a <= b or b <= a


def _hosts(groups: Groups) -> list[str]:
    """The diagnosed defects: a trigger found by experiment, an effect that is not only a symptom."""
    return [k for k in groups if "@" in k and not _symptom_only(k) and class_of(k) != "validation"]


def _attribute_row_findings(groups: Groups, nodes: dict[str, Node]) -> None:
    """A capability row's failure that no replay reproduced (a GPU race between a padding or out-of-range
    token and the token that owns the slot it lands on) is read by the row's text alone; the row varies
    one dimension of the plain call, so what it found is a symptom of the one diagnosed defect that this
    dimension triggers, when there is exactly one."""
    def host_of(nodeid: str, _f: Finding, key: str) -> tuple[str, str] | None:
        node = nodes.get(nodeid)
        row = str(node.params.get("row")) if node is not None and nodeid.startswith(PROBE_TEST) else ""
        dims = set(ROW_TRIGGERS.get(row, "").split("+")) - {""}
        hosts = [h for h in _hosts(groups) if h != key and trigger_set(h) & dims]
        return (hosts[0], f" (the {row} row, not reproduced on replay)") if len(hosts) == 1 else None

    for key in [k for k in groups if "@" not in k and class_of(k) != "validation"]:
        _move(groups, key, lambda n, f, key=key: host_of(n, f, key))


def _places(key: str) -> bool:
    """Whether a key's effect reads or writes out of place."""
    return class_of(key) in PLACEMENT or key.split("@", 1)[0] in (*PTH_PLACEMENT, *READS_ONLY, *KV_THROUGH)


def _writers(keys: list[str]) -> list[str]:
    """The keys of effects that write out of place (not those that only read out of place)."""
    return [k for k in keys if k.split("@", 1)[0] not in READS_ONLY]


def _attribute_crashes(groups: Groups) -> None:
    """A crash, or an input changed by a stray write, that no replay could tie to a trigger (or whose
    capability row's dimension triggers no diagnosed defect): a symptom of the run's one defect that writes
    out of place, when there is exactly one (a value, a raise or a scale cannot write where it was not told
    to); otherwise it stays a defect of its own. So are wrong bytes seen only where the caches share one
    buffer, when that defect writes (not only reads) out of place."""
    hosts = [k for k in groups if _places(k) and not _symptom_only(k)]
    _attribute_by_case(groups, hosts)
    writers = _writers(hosts)
    if len(hosts) == 1:
        host, why = hosts[0], " (attributed: the run's one defect that writes out of place)"
    elif len(writers) == 1:
        host, why = writers[0], (" (attributed: the run's one defect that writes out of place; the others "
                                 "only read out of place)")
    else:
        return

    def unrelated(key: str) -> bool:
        return not any(trigger_set(key) & trigger_set(h) for h in _hosts(groups))

    if host in writers and "wrong-bytes:shared-memory" in groups:
        # bytes wrong only where the caches share one buffer: a write that left its own cache's memory
        _move(groups, "wrong-bytes:shared-memory", lambda _n, _f: (host, why))
    crashed = any(class_of(k) == "crash" for k in groups)
    for key in [k for k in groups if class_of(k) in ("crash", "input-modified") and
                (not trigger_of(k) or (class_of(k) == "crash" and unrelated(k)))
                # Memory a stray write corrupted: what no model explains, on the plain call, in a run that crashed
                or (crashed and host in writers and k.endswith(":unexplained@plain"))]:
        _move(groups, key, lambda _n, _f: (host, why))


def _attribute_shared_memory(groups: Groups) -> None:
    """Wrong bytes or a raise seen only where the tensors share one buffer: sharing makes each cache a strided
    view (K and V interleaved per page, slot or head), whatever the separate Case's layout, so they are a
    symptom of the run's one defect that strided caches trigger, when there is exactly one (a cache flattened
    by a reshape that copies where its pages cannot merge: nothing written). Likewise k and v sharing one
    buffer, and the one defect strided inputs trigger (a token stride taken as H x D)."""
    for key, dims, what in (("wrong-bytes:shared-memory", {"strided-cache", "cache-layouts-differ"}, "caches"),
                            ("raises:shared-memory", {"strided-cache", "cache-layouts-differ"}, "caches"),
                            # k and v as the halves of one buffer: each a strided view (a token stride of 2 H D)
                            ("wrong-bytes:inputs-shared", {"strided-input", "input-layouts-differ"}, "inputs"),
                            ("raises:inputs-shared", {"strided-input", "input-layouts-differ"}, "inputs")):
        hosts = [k for k in groups if k != key and trigger_set(k) & dims]
        if key in groups and len(hosts) == 1:
            _move(groups, key, lambda _n, _f, host=hosts[0], what=what: (host, f" (the shared buffer's {what} are "
                                                                              "strided)"))


def _triggered(case: Case | None, hosts: list[str]) -> list[str]:
    """The hosts whose whole trigger the Case has (none without a Case)."""
    return [h for h in hosts if case is not None and all(_present(d, case) for d in trigger_set(h))]


def _present(dimension: str, case: Case) -> bool:
    """Whether the Case has this trigger dimension (its ablation has somewhere to move it; a rule on H or D
    holds for its size)."""
    if dimension in SIZE_RULES:
        return SIZE_RULES[dimension].holds(case)
    if dimension == SCALE_TENSOR:
        return as_float_scales(case) is not None
    ablation = BY_NAME.get(dimension)
    return ablation is not None and next(iter(ablation.variants(case, "tensor1")), None) is not None


def _attribute_by_case(groups: Groups, hosts: list[str]) -> None:
    """A crash whose test saved its Case before the process died: a symptom of the one out-of-place defect
    whose whole trigger that Case has (two such defects, or none: it stays a crash of its own)."""
    if len(hosts) < 2:
        return  # one host: _attribute_crashes; none: nothing to attribute to
    def host_of(_nodeid: str, f: Finding) -> tuple[str, str] | None:
        fits = _triggered(_case_of(f), hosts)
        if len(fits) != 1:
            return None
        return fits[0], f" (attributed: its Case has {trigger_of(fits[0])} and no other out-of-place defect's trigger)"

    for key in [k for k in groups if class_of(k) == "crash"]:
        _move(groups, key, host_of)


def _case_of(f: Finding) -> Case | None:
    from conformance.artifacts import load_case
    try:
        if f.case_file:
            return load_case(f.case_file)[0]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # records read on another machine: the file stayed there, the facts came along
    try:
        saved = f.facts.get("case") or f.facts.get("minimal")  # a graph report's Case; a diagnosed minimal variant
        return Case.from_dict(saved) if saved else None
    except (ValueError, KeyError, TypeError):
        return None


def _attribute_combined(groups: Groups) -> None:
    """What no model explains, with no trigger, on a minimal Case that holds the whole triggers of two or more
    diagnosed defects: their effects at once (each ablation left the other's failure, so none made it
    vanish). A symptom of the first of them."""
    hosts = [k for k in groups if "@" in k and trigger_set(k) and same_effect(k) != "unexplained"
             and not _symptom_only(k)]

    def host_of(_nodeid: str, f: Finding) -> tuple[str, str] | None:
        fits = _triggered(_case_of(f), hosts)
        if len(fits) < 2:
            return None
        return fits[0], f" (attributed: its Case has the triggers of {' and '.join(fits)}: their effects at once)"

    for key in [k for k in groups if same_effect(k) == "unexplained" and not trigger_set(k)]:
        _move(groups, key, host_of)


#: Keys of failures no replay could diagnose (a shared slot's byte, shared memory, a text read alone).
UNDIAGNOSED = ("wrong-slot:shared", "wrong-bytes:values", "wrong-bytes:inconsistent", "unclassified:no-repro",
               "wrong-bytes:shared-memory")


def _attribute_to_the_one_defect(groups: Groups) -> None:
    """When the run has one diagnosed defect outside the argument contract, the failures no replay could
    diagnose are its symptoms: a slot several tokens name holds neither token's reference byte because each
    token's byte is wrong by a value rule; a scale the call overwrites in place gives wrong bytes where the
    tensors share one buffer."""
    diagnosed = [k for k in groups if "@" in k and class_of(k) != "validation"]
    if len(diagnosed) != 1:
        return
    kind = ", a value effect" if class_of(diagnosed[0]) in VALUE_CLASSES else ""

    def host_of(_nodeid: str, f: Finding) -> tuple[str, str] | None:
        # not where its Case lacks the defect's trigger: a shared slot left unwritten on tensor scales is no
        # symptom of a raise on float scales
        case = _case_of(f)
        if case is not None and not _triggered(case, diagnosed):
            return None
        return diagnosed[0], f" (not diagnosed by replay; the run's one defect{kind})"

    for key in [k for k in groups if k in UNDIAGNOSED]:
        _move(groups, key, host_of)


def _attribute_to_plain_call(groups: Groups) -> None:
    """A defect on the plain call is in every Case: when the run has exactly one such defect that says where
    bytes go (not a value rule, not a symptom), what no model explains is its symptom, whatever ablations
    made that vanish (a slot read from the wrong token of a tile vanishes with the page size that made the
    slots line up, or the values that made two tokens alike)."""
    hosts = [k for k in groups if "@" in k and not trigger_set(k) and not _symptom_only(k)
             and class_of(k) not in (*VALUE_CLASSES, "validation", "graph")]
    if len(hosts) != 1:
        return
    for key in [k for k in groups if same_effect(k) == "unexplained" and k != hosts[0]]:
        _move(groups, key, lambda _n, _f: (hosts[0], " (nothing explains it; the run's one defect on the plain "
                                                      "call)"))


#: Classes a defect of the plain call may show as, Case by Case: where bytes go, and the raise on the slots
#: that go past the cache.
PLAIN_SYMPTOMS = ("wrong-slot", "out-of-range", "strides", "kv-mixed", "raises", "wrong-bytes")


def _merge_plain_call(groups: Groups) -> None:
    """Defects on the plain call are in every Case, so what differs between their keys is the Case each was read
    off: a slot computed with the wrong page size moves some tokens, leaves others' slots unwritten, skips
    those past a bound it computes, and raises for some; each minimal Case fits another model. Two or more
    such keys (`@plain`, of the classes that say where bytes go, what no model explains, or a raise) are one
    defect, under the one a model names that the most findings show. (A pair whose two defects are both on
    the plain call is reported as one: no experiment tells such keys apart.)"""
    plain = [k for k in groups if trigger_of(k) == "plain" and class_of(k) in PLAIN_SYMPTOMS]
    if len(plain) < 2:
        return
    host = min(plain, key=lambda k: (_symptom_only(k) or k == "wrong-slot:unwritten@plain", -len(groups[k]), k))
    for key in [k for k in plain if k != host]:
        _move(groups, key, lambda _n, _f: (host, " (the same plain call, another Case)"))


def _merge_page_size_raise(groups: Groups) -> None:
    """An IndexError only for some page sizes, beside the run's one defect that computes slots wrongly on the plain
    call, is that defect's slots past the cache (a block size read from the wrong dimension moves tokens at one
    page size and indexes past the pages at another: the fresh check kernel of the twenty-eighth session)."""
    hosts = [k for k in groups if trigger_of(k) == "plain" and k.startswith(MOVES_TOKENS)]
    if len(hosts) != 1:
        return
    for key in [k for k in groups if k.split("@", 1)[0] == "raises:IndexError" and trigger_set(k) == {"page-size"}]:
        _move(groups, key, lambda _n, _f: (hosts[0], " (slots computed past the cache at some page sizes)"))


#: Keys that say where a token's bytes went (tokens whose slot a kernel computes wrongly leave their own unwritten).
MOVES_TOKENS = ("wrong-slot:tokens-moved", "wrong-slot:loc-int32-words", "strides:cache-loc-ignored",
                "strides:cache-page-stride", "strides:cache-inner-stride", "strides:cache-ignored", "padding:",
                "out-of-range:written")


def _merge_moved_padding(groups: Groups) -> None:
    """Whole tokens moved only with padding, beside the run's one padding rule of that very trigger, are that rule:
    a padding slot the kernel takes for a real one lands where the rule says, and the Case that shows it held a
    second defect's bytes too, so the rule's model missed some of them (held-out batch 50's pair: padding tested
    as `!= -1`, beside subnormal inputs flushed)."""
    for key in [k for k in groups if k.startswith("wrong-slot:tokens-moved@") and "padding" in trigger_set(k)]:
        hosts = [h for h in groups if class_of(h) == "padding" and trigger_set(h) == trigger_set(key)]
        if len(hosts) == 1:
            _move(groups, key, lambda _n, _f, host=hosts[0]: (host, " (padding tokens written as real ones)"))


def _merge_unwritten_into_moved(groups: Groups) -> None:
    """Slots left unwritten under the very trigger of the run's one defect that moves tokens are that defect: a slot
    computed with the wrong page size moves the tokens it keeps in the cache and skips those it sends past it, and
    a one-token Case of the second shows only the unwritten slot. (Issue 25: a wrong slot and the slot it left
    unwritten are one cause.)"""
    for key in [k for k in groups if k.startswith("wrong-slot:unwritten@") and trigger_set(k)]:
        hosts = [h for h in groups if h != key and h.startswith(MOVES_TOKENS) and trigger_set(h) == trigger_set(key)]
        if len(hosts) == 1:
            _move(groups, key, lambda _n, _f, host=hosts[0]: (host, " (its own slot left unwritten: sent past the "
                                                                    "cache)"))


def _exhaustive_only(pairs: list[tuple[str, Finding]]) -> bool:
    return all("test_exhaustive" in nodeid or "_all_patterns" in nodeid for nodeid, _ in pairs)


#: Classes of the defects that put bytes in the wrong places.
PLACING = ("wrong-slot", "strides", "padding", "out-of-range", "kv-mixed", "overrun")


def _attribute_misplaced(groups: Groups) -> None:
    """Bytes in the wrong places that no model explains (`wrong-slot:unexplained`, or a slot that several tokens
    name holding a byte none of them writes), where every Case of them has the whole trigger of the run's one
    named placement defect, are that defect's symptoms: rows gathered with the inverse of a slot sort move tokens
    where the slots are unsorted, and what padding, out-of-range or duplicate slots add to that fits no model of
    its own (held-out batch forty-seven's pair). A second placement defect, or a Case without the trigger, keeps
    them apart."""
    hosts = [k for k in groups if class_of(k) in PLACING and trigger_set(k) and not _symptom_only(k)
             and k != "wrong-slot:shared"]
    if len(hosts) != 1:
        return
    host = hosts[0]

    def holds(f: Finding) -> bool:
        case = _case_of(f)
        if case is None:
            return False
        # Where a padding or out-of-range slot goes in a kernel's sort is the kernel's choice (slot 0, the end):
        # such a Case may be unsorted to it, whatever the order of its raw slots.
        invalid = any(s < 0 or s >= case.num_slots for s in case.cache_loc)
        return all(_present(d, case) or (d == SLOTS_UNSORTED.name and invalid) for d in trigger_set(host))
    for key in [k for k in groups if k.split("@", 1)[0] in ("wrong-slot:unexplained", "wrong-slot:shared")]:
        if all(holds(f) for _, f in groups[key]):
            _move(groups, key, lambda _n, _f: (host, " (bytes out of place under its trigger)"))


def _attribute_unexplained(groups: Groups) -> None:
    """What no model explains names no cause of its own: where the run has at most one defect outside the
    argument contract that a model names (raises, crashes and changed inputs are not counted: they say nothing
    of the bytes), every unexplained diff is listed under it, or, with none, under the unexplained diff of the
    fewest trigger dimensions. A new class of defect shows as its nearest model under one trigger and as
    nothing explained under another (held-out kernels: ORed bytes, fnuz bytes beside their own NaN byte, a
    scale rounded up to a power of two); two defects that no model names would be reported as one."""
    unexplained = [k for k in groups if same_effect(k) == "unexplained"]
    hosts = [k for k in groups if class_of(k) not in ("validation", "state", "unclassified") and not _symptom_only(k)
             and k not in UNDIAGNOSED and k not in UNREPRODUCED]
    if not unexplained:
        return
    if len(hosts) > 1:
        _attribute_unexplained_by_shape(groups, unexplained, hosts)
        return
    # With no explained host, the unexplained diff of the fewest trigger dimensions, one the properties found
    # first: an exhaustive test's Case keeps its shape (its values fill it), so no size of it is probed
    host = hosts[0] if hosts else min(unexplained, key=lambda k: (_exhaustive_only(groups[k]), len(trigger_set(k)), k))
    why = " (nothing explains it; the run's one explained defect)" if hosts else " (nothing explains it either)"
    shape = _shape_dimensions(host)
    subnormal_only = same_effect(host) in SUBNORMAL_ONLY
    for key in [k for k in unexplained if k != host]:
        # not where both are triggered by dimensions of the call's shape and no dimension is shared: a defect
        # of its own (a head tiled by 128 that reloads its first tile, beside offsets masked for a page size)
        if shape and _shape_dimensions(key) and not _overlap(shape, _shape_dimensions(key)):
            continue
        # nor wrong bytes of normal values beside a defect of subnormals alone (an e5m2 bias constant wrong
        # beside a flush bound one binade high, held-out batch 61's pair: every e5m2 byte wrong)
        _move(groups, key, lambda _n, f: None if subnormal_only and "normal" in f.facts.get("value_kinds", ())
              else (host, why))


#: Lower bounds on H and on D: a tile over a head's H x D elements grows with both (a head group of 256 //
#: pow2(D) heads: H above 4 at D = 64 and D above 64 at H = 3 are one bound on the product).
TILE_BOUNDS = ("heads-above:", "dim-above:")


def _overlap(a: frozenset[str], b: frozenset[str]) -> bool:
    """Whether two triggers share a dimension, a lower bound on H and one on D counting as one."""
    def tiles(dims: frozenset[str]) -> bool:
        return any(d.startswith(TILE_BOUNDS) for d in dims)
    return bool(a & b) or (tiles(a) and tiles(b))


def _attribute_unexplained_by_shape(groups: Groups, unexplained: list[str], hosts: list[str]) -> None:
    """With several named defects, an unexplained diff goes under the one host that shares the most of its shape
    dimensions (at least one, and no other host as many): a pair's two defects in one Case read as neither (a
    recipe of e5m2 caches alone beside a NaN sign of fp8 caches: an e5m2 fp8 cache at a tiny scale shows both).
    Sharing none, or tied, it stays a defect of its own. A dimension shares those it implies (T = H holds more
    than one token: a ties Case of two tokens and two heads, rows permuted and rounded wrong at once)."""
    for key in unexplained:
        shape = _shape_dimensions(key) | {d for t in _shape_dimensions(key) for d in IMPLIED.get(t, ())}
        shared = sorted(((len(shape & _shape_dimensions(h)), h) for h in hosts if h != key), reverse=True)
        if not shared or shared[0][0] == 0 or (len(shared) > 1 and shared[1][0] == shared[0][0]):
            continue
        host = shared[0][1]
        _move(groups, key, lambda _n, _f, host=host: (host, " (nothing explains it; the defect whose trigger it "
                                                            "shares)"))


def _shape_dimensions(key: str) -> frozenset[str]:
    """The dimensions of a key's trigger that are not values: a size, a layout, a type, the slots."""
    return frozenset(d for d in trigger_set(key) if not value_dimension(d))


#: Per-head and per-token-head keys: the prefix of those that name a cause, and those read by where the bytes
#: differ.
LOCATED = (("scale:per-head-", ("scale:per-head",)),
           ("per-token-head:", ("per-token-head:values", "per-token-head:scales", "per-token-head:writes-outside",
                                "per-token-head:scales-misplaced")))


def _merge_per_head(groups: Groups) -> None:
    """A per-head failure no wrong reading of the [H] scale explained (`scale:per-head`: an e5m2 cache's, say)
    beside the one that names how the [H] scale is misread is that one; likewise a per-token-head failure no
    scale rule explained (an exhaustive test's, which keeps no Case) beside the one scale rule named (and any
    number of rules that put rows out of place: those are raised apart, conformance/test_per_token_head.py)."""
    for prefix, located in LOCATED:
        named = [k for k in groups if k.startswith(prefix) and k not in located]
        if len(named) > 1:  # wrong values are a value rule's, not a placement's: beside one of each, the rule's
            named = [k for k in named if k not in PTH_ROWS]
        if len(named) != 1:
            continue

        def host_of(nodeid: str, _f: Finding, host: str = named[0]) -> tuple[str, str] | None:
            # the exhaustive test writes every token to its own slot from a contiguous cache_loc, no key of zeros:
            # what it finds is no rule's on which rows are written
            if host in PTH_ROWS and EXHAUSTIVE_PTH in nodeid:
                return None
            return host, " (no cause named on this call)"
        for key in [k for k in located if k in groups and k != "per-token-head:writes-outside"]:
            _move(groups, key, host_of)


def _merge_skipped_tokens(groups: Groups) -> None:
    """One effect under "padding" and under "out-of-range" (each with the same other dimensions), where no model
    names a padding or an out-of-range rule: tokens that write nothing, handled alike (a padding token's carried
    bytes taken from the wrong cache; both sent to slot 0 with its old bytes, which a token of slot 0 then
    loses), so one defect, under the padding key. The out-of-range side may need the slots unsorted besides:
    sorted, its entries go last, and a defect that an invalid entry before a valid one triggers (V's rows taken
    after the batch was compacted) vanishes; padding's negative entries sort first. Slots compacted is such a
    rule too: the model that drops out-of-range entries with the padding ones names it under either trigger."""
    for key in [k for k in groups if "out-of-range" in trigger_set(k)]:
        others = trigger_set(key) - {"out-of-range", "slots-unsorted"}
        hosts = [h for h in groups if h != key and h.split("@", 1)[0] == key.split("@", 1)[0]
                 and trigger_set(h) - {"slots-unsorted"} == others | {"padding"}
                 and trigger_set(h) <= trigger_set(key) - {"out-of-range"} | {"padding"}]
        if len(hosts) == 1 and (class_of(key) not in ("padding", "out-of-range")
                                or key.split("@", 1)[0] == "padding:slots-compacted"):
            _move(groups, key, lambda _n, _f, host=hosts[0]: (host, " (with out-of-range slots too: tokens that "
                                                                     "write nothing)"))


def _merge_raises_outside_cache(groups: Groups) -> None:
    """One exception type raised under "out-of-range" and under "padding": slots outside [0, num_slots) on either
    side, one index check missing (a padding slot far below zero wraps to outside the cache, as an out-of-range
    one lies past it), so one defect, under the out-of-range key. Not where a padding rule is named (a wrap that
    writes, whose raise on the farthest negatives is its own symptom)."""
    if any(class_of(k) == "padding" for k in groups):
        return
    for key in [k for k in groups if class_of(k) == "raises" and "padding" in trigger_set(k)
                and "out-of-range" not in trigger_set(k)]:
        kind = key.split("@", 1)[0]
        hosts = [h for h in groups if h != key and h.split("@", 1)[0] == kind and "out-of-range" in trigger_set(h)
                 and "padding" not in trigger_set(h)]
        if len(hosts) == 1:
            _move(groups, key, lambda _n, _f, host=hosts[0]: (host, " (a padding slot far below zero: outside the "
                                                                     "cache on the other side)"))


def _encoding_kinds(key: str) -> set[str]:
    """An encoding key's rules, NaN for an infinity counted as NaN past the range (of which it is the case)."""
    kinds = set(same_effect(key).split(":", 1)[1].split("+"))
    return {"nan-past-448" if k == "inf-nan" else k for k in kinds}


def _merge_nan_to_num(groups: Groups) -> None:
    """`torch.nan_to_num` before the scale has two rules: NaN becomes 0 (`encoding:nan-lost` where a Case has no
    infinity) and ±inf the dtype's ±largest value (`input-clamped:dtype-max` where it has no NaN); a Case with
    both shows `input-clamped:nan-to-num`. Either rule beside another of them in one run is that one call: one
    defect, under `nan-to-num` where it was seen, else under the clamp."""
    rules = {effect: [k for k in groups if same_effect(k) == effect]
             for effect in ("input-clamped:nan-to-num", "input-clamped:dtype-max", "encoding:nan-lost")}
    seen = [effect for effect, keys in rules.items() if keys]
    if len(seen) < 2 or len(rules[seen[0]]) != 1:
        return
    host = rules[seen[0]][0]
    for key in [k for effect in seen[1:] for k in rules[effect]]:
        _move(groups, key, lambda _n, _f: (host, " (`torch.nan_to_num`'s other rule)"))


def _merge_encoding(groups: Groups) -> None:
    """Encoding defects that share a rule are one: a kernel whose NaN check spreads over a vector's lanes writes
    NaN where the recipe saturates in one Case, where it gives a finite byte in another, and both in a third.
    Each group of keys linked by a shared rule becomes one defect, under its key of the most rules (the
    commonest of those)."""
    keys = [k for k in groups if class_of(k) == "encoding" and "@" in k]
    linked: list[set[str]] = []
    for key in keys:
        touching = [g for g in linked if any(_encoding_kinds(key) & _encoding_kinds(k) for k in g)]
        merged = {key}.union(*touching)
        linked = [g for g in linked if g not in touching] + [merged]
    for group in linked:
        host = max(sorted(group), key=lambda k: (len(_encoding_kinds(k)), len(groups[k])))
        for key in sorted(group - {host}):
            _move(groups, key, lambda _n, _f, host=host: (host, " (an encoding rule of the same defect)"))


def _merge_value_trigger(groups: Groups) -> None:
    """Value effects under one and the same trigger (`@input-float16`) are one: a conversion that goes wrong for
    one input dtype gives wrong bytes of several rules (a widening of fp16 without its subnormals: zeros off by
    an ulp, NaN saturated), each keyed by the same dimension. One defect, under its key of the most findings,
    with what no model explains under that trigger and value dimensions. (`@any` is no trigger: two value
    defects for every input stay two.)"""
    by_trigger: dict[frozenset[str], list[str]] = {}
    for key in groups:
        if "@" in key and class_of(key) in VALUE_CLASSES and trigger_set(key):
            by_trigger.setdefault(trigger_set(key), []).append(key)
    for keys in by_trigger.values():
        if len(keys) < 2:
            continue
        host = max(sorted(keys), key=lambda k: len(groups[k]))
        for key in sorted(set(keys) - {host}):
            _move(groups, key, lambda _n, _f, host=host: (host, " (a rule of the same defect: the same trigger)"))
    # Under that trigger and cache formats besides: what a path's arithmetic does shows per format (a fix-up
    # skipped for a None scale keeps NaN's sign in e4m3, and makes e5m2's overflow inf and fnuz's NaN)
    for key in sorted((k for k in groups if "@" in k and class_of(k) in VALUE_CLASSES),
                      key=lambda k: -len(trigger_set(k))):
        hosts = [h for h in groups if h != key and "@" in h and class_of(h) in VALUE_CLASSES and trigger_set(h)
                 and trigger_set(h) < trigger_set(key) and trigger_set(key) - trigger_set(h) <= FORMAT_DIMENSIONS
                 and not trigger_set(h) <= FORMAT_DIMENSIONS]
        if len(hosts) == 1:
            _move(groups, key, lambda _n, _f, host=hosts[0]: (host, " (a rule of the same defect: its trigger, in "
                                                                    "another cache format)"))
    # Wrong bytes no model explains under that trigger and value dimensions alone are its bytes too
    # (with none but value dimensions, the run's one value defect on every input: a rule that fits ordinary
    # values, and at an extreme scale gives a NaN that no model reads, 0 x inf from a flushed input)
    for key in [k for k in groups if k.startswith("wrong-bytes:unexplained@")]:
        own = _shape_dimensions(key)
        hosts = [h for h in groups if h != key and "@" in h and class_of(h) in VALUE_CLASSES
                 and trigger_set(h) == own]
        if len(hosts) == 1:
            _move(groups, key, lambda _n, _f, host=hosts[0]: (host, " (nothing explains it; under that value "
                                                                    "defect's trigger)"))


#: Trigger dimensions that name a cache format.
FORMAT_DIMENSIONS = frozenset({"cache-e5m2", "cache-fnuz", "cache-uint8", "format-alias"})


def _attribute_graph(groups: Groups) -> None:
    """A graph replay wrong where eager calls of its Case were right, with no trigger found (re-captured, it
    passed): on a GPU, which of two writes to one byte lands is undefined, so a stray write's race can go
    either way under a graph. When its Case has the whole trigger of exactly one defect that writes out of
    place, it is a symptom of that defect."""
    hosts = _writers([k for k in groups if _places(k) and not _symptom_only(k)])

    def host_of(_nodeid: str, f: Finding) -> tuple[str, str] | None:
        fits = _triggered(_case_of(f), hosts)
        if len(fits) != 1:
            return None
        return fits[0], f" (attributed: a graph replay of a Case with {trigger_of(fits[0])}, the trigger of the " \
                        "run's one such defect that writes out of place)"

    for key in [k for k in groups if k in ("graph:stale", "graph:empty")]:
        _move(groups, key, host_of)


def _symptom_only(key: str) -> bool:
    """A raise, a crash, a changed input, what no model explains, or a graph replay wrong only under a
    trigger (which of two racing writes lands differs between a graph and an eager launch): symptoms of
    a defect whose trigger they hold, when there is one (_merge_raises)."""
    graph_race = class_of(key) == "graph" and bool(trigger_set(key))
    return class_of(key) in SYMPTOM_ONLY or key.split("@", 1)[0].endswith(":unexplained") or graph_race


def _merge_raises(groups: Groups) -> None:
    """One cause, one defect: a raise, a crash or an unexplained diff whose trigger holds another defect's
    whole trigger (an IndexError on some padding values and wrong bytes on the others; a uint8 value cast
    that also garbles the slot padding tokens are parked on) is a symptom of that defect, listed under it.
    Only when one such defect is the most specific; ties are left apart."""
    for key in [k for k in groups if _symptom_only(k) and trigger_set(k)]:
        hosts = [k for k in groups if k != key and trigger_set(k) and trigger_set(k) <= trigger_set(key)
                 and not _symptom_only(k) and class_of(k) != "validation"]
        best = [h for h in hosts if len(trigger_set(h)) == max(len(trigger_set(x)) for x in hosts)]
        if not hosts and class_of(key) in ("raises", "crash"):
            # No diagnosed host: a raise beside the one unexplained diff of exactly its trigger is that diff's
            # other side (an index past the cache on some slots, wrong bytes on the others)
            best = [k for k in groups if k != key and same_effect(k) == "unexplained"
                    and trigger_set(k) == trigger_set(key)]
        if len(best) == 1:
            _move(groups, key, lambda _n, _f, host=best[0]: (host, ""))


#: Layout triggers of one argument, and the effects that reinterpret that argument's memory.
MISREAD_BY_LAYOUT = (
    (frozenset({"strided-loc"}), ("strides:cache-loc-ignored", "wrong-slot:loc-int32-words")),
    (frozenset({"strided-input", "input-layouts-differ"}),
     ("strides:inputs-ignored", "strides:inputs-heads-ignored", "strides:other-input", "input-misread:")),
    (frozenset({"strided-cache", "cache-layouts-differ"}),
     ("strides:cache-ignored", "strides:other-cache", "strides:cache-head-major", "strides:cache-page-stride",
      "strides:cache-inner-stride")),
)


def _merge_misread_raise(groups: Groups) -> None:
    """A kernel that reinterprets an argument's memory (`loc.view(torch.int32)`, a flat pointer over a tensor
    it takes to be contiguous) misreads that argument where the view is possible and raises where it is not
    (a strided tensor): a raise triggered by that argument's layout alone is a symptom of the run's one
    defect that misreads the same argument."""
    for key in [k for k in groups if class_of(k) in ("raises", "crash") and trigger_set(k)]:
        for layouts, effects in MISREAD_BY_LAYOUT:
            if not trigger_set(key) <= layouts:
                continue
            hosts = [k for k in groups if k != key and same_effect(k).startswith(effects)]
            if len(hosts) == 1:
                _move(groups, key, lambda _n, _f, host=hosts[0]: (host, " (where that argument's layout cannot be "
                                                                          "reinterpreted)"))
            break


#: Every effect that reinterprets an argument's memory.
MISREADS = tuple(e for _, effects in MISREAD_BY_LAYOUT for e in effects)


def _merge_misread_unexplained(groups: Groups) -> None:
    """What no model explains under the layout of an argument that the run's one defect misreads is that
    misread, seen where its model could not be replayed (a graph replay of a cache read with a page stride of
    its own making, on the H200)."""
    for key in [k for k in groups if same_effect(k) == "unexplained" and trigger_set(k)]:
        hosts = sorted({h for layouts, effects in MISREAD_BY_LAYOUT if trigger_set(key) & layouts
                        for h in groups if h != key and same_effect(h).startswith(effects)})
        if len(hosts) == 1:
            _move(groups, key, lambda _n, _f, host=hosts[0]: (host, " (nothing explains it; under the layout of "
                                                                    "the argument that defect misreads)"))


def _merge_storage_raise(groups: Groups) -> None:
    """A view past its storage (torch's "out of bounds for storage", from as_strided) raised on a call no replay
    could tie to a trigger (inputs past 2**31 elements) is the run's one misread of an argument's strides."""
    hosts = [k for k in groups if same_effect(k).startswith(MISREADS)]
    if len(hosts) != 1:
        return
    for key in [k for k in groups if class_of(k) == "raises" and not trigger_set(k)
                and "out of bounds for storage" in k]:
        _move(groups, key, lambda _n, _f: (hosts[0], " (a view past its storage: the misread strides)"))


def _merge_scale_kinds(groups: Groups) -> None:
    """One effect under several scale kinds alone (a float k_scale, a None v_scale) is one defect: a kernel
    that takes both scales' kind from one of them raises, or ignores V's scale, wherever the kinds differ, and
    which scale the ablation moved back names the kind. An effect on the bytes joins only under the same caches
    (K's scale ignored for one kind and V's for another are two)."""
    by_effect: dict[tuple[str, frozenset[str]], list[str]] = {}
    for key in groups:
        dims = trigger_set(key)
        if class_of(key) != "validation" and len(dims) == 1 and next(iter(dims)).startswith("scale-kind:"):
            caches = frozenset(c for _, f in groups[key] for c in CACHES if c in str(f.facts.get("detail", "")))
            by_effect.setdefault((same_effect(key), caches), []).append(key)
    for keys in by_effect.values():
        host, *rest = sorted(keys)
        why = " (another scale kind, the same exception)" if class_of(host) == "raises" else None
        for key in rest:
            _move(groups, key, lambda _n, _f, host=host, why=why: (host, why))


#: The input dtypes past bf16, the plain call's, as the ablations name them.
WIDER_INPUTS = frozenset({"input-float16", "input-float32"})


def _row_bytes(dim: str, case: Case) -> tuple[int, int] | None:
    """(the bytes of the largest token row, H x D inputs, that the trigger dimension says passes; the Case's own
    row bytes), or None for a dimension of no row size."""
    dtype = DTYPES.get(case.input_dtype)
    if dtype is None:
        return None
    size = dtype.itemsize
    if dim.startswith("heads-above:"):
        passing = int(dim.split(":")[1]) * case.head_dim * size
    elif dim.startswith("dim-above:"):
        passing = case.num_heads * int(dim.split(":")[1]) * size
    elif dim in WIDER_INPUTS:
        passing = case.num_heads * case.head_dim * DTYPES["bfloat16"].itemsize
    else:
        return None
    return passing, case.num_heads * case.head_dim * size


def _merge_row_bytes(groups: Groups) -> None:
    """One named effect under a bound on H, a bound on D and a wider input dtype, each alone, is one defect where
    one size of a token's row in bytes (H x D x the input's element size) parts every Case the triggers say
    passes from every Case that failed: a grid that counts a row's tiles with one element size and fills them
    with another leaves the row's tail unwritten past a number of bytes (held-out batch forty-seven). Keyed
    `E@row-bytes-above:N`; where no one size parts them (a head tile and a dim chunk of their own), they stay
    apart."""
    by_effect: dict[str, list[str]] = {}
    for key in groups:
        dims = trigger_set(key)
        if len(dims) == 1 and not same_effect(key).endswith("unexplained") and class_of(key) != "validation":
            dim = next(iter(dims))
            if dim.startswith(TILE_BOUNDS) or dim in WIDER_INPUTS:
                by_effect.setdefault(same_effect(key), []).append(key)
    for effect, keys in by_effect.items():
        if len(keys) < 2 or not any(next(iter(trigger_set(k))).startswith(TILE_BOUNDS) for k in keys):
            continue
        sizes = [_row_bytes(next(iter(trigger_set(k))), c) if c is not None else None
                 for k in keys for c in (_case_of(f) for _, f in groups[k])]
        if not sizes or None in sizes:
            continue
        bound = max(p for p, _ in sizes)
        if bound >= min(f for _, f in sizes):
            continue
        host = f"{effect}@{ROW_BYTES}{bound}"
        groups.setdefault(host, [])
        for key in keys:
            for _, f in groups[key]:  # "<effect>, <trigger in words>": the words of the one trigger now
                f.title = f"{f.title.split(', only ', 1)[0]}, {row_bytes_words(bound)}"
            _move(groups, key, lambda _n, _f, host=host: (host, None))


def _merge_input_dtypes(groups: Groups) -> None:
    """One named effect for float16 input and for float32 input, the rest of the trigger the same, is one defect:
    a path every input but bf16 takes (a quotient staged in a bf16 buffer whatever the input's dtype), which each
    minimal Case names by its own dtype when the ablation moves it back to bf16."""
    by_effect: dict[tuple[str, frozenset[str]], list[str]] = {}
    for key in groups:
        dims = trigger_set(key)
        dtype = dims & WIDER_INPUTS
        if len(dtype) == 1 and class_of(key) != "validation" and not same_effect(key).endswith("unexplained"):
            by_effect.setdefault((same_effect(key), dims - dtype), []).append(key)
    for keys in by_effect.values():
        if len(keys) < 2:
            continue
        host, *rest = sorted(keys)
        for _, f in groups[host]:
            f.title = f.title.replace("only for float16 input", "only for float16 or float32 input")
        for key in rest:
            _move(groups, key, lambda _n, _f, host=host: (host, " (the other input dtype past bf16)"))


#: The layouts whose difference shows a cache addressed with its input's stride, one at a time.
STRIDE_SOURCE_TRIGGERS = (frozenset({"strided-input"}), frozenset({"strided-cache"}))


def _merge_stride_source(groups: Groups) -> None:
    """A cache addressed with its input's head or dim stride fails wherever the two differ: under a strided
    input (cache-from-input) or a strided cache, where the input is contiguous and its stride is the one computed
    from the cache's shape, so cache-inner-stride reads it too. Where the run names cache-from-input, those keys
    under either layout alone are that one defect (the ablation cannot name an either-or trigger)."""
    hosts = sorted(k for k in groups if same_effect(k) == "strides:cache-from-input"
                   and trigger_set(k) in STRIDE_SOURCE_TRIGGERS)
    if not hosts:
        return
    host = hosts[0]
    for key in [k for k in groups if k != host and trigger_set(k) in STRIDE_SOURCE_TRIGGERS
                and same_effect(k) in ("strides:cache-from-input", "strides:cache-inner-stride")]:
        why = None if same_effect(key) == same_effect(host) else \
            " (a strided cache: its contiguous input's stride, read as the one computed from its shape)"
        _move(groups, key, lambda _n, _f, why=why: (host, why))


def _attribute_unrepeatable(groups: Groups) -> None:
    """An example that failed and then passed when run again (Hypothesis's FlakyFailure) is a symptom of the
    run's one defect that reads or writes out of place: what lies past a tensor changes between calls (seen
    on the H200 for Triton kernels reading with another tensor's strides, or writing past the cache). An
    input changed that way was changed by a write: of the run's one defect that writes out of place (an
    H100 run with one defect reading inputs without their strides, another writing V with K's)."""
    # and the out-of-place effects of families whose Cases are not ablated (per-head, per-token-head): no trigger
    hosts = [k for k in _hosts(groups) if _places(k)] + [k for k in groups if k in (*PTH_PLACEMENT, *READS_ONLY)]
    writers = _writers(hosts)

    def host_of(nodeid: str, f: Finding) -> tuple[str, str] | None:
        written = nodeid.startswith(ISOLATION_TEST) or "modified its input" in f.excerpt
        fits = writers if written and len(hosts) > 1 else hosts
        return (fits[0], " (out-of-place memory changes between calls)") if len(fits) == 1 else None

    if "state:unrepeatable" in groups:
        _move(groups, "state:unrepeatable", host_of)


def _merge_wrong_bound(groups: Groups) -> None:
    """A wrong number of slots cuts both ways: in-range slots past it are skipped (the defect), and slots
    past the cache but below it are written, or raise. So a raise or crash with out-of-range slots in its
    trigger is a symptom of the run's one wrong-bound defect."""
    hosts = [k for k in groups if k.startswith("out-of-range:wrong-bound")]
    if len(hosts) != 1:
        return
    for key in [k for k in groups if class_of(k) in ("raises", "crash", "out-of-range") and k != hosts[0]
                and "out-of-range" in trigger_set(k)]:
        _move(groups, key, lambda _n, _f: (hosts[0], " (slots past the cache but below the wrong bound)"))
    # and the last slot left unwritten, under the bound's whole trigger, is an in-range slot past it (a pool
    # bounded a page short skips the last page's slots; its Case that named the last slot read as "unwritten")
    for key in [k for k in groups if k.startswith("wrong-slot:unwritten@") and hosts[0] in groups
                and trigger_set(hosts[0]) | {"last-slot"} <= trigger_set(k)]:
        _move(groups, key, lambda _n, _f: (hosts[0], " (an in-range slot past the wrong bound, skipped)"))


def _scale_layouts(findings: Iterable[tuple[str, Finding]]) -> set[str]:
    """The layouts of the scale bytes these findings' excerpts name wrong: 'inline' (after a head's bytes),
    'separate' (a scale cache)."""
    lines = [line for _, f in findings for line in f.excerpt.splitlines() if " expected 0x" in line]
    return ({"inline"} if any("inline scale byte" in line for line in lines) else set()) | \
        ({"separate"} if any("stored scale" in line for line in lines) else set())


def _merge_misplaced_scales(groups: Groups) -> None:
    """Scales stored in the wrong place show as wrong scales alone where every stray byte landed on bytes the
    Case writes after them, or on another written scale: one defect with the Cases that also wrote outside
    (held-out batch 57), under whatever trigger each has (batch 59: an inline scale stored through an fp32
    pointer, 4 * D bytes on, only where D % 4 == 0, keyed once with and once without that size rule). Only
    within one scale layout: wrong scales in a layout where none landed outside are another store's."""
    hosts = sorted(k for k in groups if same_effect(k) == "per-token-head:scales-misplaced")
    if not hosts:
        return
    layouts = {host: _scale_layouts(groups[host]) for host in hosts}

    def host_of(nodeid: str, f: Finding) -> tuple[str, str] | None:
        mine = _scale_layouts([(nodeid, f)])
        return next(((host, "") for host in hosts if mine and mine <= layouts[host]), None)
    for key in [k for k in groups if same_effect(k) == "per-token-head:scales"]:
        _move(groups, key, host_of)


#: K's and V's names for one argument, made one in a raise's message (`_merge_kv_raises`).
KV_NAMES = re.compile(r"\b(?:[kv]_(scale|cache)|(key|value)_cache|(key|value))\b")


def _kv_error(key: str, groups: Groups) -> str:
    """A raise's error line with K's and V's argument names made one; '' where it names neither."""
    def one(line: str) -> str:
        return KV_NAMES.sub(lambda m: f"X_{m.group(1)}" if m.group(1) else "X_cache" if m.group(2) else "X", line)
    lines = {error_line(f.excerpt or "") for _, f in groups[key]} - {""}
    made_one = {one(line) for line in lines}
    if len(made_one) != 1 or not any(KV_NAMES.search(line) for line in lines):
        return ""
    return made_one.pop()


def _merge_kv_raises(groups: Groups) -> None:
    """One refusal of K's argument and the same of V's (`k_scale must be ... got shape (1,)`, `v_scale must ...`)
    under two triggers (H above 1; a 0-d k_scale beside a [1] v_scale, the call that reaches V's check) are one
    defect: under the key of the most failures (held-out batch 57)."""
    by_error: dict[str, list[str]] = {}
    for key in [k for k in groups if class_of(k) == "raises"]:
        error = _kv_error(key, groups)
        if error:
            by_error.setdefault(error, []).append(key)
    for keys in by_error.values():
        if len(keys) > 1:
            host = max(keys, key=lambda k: (len(groups[k]), "@" in k))
            for key in keys:
                if key != host:
                    _move(groups, key, lambda _n, _f, host=host: (host, " (the same refusal)"))


#: Of the ways an invalid argument gets through, the one a defect of several is listed under.
VALIDATION_ORDER = ("validation:accepted", "validation:writes", "validation:other-exception", "validation:unnamed",
                    "validation:wrong-error", "validation:crash")


def _merge_validation_kinds(groups: Groups) -> None:
    """One missing check shows several ways on its own argument class: a shape that slips through, another that
    fails later with a RuntimeError (held-out batch 57: v's shape never checked). A validation key seen only in
    argument classes another one was seen in is that one's symptom (the first of VALIDATION_ORDER, of equals)."""
    def seen(key: str) -> frozenset[str]:
        return frozenset(f.facts.get("mutation", "") for _, f in groups.get(key, []))
    for key in [k for k in VALIDATION_ORDER[::-1] if k in groups]:
        hosts = [h for h in VALIDATION_ORDER if h != key and h in groups and seen(key) <= seen(h)
                 and (seen(key) < seen(h) or VALIDATION_ORDER.index(h) < VALIDATION_ORDER.index(key))]
        if hosts:
            _move(groups, key, lambda _n, _f, host=hosts[0]: (host, " (the same argument classes)"))


def _merge_raised_before_checks(groups: Groups) -> None:
    """An invalid call that raises, unnamed or of another type, the very error a valid call raises (a [1] scale
    refused before any check: held-out batch 57) never reached the argument's check: a symptom of that raise."""
    raises = {}
    for key in [k for k in groups if class_of(k) == "raises"]:
        for _, f in groups[key]:
            line = error_line(f.excerpt or "")
            if line:
                raises.setdefault(line, set()).add(key)
    for key in [k for k in groups if k in ("validation:unnamed", "validation:wrong-error",
                                             "validation:other-exception")]:
        def host_of(_n: str, f: Finding) -> tuple[str, str] | None:
            hosts = raises.get(f.facts.get("error", ""), set())
            return (next(iter(hosts)), " (the error a valid call raises)") if len(hosts) == 1 else None
        _move(groups, key, host_of)


def _merge_same_exception(groups: Groups) -> None:
    """A raise that no replay tied to a trigger (raised under a graph capture, or only where the tensors share
    one buffer: inputs sliced from one qkv tensor are strided; a big-cache test, never replayed whole) is a
    symptom of the one diagnosed raise of the same exception type, or, of several, of the one whose whole trigger
    its Cases have."""
    def etype(key: str) -> str:
        if class_of(key) != "raises" or ":" not in key:
            return ""
        raised = {f.facts.get("exception") for _, f in groups[key] if f.facts.get("exception")}
        return raised.pop() if len(raised) == 1 else key.split("@", 1)[0].split(":")[1].strip()
    for key in [k for k in groups if class_of(k) == "raises" and "@" not in k]:
        hosts = [k for k in groups if "@" in k and etype(k) and etype(k) == etype(key)]
        if len(hosts) > 1:  # several: the one whose whole trigger its Cases have (a big-cache test's uint8 cache)
            hosts = [h for h in hosts if _holds_trigger(groups[key], h)]
        if len(hosts) == 1:
            _move(groups, key, lambda _n, _f, host=hosts[0]: (host, ""))


def pytest_command(nodeid: str, base: dict[str, str]) -> str:
    """The command that reruns one test of the run (derandomized: the same examples, the same failure)."""
    env = " ".join(f"{k}={v}" for k, v in base.get("env", {}).items())
    return f"{env} python -m pytest -p no:cacheprovider '{nodeid}' {base.get('args', '')}".strip()


def _matches(node: Node, module: str, test: str, params: tuple[tuple[str, str], ...]) -> bool:
    return (node.module == module and (test == "*" or node.test == test)
            and all(node.params.get(k) == v for k, v in params))


def cell_for(row: InputClass, nodes: dict[str, Node], defects: list[Defect], ran: set[str],
             argument: bool = False) -> dict[str, Any]:
    """The capability cell of one row: status, detail, the defects behind it and the tests that decided it."""
    if row.transform is not None:
        mine = [n for n in nodes.values() if n.nodeid.startswith(PROBE_TEST) and n.params.get("row") == row.id]
        family = "capabilities"
    else:
        mine = [n for n in nodes.values() if any(_matches(n, *t) for t in row.tests)]
        family = row.tests[0][0].removeprefix("test_")
    out: dict[str, Any] = {"group": row.group, "id": row.id, "row": row.title, "defects": [],
                           "tests": sorted(n.nodeid for n in mine)}
    if not mine:
        why = "the run stopped at its budget first" if family in ran else f"family {family} not selected"
        return {**out, "status": "not run", "detail": why}
    failed = [n for n in mine if n.outcome in ("failed", "crashed")]
    if failed:
        keys = {f.key for n in failed for f in n.findings}
        found = [d for d in defects if d.key in keys]
        status = max((d.cell for d in found), key=lambda c: RANK.get(c, 0)) if found else "wrong bytes"
        if argument:  # the argument's own finding says how (the defect groups several arguments)
            ids = {d.key: d.id for d in found}
            detail = "; ".join(dict.fromkeys(f"{ids.get(f.key, '?')} {f.title}" for n in failed for f in n.findings))
        else:
            detail = "; ".join(f"{d.id} {d.title}" for d in found)
        return {**out, "status": status, "detail": detail, "defects": [d.id for d in found]}
    passed = [n for n in mine if n.outcome == "passed"]
    if passed:
        return {**out, "status": "validates" if argument else "conforms", "detail": ""}
    reason = next((n.skip for n in mine if n.skip), "skipped")
    if "CUDA" in reason and not reason.startswith("needs CUDA"):
        reason = f"needs CUDA: {reason}"
    return {**out, "status": "not applicable", "detail": reason}


def build(meta: dict[str, Any], records: list[dict[str, Any]], rows: list[InputClass], arg_rows: list[InputClass],
          cases_dir: Path, failures: Path | None, replay_base: dict[str, str], ran: set[str],
          fresh: Fresh | None = None) -> dict[str, Any]:
    """The whole report as a JSON-ready dict (schema: docs/conformance.md)."""
    nodes = nodes_from(records, failures)
    defects = defects_from(nodes, cases_dir, replay_base, fresh)
    capabilities = [cell_for(r, nodes, defects, ran) for r in rows]
    capabilities += [cell_for(r, nodes, defects, ran, argument=True) for r in arg_rows]
    outcomes = Counter(n.outcome for n in nodes.values())
    report = dict(meta)
    report["schema"] = SCHEMA
    report["run"] = {**meta.get("run", {}), "tests": {k: outcomes.get(k, 0) for k in
                                                     ("passed", "failed", "skipped", "crashed")}}
    slowest = sorted(nodes.values(), key=lambda n: -n.diagnosis_seconds)[:5]
    report["run"]["diagnosis"] = {"seconds": round(sum(n.diagnosis_seconds for n in nodes.values()), 1),
                                  "slowest": [[n.nodeid.split("::", 1)[-1], round(n.diagnosis_seconds, 1)]
                                              for n in slowest if n.diagnosis_seconds]}
    report["capabilities"] = capabilities
    report["defects"] = [d.to_dict() for d in defects]
    starved = sum(d.key == OUT_OF_MEMORY for d in defects)
    report["verdict"] = verdict(capabilities, len(defects) - starved, outcomes.get("passed", 0), starved)
    return report


def verdict(capabilities: list[dict[str, Any]], defects: int, passed: int, starved: int = 0) -> str:
    """The report's one-line verdict: its defects, and whether every row ran."""
    if starved:
        return (f"incomplete: {defects} defect{'s' * (defects != 1)} in what ran, and tests the GPU's memory "
                "stopped (other processes held it): rerun with the GPU to itself")
    unrun = [c for c in capabilities if c.get("status") == "not run"]
    # Why they did not run: families left out (--families), or the budget (--budget)
    unselected = sum("not selected" in c.get("detail", "") for c in unrun)
    why = ("families not selected" if unselected == len(unrun) else "raise --budget" if not unselected
           else "raise --budget, or select their families")
    if defects:
        return f"{defects} defect{'s' * (defects != 1)}" + (
            f" in what ran; incomplete: {len(unrun)} of {len(capabilities)} rows did not run ({why})"
            if unrun else "")
    if unrun:  # "conforms" only for what was actually run, all of it
        return (f"incomplete: no defect in what ran, but {len(unrun)} of {len(capabilities)} rows did "
                f"not run ({why})")
    if not passed:
        return "incomplete: no defect, but no test passed either (every one skipped?)"
    return "conforms"


# -- markdown ---------------------------------------------------------------------------------------

def _cell_text(c: dict[str, Any]) -> str:
    text = c["status"]
    if c["detail"]:
        text += f": {c['detail']}"
    return text.replace("|", "\\|").replace("\n", " ")


def _minutes(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def markdown(r: dict[str, Any]) -> str:
    impl, recipe, env, run = r["impl"], r["recipe"], r["environment"], r["run"]
    tests = run["tests"]
    lines = [f"# Conformance report: `{impl['name']}`", "",
             f"**Verdict: {r['verdict']}.**", "", "| | |", "|---|---|",
             f"| implementation | `{impl['spec']}` |",
             f"| convention | {impl['convention']} |",
             f"| recipe | {recipe['held'] + ': ' if recipe['held'] else ''}{recipe['note']} |",
             f"| device | {env['device']}: {env['backend']} |",
             f"| encoder | {impl.get('encoder') or 'not applicable (not the fused kernel)'} |",
             f"| versions | torch {env['torch']}, triton {env['triton']}, Python {env['python']}, hypothesis "
             f"{env['hypothesis']}; GPU {env['gpu']} (CUDA {env['cuda']}) |",
             f"| run | {_minutes(run['seconds'])}; {tests['passed']} passed, {tests['failed']} failed, "
             f"{tests['skipped']} skipped, {tests['crashed']} crashed; families: {', '.join(run['families'])} |",
             f"| examples | {run['examples']} |"]
    diagnosis = run.get("diagnosis") or {}
    if diagnosis.get("seconds"):  # summed over xdist workers: it can exceed the run's wall time
        slowest = ", ".join(f"`{t}` {s} s" for t, s in diagnosis["slowest"][:3])
        lines.append(f"| diagnosis | {_minutes(diagnosis['seconds'])} of replays in all (the failing tests' "
                     f"processes); slowest: {slowest} |")
    if run.get("cuts"):
        lines.append(f"| cut | {'; '.join(run['cuts'])} |")
    lines += ["", "## Capabilities", ""]
    for group, head in (("input classes", "input class"), ("argument contract", "invalid argument")):
        cells = [c for c in r["capabilities"] if c["group"] == group]
        if group == "argument contract":
            lines += ["", "### Argument contract (conformance/test_errors.py; float8 caches with no format argument)",
                      ""]
        lines += [f"| {head} | result |", "|---|---|"]
        lines += [f"| {c['row']} | {_cell_text(c)} |" for c in cells]
    lines += ["", "## Defects", ""]
    if not r["defects"]:
        lines.append("None.")
    for d in r["defects"]:
        lines += [f"### {d['id']}. {d['class_title']}: {d['title']}", "",
                  f"- key `{d['key']}`; shows as: {d['cell']}; failing tests: {d['count']}"]
        if d["detail"]:
            lines.append(f"- {d['detail']}")
        if d["case"]:
            lines.append(f"- smallest case: `{d['case']}` ({d['case_size']} elements)")
        lines.append(f"- replay: `{d['replay']}`")
        shown = d["tests"][:4]
        lines.append("- tests: " + ", ".join(f"`{t}`" for t in shown) +
                     (f" and {len(d['tests']) - len(shown)} more" if len(d["tests"]) > len(shown) else ""))
        if d["excerpt"]:
            lines += ["", "```", *d["excerpt"].splitlines()[:12], "```"]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# -- diff -------------------------------------------------------------------------------------------

def diff(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """(regressions, improvements, other changes) from old to new.

    A regression is a defect key in new that old lacks, or a capability cell whose rank (RANK) rose.
    A fixed defect or a cell whose rank fell is an improvement; anything else that changed (a cell to
    or from "not applicable" / "not run", a row only one report has) is listed as other.
    """
    worse, better, other = [], [], []
    old_d = {d["key"]: d for d in old.get("defects", [])}
    new_d = {d["key"]: d for d in new.get("defects", [])}
    worse += [f"new defect {d['id']} [{k}]: {d['class_title']}: {d['title']}" for k, d in new_d.items()
              if k not in old_d]
    better += [f"fixed defect {d['id']} [{k}]: {d['class_title']}: {d['title']}" for k, d in old_d.items()
               if k not in new_d]
    old_c = {c["id"]: c for c in old.get("capabilities", [])}
    new_c = {c["id"]: c for c in new.get("capabilities", [])}
    for key in dict.fromkeys([*old_c, *new_c]):
        a, b = old_c.get(key), new_c.get(key)
        if a is None or b is None:
            other.append(f"row {key}: only in the {'new' if a is None else 'old'} report")
            continue
        if a["status"] == b["status"]:
            continue
        line = f"{b['group']}: {b['row']}: {a['status']} -> {b['status']}"
        ra, rb = RANK.get(a["status"]), RANK.get(b["status"])
        if ra is None or rb is None:
            other.append(line)
        elif rb > ra:
            worse.append(line + (f" ({b['detail']})" if b["detail"] else ""))
        elif rb < ra:
            better.append(line)
        else:
            other.append(line)
    return worse, better, other
