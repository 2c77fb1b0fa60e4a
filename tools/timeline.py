"""Sum up a run's timeline (conformance/timeline.py): startup, how busy each worker was, and when.

    KVFP8_TIMELINE=/tmp/tl.txt make test
    python -m tools.timeline /tmp/tl.txt [--bin 10] [--slowest 10]

Prints, in markdown: the seconds from the first process's start to its first test, one row per
process (configured, collected, first test, last test, tests, busy seconds and % of the test phase),
the average number of busy workers in each `--bin`-second slice of the test phase, and the slowest
tests. Workers idle while tests remain point at scheduling; busy workers with a long wall point at
the tests themselves, and a CPU time far below the busy time at tests that wait (on the GPU, on
another process).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tools._cli import parser


@dataclass
class Process:
    name: str
    marks: dict[str, float] = field(default_factory=dict)  # first time of each event
    tests: list[tuple[str, float, float]] = field(default_factory=list)  # (node id, start, finish)
    cpu: float = 0.0  # CPU seconds of its tests (subprocesses included), where the timeline has them
    compiles: list[tuple[float, bool, str]] = field(default_factory=list)  # (seconds, on-disk cache hit, variant)
    specs: dict[str, str] = field(default_factory=dict)  # variant -> `kernel;NAME=value,...;wN`, where written
    _open: dict[str, float] = field(default_factory=dict)

    @property
    def busy(self) -> float:
        return sum(end - start for _, start, end in self.tests)


def read(path: Path) -> dict[str, Process]:
    """The timeline's processes by name, times in seconds from its first line."""
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split(" ", 3)
        if len(parts) >= 3:
            rows.append((float(parts[0]), parts[1], parts[2], parts[3] if len(parts) > 3 else ""))
    t0 = min((r[0] for r in rows), default=0.0)
    procs: dict[str, Process] = {}
    for t, name, event, what in sorted(rows):
        p = procs.setdefault(name, Process(name))
        p.marks.setdefault(event, t - t0)
        if event == "start":
            p._open[what] = t - t0
        elif event == "cpu":
            p.cpu += float(what)
        elif event == "compile":
            seconds, hit, *variant = what.split()
            p.compiles.append((float(seconds), hit == "hit", variant[0] if variant else "?"))
            if len(variant) > 1:
                p.specs[variant[0]] = variant[1]
        elif event == "finish" and what in p._open:
            p.tests.append((what, p._open.pop(what), t - t0))
    return procs


def busy_by_slice(workers: list[Process], start: float, end: float, width: float) -> list[tuple[float, float]]:
    """(slice start, average busy workers) for each `width`-second slice of [start, end)."""
    out = []
    s = start
    while s < end:
        e = min(s + width, end)
        covered = sum(max(0.0, min(e, b) - max(s, a)) for w in workers for _, a, b in w.tests)
        out.append((s, covered / (e - s)))
        s = e
    return out


def _fields(spec: str) -> tuple[str, dict[str, str]]:
    name, fields, warps = (spec.split(";") + ["", ""])[:3]
    out = dict(f.split("=", 1) for f in fields.split(",") if "=" in f)
    return name, out | {"num_warps": warps.removeprefix("w")}


def compile_volume(specs: dict[str, str]) -> list[str]:
    """Which specializations multiply the compiled variants: per kernel, the variants, and for each
    constexpr (pointer dtype, warps) its distinct values and how many variants would stay were it one
    value (a runtime argument instead of a constexpr, say)."""
    by_kernel: dict[str, list[dict[str, str]]] = {}
    for spec in specs.values():
        name, fields = _fields(spec)
        by_kernel.setdefault(name, []).append(fields)
    lines = []
    for name, variants in sorted(by_kernel.items(), key=lambda kv: -len(kv[1])):
        lines += ["", f"{name}: {len(variants)} variants", "",
                  "| specialization | values | variants were it one value |", "|---|---|---|"]
        keys = sorted({k for v in variants for k in v})
        for key in keys:
            values = sorted({v.get(key, "") for v in variants})
            kept = {tuple(sorted((k, x) for k, x in v.items() if k != key)) for v in variants}
            lines.append(f"| {key} | {len(values)}: {', '.join(values[:8])}{' ...' if len(values) > 8 else ''} "
                         f"| {len(kept)} |")
    return lines


def summary(procs: dict[str, Process], width: float = 10.0, slowest: int = 10) -> str:
    workers = [p for name, p in procs.items() if name != "main"] or list(procs.values())
    tests = [t for w in workers for t in w.tests]
    if not tests:
        return "no finished test in the timeline"
    first, last = min(a for _, a, _ in tests), max(b for _, _, b in tests)
    phase = last - first
    lines = [f"first test at {first:.1f} s; tests ran {phase:.1f} s, to {last:.1f} s; "
             f"{len(tests)} tests on {len(workers)} worker(s), {sum(w.busy for w in workers):.0f} s busy in all "
             f"(an average of {sum(w.busy for w in workers) / max(phase, 1e-9):.1f} busy)", "",
             "| process | configured s | collected s | first test s | last test s | tests | busy s | busy % | CPU s |",
             "|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: "-" if v is None else f"{v:.1f}"
    for w in sorted(workers, key=lambda w: (len(w.name), w.name)):
        ends = [b for _, _, b in w.tests]
        lines.append(f"| {w.name} | {fmt(w.marks.get('configure'))} | {fmt(w.marks.get('collected'))} | "
                     f"{fmt(w.marks.get('start'))} | {fmt(max(ends) if ends else None)} | {len(w.tests)} | "
                     f"{w.busy:.1f} | {100 * w.busy / max(phase, 1e-9):.0f} | {w.cpu:.1f} |")
    compiles = [c for w in workers for c in w.compiles]
    if compiles:
        missed = [s for s, hit, _ in compiles if not hit]
        variants = {v for _, _, v in compiles if v != "?"}
        lines += ["", f"Triton compilations: {len(compiles)} ({sum(s for s, _, _ in compiles):.1f} s), of which "
                      f"{len(missed)} compiled from scratch ({sum(missed):.1f} s) and {len(compiles) - len(missed)} "
                      f"loaded from the on-disk cache"
                      + (f"; {len(variants)} distinct variants" if variants else "")]
        lines += compile_volume({v: s for w in workers for v, s in w.specs.items()})
    lines += ["", "busy workers by slice: " + ", ".join(f"{s:.0f} s: {b:.1f}"
                                                       for s, b in busy_by_slice(workers, first, last, width))]
    lines += ["", "| slowest tests | s |", "|---|---|"]
    for name, a, b in sorted(tests, key=lambda t: t[1] - t[2])[:slowest]:
        lines.append(f"| {name} | {b - a:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser("timeline", __doc__)
    p.add_argument("file", type=Path, help="the file $KVFP8_TIMELINE named")
    p.add_argument("--bin", type=float, default=10.0, help="seconds per slice of the busy-worker line")
    p.add_argument("--slowest", type=int, default=10, help="how many of the slowest tests to list")
    args = p.parse_args(argv)
    print(summary(read(args.file), args.bin, args.slowest))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
