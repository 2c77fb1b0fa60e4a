"""The mutant catalogue still applies to the current kernel source (cheap: no kernel runs).

When kernel/ changes, a mutant whose anchor no longer occurs exactly once is stale: this test
names it, so the catalogue is updated together with the code (`make mutants` would only report it).
"""

from __future__ import annotations

import ast

import pytest

from tools.mutant_catalogue import MUTANTS, Mutant
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
