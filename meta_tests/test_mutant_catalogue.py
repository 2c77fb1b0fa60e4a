"""The mutant catalogue applies to the current kernel source, and docs/mutants.md's kill table is the
one it generates (cheap: no kernel runs).

When kernel/ changes, a mutant whose anchor no longer occurs exactly once is stale: this test
names it, so the catalogue is updated together with the code (`make mutants` would only report it).
"""

from __future__ import annotations

import ast

import pytest

from tools.mutant_catalogue import MUTANTS, Mutant, classes, dump_kills, load_kills, markdown, merge_kills
from tools.mutants import ROOT, mutated_sources, stale_reasons

REQUIRED_TIERS = {"cpu", "gpu"}


def test_catalogue_size_and_names():
    names = [m.name for m in MUTANTS]
    assert len(names) >= 25, f"the catalogue has {len(names)} mutants, fewer than 25"
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert not duplicates, f"duplicate mutant names: {duplicates}"
    assert {m.tier for m in MUTANTS} == REQUIRED_TIERS, f"tiers: {sorted({m.tier for m in MUTANTS})}"


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_applies_and_parses(mutant: Mutant):
    reasons = stale_reasons(mutant)
    assert not reasons, f"mutant {mutant.name} is stale: {'; '.join(reasons)}"
    for path, text in mutated_sources(mutant).items():
        original = (ROOT / path).read_text()
        assert text != original, f"mutant {mutant.name} does not change {path}"
        ast.parse(text, filename=f"{path} ({mutant.name})")  # a mutant must be a bug, not a SyntaxError
    assert mutant.kill_hint, f"mutant {mutant.name} has no kill_hint (the input that would kill it)"


def test_every_mutant_has_a_class_and_every_recorded_result_a_mutant():
    cls = classes()
    assert all(cls.get(m.name) for m in MUTANTS), [m.name for m in MUTANTS if not cls.get(m.name)]
    record = load_kills()
    assert set(record["kills"]) <= {m.name for m in MUTANTS}, set(record["kills"]) - {m.name for m in MUTANTS}
    assert {k["run"] for k in record["kills"].values()} == set(record["runs"])


def test_docs_kill_table_is_the_generated_one():
    table = markdown(load_kills())
    assert table in (ROOT / "docs" / "mutants.md").read_text(), (
        "docs/mutants.md's kill table is not `python -m tools.mutant_catalogue --markdown`'s output: paste it in")


def test_a_recorded_run_replaces_the_results_it_has(tmp_path):
    a, b = MUTANTS[0].name, MUTANTS[1].name
    old = {"runs": {"r1": {"date": "d1", "machine": "m", "command": "c1"}},
           "kills": {a: {"run": "r1", "result": "killed", "killed_by": "t", "seconds": 1},
                     b: {"run": "r1", "result": "killed", "killed_by": "t", "seconds": 2}}}
    new = {"runs": {"r2": {"date": "d2", "machine": "m", "command": "c2"}},
           "kills": {a: {"run": "r2", "result": "survived", "killed_by": "", "seconds": 3}}}
    merged = merge_kills(old, new)
    assert merged["kills"][a]["run"] == "r2" and merged["kills"][b]["run"] == "r1"
    path = tmp_path / "k.json"
    path.write_text(dump_kills(merge_kills(merged, {"runs": new["runs"], "kills": {b: new["kills"][a]}})))
    assert set(load_kills(path)["runs"]) == {"r2"}, "a run no result points to is dropped"
