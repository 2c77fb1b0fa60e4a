"""Compare two conformance reports: `python -m tools.conformance_diff OLD.json NEW.json`
(or `make conformance-diff OLD=... NEW=...`).

Prints what got worse, what got better and what else changed (conformance.diagnosis.report.diff says how each
is decided; docs/conformance.md too). Exit status: 1 when something got worse (a new defect, or a
capability cell whose rank rose), 0 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from conformance.diagnosis.report import SCHEMA, diff
from tools._cli import parser

#: Schemas this version reads: version 1's keys had no trigger, so its defects never match version 2's
#: by key (the capability cells still compare).
READABLE = ("kvfp8-conformance-report/1", SCHEMA)


def _load(path: str) -> dict:
    report = json.loads(Path(path).read_text())
    if report.get("schema") not in READABLE:
        raise ValueError(f"{path} is not a {SCHEMA} report (schema {report.get('schema')!r})")
    return report


def main(argv: list[str] | None = None) -> int:
    p = parser("conformance_diff", __doc__)
    p.add_argument("old", help="the earlier report (JSON)")
    p.add_argument("new", help="the later report (JSON)")
    args = p.parse_args(argv)
    try:
        old, new = _load(args.old), _load(args.new)
    except (OSError, ValueError) as exc:
        print(f"tools.conformance_diff: {exc}", file=sys.stderr)
        return 2
    if old["impl"]["name"] != new["impl"]["name"]:
        print(f"note: comparing {old['impl']['name']} with {new['impl']['name']}")
    if old["schema"] != new["schema"]:
        print(f"note: {old['schema']} against {new['schema']}: defect keys changed meaning, compare their titles")
    worse, better, other = diff(old, new)
    for title, lines in (("worse", worse), ("better", better), ("changed", other)):
        print(f"{title} ({len(lines)}):")
        for line in lines:
            print(f"  {line}")
    print(f"{'REGRESSION' if worse else 'no regression'}: {old['verdict']} -> {new['verdict']}")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
