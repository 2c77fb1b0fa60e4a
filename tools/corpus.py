"""The defect corpus (examples/defects/) through `make conformance`: each report's defects against the catalogue.

Runs tools.conformance on every catalogue entry this machine can run (several at a time), and compares the
defects each report names outside the argument contract (`validation:*`) with the entry's expected
`effect@trigger` keys. Prints, and writes as markdown with --markdown, one row an entry and the totals:
precision (named defects that are expected), recall (expected defects that are named), and the entries whose
report is exactly right (every one-defect entry one defect, every pair two, every control none).

    python -m tools.corpus --mode quick                 # the CPU entries, few examples (what CI runs)
    python -m tools.corpus --mode full --parallel 4     # every entry the machine can run, default budgets
    python -m tools.corpus --from a/rows.jsonl,b/rows.jsonl --markdown t.md   # one table from earlier runs
    python -m tools.corpus --skip-from a/rows.jsonl --out b       # the rest of a run cut short
Exit status: 0 when every entry's report is exactly right, 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tools import _cli

ROOT = Path(__file__).resolve().parents[1]
CATALOGUE = ROOT / "examples" / "defects" / "catalogue.py"
#: The quick mode: the families where the corpus's defects show, a few examples each, the quick identification
#: sweep (on CUDA also the graph and big-cache families, where a host sync and 32-bit offsets show).
QUICK = ["--examples", "6", "--probe-examples", "3", "--sweep", "quick"]
QUICK_FAMILIES = {"cpu": "capabilities,bit_exact,isolation,equivalence",
                  "cuda": "capabilities,bit_exact,isolation,equivalence,graphs,bigcache"}


def load_catalogue() -> Any:
    spec = importlib.util.spec_from_file_location("kvfp8_defect_catalogue", CATALOGUE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected_key(effect: str, trigger: str) -> str:
    """The report key of a catalogue (effect, trigger), as the diagnosis makes it (diagnose.identity)."""
    from conformance.diagnosis.diagnose import VALUE_CLASSES, class_of, identity
    from conformance.diagnosis.effects import Effect
    dims = [t for t in trigger.split("+") if t and t != "plain"]
    return identity(Effect(effect, "", value=class_of(effect) in VALUE_CLASSES), dims)


#: conformance/diagnosis/classify.py's key for a test the GPU's memory stopped: the machine's, not a defect
OUT_OF_MEMORY = "unclassified:out-of-memory"


def found_keys(report: dict[str, Any]) -> list[str]:
    """The defects a report names outside the argument contract."""
    return [d["key"] for d in report.get("defects", []) if not d["key"].startswith("validation:")
            and d["key"] != OUT_OF_MEMORY]


def _cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    except ImportError:
        return False


def run_entry(entry: dict[str, Any], cat: Any, out: Path, mode: str, jobs: str, interpreted: bool,
              extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """One report: the expected and found keys, the verdict and the time."""
    spec = cat.spec(entry)
    args = [sys.executable, "-m", "tools.conformance", spec, "--out", str(out), "--jobs", jobs]
    if entry.get("opt_in"):
        args += ["--convention", entry["opt_in"]]
    if mode == "quick":
        args += QUICK + ["--families", QUICK_FAMILIES["cpu" if interpreted else "cuda"]]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KVFP8_"))}
    if mode == "quick":
        env["KVFP8_SHRINK_SECONDS"] = "5"
    env.update(extra_env or {})
    started = time.perf_counter()
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    name = f"{Path(entry['file']).stem}.{entry['function']}"
    path = out / f"{name}.json"
    expected = sorted({expected_key(e, t) for e, t in cat.effects(entry, interpreted)})
    row = {"file": entry["file"], "causes": entry["causes"], "expected": expected, "seconds": round(seconds, 1)}
    if done.returncode < 0 or "KeyboardInterrupt" in done.stderr[-4000:]:
        # stopped from outside (a time limit's SIGINT reaches the whole process group): no verdict, and no
        # row for --skip-from to take as done (an H100 run lost eight entries so)
        row["interrupted"] = True
    if not path.exists():
        error = (done.stdout + done.stderr)[-800:]
        # a card other reports filled before this one's first CUDA call (its identification): the machine's
        return {**row, "found": [], "error": error,
                "verdict": "out of GPU memory" if "out of memory" in error else "no report"}
    report = json.loads(path.read_text())
    found = sorted(set(found_keys(report)))
    row.update(found=found, recipe=report["recipe"]["held"], report=str(path.with_suffix(".md")),
               incomplete="incomplete" in report["verdict"])
    starved = any(d["key"] == OUT_OF_MEMORY for d in report.get("defects", []))
    row["verdict"] = "out of GPU memory" if starved else "exact" if found == expected else "wrong"
    return row


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    tp = sum(len(set(r["found"]) & set(r["expected"])) for r in rows)
    fp = sum(len(set(r["found"]) - set(r["expected"])) for r in rows)
    fn = sum(len(set(r["expected"]) - set(r["found"])) for r in rows)
    by = {c: [r for r in rows if r["causes"] == c] for c in (0, 1, 2)}
    return {"entries": len(rows), "exact": sum(r["verdict"] == "exact" for r in rows),
            "precision": tp / (tp + fp) if tp + fp else 1.0, "recall": tp / (tp + fn) if tp + fn else 1.0,
            "true": tp, "false": fp, "missed": fn,
            "controls exact": f"{sum(r['verdict'] == 'exact' for r in by[0])} of {len(by[0])}",
            "one-defect exact": f"{sum(r['verdict'] == 'exact' for r in by[1])} of {len(by[1])}",
            "pairs exact": f"{sum(r['verdict'] == 'exact' for r in by[2])} of {len(by[2])}",
            "seconds max": max((r["seconds"] for r in rows), default=0),
            "seconds mean": round(sum(r["seconds"] for r in rows) / max(len(rows), 1), 1)}


def markdown(rows: list[dict[str, Any]], summary: dict[str, Any], header: str) -> str:
    lines = [header, "", f"Precision {summary['precision']:.3f} ({summary['true']} of "
             f"{summary['true'] + summary['false']} named defects expected), recall {summary['recall']:.3f} "
             f"({summary['true']} of {summary['true'] + summary['missed']} expected defects named); exact reports: "
             f"{summary['exact']} of {summary['entries']} (controls {summary['controls exact']}, one-defect "
             f"{summary['one-defect exact']}, pairs {summary['pairs exact']}); seconds per report: mean "
             f"{summary['seconds mean']}, max {summary['seconds max']}.", "",
             "| file | expected | named by the report (outside the argument contract) | verdict | s |",
             "|---|---|---|---|---|"]
    for r in rows:
        fmt = lambda keys: ", ".join(f"`{k}`" for k in keys) or "none"
        lines.append(f"| `{r['file']}` | {fmt(r['expected'])} | {fmt(r['found'])} | {r['verdict']} | {r['seconds']} |")
    return "\n".join(lines) + "\n"


def _rows(files: str) -> list[dict[str, Any]]:
    """The rows of comma-separated rows.jsonl files, in order."""
    return [json.loads(line) for f in files.split(",") for line in Path(f).read_text().splitlines() if line]


def main(argv: list[str] | None = None) -> int:
    parser = _cli.parser("corpus", __doc__)
    parser.add_argument("--mode", choices=("quick", "full"), default="quick")
    parser.add_argument("--needs", choices=("cpu", "cuda"), default=None,
                        help="which entries: cpu (the CPU ones), cuda (all); default: what this machine can run")
    parser.add_argument("--only", default="", help="entries whose file name contains this text (comma-separated)")
    parser.add_argument("--parallel", type=int, default=1, help="reports at a time")
    parser.add_argument("--jobs", default="1", help="pytest-xdist workers of each report")
    parser.add_argument("--out", default=os.environ.get("OUT", "reports/corpus"))
    parser.add_argument("--markdown", default=None, help="also write the table to this file")
    parser.add_argument("--from", dest="saved", default="",
                        help="no run: the table of rows.jsonl files saved by earlier runs (comma-separated; "
                             "an entry in several: the last file's row)")
    parser.add_argument("--skip-from", default="",
                        help="run only the entries without a row in these rows.jsonl files (comma-separated): "
                             "the rest of a run cut short")
    parser.add_argument("--longest-first", default="",
                        help="start the entries in decreasing order of their seconds in these rows.jsonl files "
                             "(comma-separated; an entry without a row first): a run under a time limit then "
                             "loses quick reports, not slow ones, and ends sooner")
    args = parser.parse_args(argv)
    if args.saved:
        latest = {}  # an entry in several files: the last file's row (a re-run after a fix)
        for f in args.saved.split(","):
            for line in Path(f).read_text().splitlines():
                if line:
                    row = json.loads(line)
                    latest[row["file"]] = {**row, "from": f}
        order = {e["file"]: i for i, e in enumerate(load_catalogue().CATALOGUE)}  # the catalogue's order
        rows = sorted(latest.values(), key=lambda r: order.get(r["file"], len(order)))
        return publish(rows, f"## Corpus: the rows of {args.saved}", args.markdown)
    cat = load_catalogue()
    cuda = _cuda()
    needs = args.needs or ("cuda" if cuda else "cpu")
    entries = [e for e in cat.CATALOGUE if needs == "cuda" or e["needs"] == "cpu"]
    if args.only:
        entries = [e for e in entries if any(o in e["file"] for o in args.only.split(","))]
    if args.skip_from:
        done_files = {r["file"] for r in _rows(args.skip_from)}
        entries = [e for e in entries if e["file"] not in done_files]
    if args.longest_first:
        seconds = {r["file"]: r["seconds"] for r in _rows(args.longest_first)}
        entries.sort(key=lambda e: -seconds.get(e["file"], float("inf")))
    if not entries:
        print("corpus: no entry selected", file=sys.stderr)
        return 2
    out = Path(args.out) / args.mode
    out.mkdir(parents=True, exist_ok=True)
    done = out / "rows.jsonl"  # a row as each report ends: a run cut short keeps what it finished
    done.write_text("")

    def run(entry: dict[str, Any]) -> dict[str, Any]:
        row = run_entry(entry, cat, out, args.mode, args.jobs, not cuda)
        if not row.get("interrupted"):
            with done.open("a") as f:
                f.write(json.dumps(row) + "\n")
        return row

    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        rows = list(pool.map(run, entries))
    header = (f"## Corpus: {args.mode} mode, {'CUDA' if cuda else 'CPU (Triton interpreter)'}, {len(rows)} entries\n\n"
              f"`python -m tools.corpus --mode {args.mode} --parallel {args.parallel} --jobs {args.jobs}`")
    (out / "corpus.json").write_text(json.dumps({"rows": rows, "totals": totals(rows)}, indent=1))
    return publish(rows, header, args.markdown)


def publish(rows: list[dict[str, Any]], header: str, markdown_path: str | None) -> int:
    """Print the rows and totals, write the markdown table if asked; 0 when every report is exact."""
    for r in rows:
        print(f"{r['verdict']:9s} {r['file']:55s} expected {r['expected']} found {r['found']} ({r['seconds']} s)")
        if r.get("error"):
            print("   " + r["error"].replace("\n", "\n   "))
    summary = totals(rows)
    print(json.dumps(summary))
    if markdown_path:
        Path(markdown_path).write_text(markdown(rows, summary, header))
    return 0 if summary["exact"] == summary["entries"] else 1


if __name__ == "__main__":
    sys.exit(main())
