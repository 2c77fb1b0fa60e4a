"""docs/results/ stays current: its README indexes every file there, and every `docs/results/...` path a
doc, tool, test or the code names exists (superseded files go to git history, not to dead links)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"


def test_the_index_names_every_result():
    index = (RESULTS / "README.md").read_text()
    missing = [p.name for p in RESULTS.iterdir() if p.name != "README.md" and p.name not in index]
    assert not missing, f"docs/results/README.md does not index {missing}"


def test_every_named_result_exists():
    sources = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("docs/results/*.md")]
    for folder in ("kernel", "tools", "meta_tests", "conformance", "examples", "strategies"):
        sources += (ROOT / folder).rglob("*.py")
    dead = set()
    for path in sources:
        for name in re.findall(r"docs/results/([\w.*-]+)", path.read_text()):
            name = name.rstrip(".")
            if name and not any(RESULTS.glob(name)):  # a glob, as in facts-*.md, names at least one file
                dead.add(f"{path.relative_to(ROOT)}: docs/results/{name}")
    assert not dead, f"links to files not in docs/results/: {sorted(dead)}"
