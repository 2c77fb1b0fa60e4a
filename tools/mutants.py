"""Mutation testing: apply each catalogued bug to a copy of the repository and run the suite on it.

    python -m tools.mutants [--tier cpu|gpu] [--only NAME[,NAME]] [--budget SECONDS] [-j N]

Each mutant runs in its own temporary copy (the live tree is never edited): pytest `-x` over the
selected property modules, cheapest first, with a derandomized Hypothesis profile and a per-mutant
wall-clock budget. The table (mutant, killed/survived, the killing test, time, the shrunk failing
Case) goes to stdout and to $OUT/mutants.md (else reports/mutants.md), the results to mutants.json
beside it (`python -m tools.mutant_catalogue --record` merges them into docs/results/mutants.json);
the shrunk Cases are copied next to it. Exit status: 0 when every selected mutant is killed and none
is stale, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tools._cli import comma_list, out_dir, parser
from tools.mutant_catalogue import MUTANTS, Mutant, dump_kills
from tools.sanitize import error_counts, sanitizer_command, sanitizer_env

ROOT = Path(__file__).resolve().parent.parent
# Not copied into a mutant's tree: .venv (make install's, 2 GB; the copy runs with this interpreter).
EXCLUDE = {".git", ".venv", ".hypothesis", "failures", "reports", "__pycache__", ".ruff_cache", ".pytest_cache"}

# Cheapest killers first: -x stops at the first failure, so order is kill speed.
CPU_MODULES = (
    "conformance/test_ties.py",
    "conformance/test_bit_exact.py",
    "conformance/test_isolation.py",
    "conformance/test_repeat.py",
    "conformance/test_errors.py",
    "conformance/test_overlap.py",  # the only killer of overlap checks that reject disjoint pools
    "conformance/test_equivalence.py",
    "conformance/test_exhaustive.py",
    "conformance/test_fidelity.py",
    "conformance/test_per_token_head.py",  # the per-token-head mutants only (its own kernel)
    "conformance/test_e5m2.py",  # last: the e5m2 mutants only (no other module draws an e5m2 cache)
    "conformance/test_fnuz.py",  # the fnuz mutants only (no other module draws an e4m3fnuz cache)
)
# On CUDA the GPU-only modules go first: test_bigcache takes seconds and test_graphs replays every
# recipe, while test_exhaustive's full CUDA product takes minutes when seven mutants share the GPU,
# and mutants queued behind it time out (docs/mutants.md: the GPU tier's first run had the other order).
GPU_MODULES = ("conformance/test_bigcache.py", "conformance/test_graphs.py") + CPU_MODULES + (
    "conformance/test_compile.py",
)
MEMCHECK_MODULES = ("conformance/test_bit_exact.py",)

# The harness's own Hypothesis profile, registered when pytest loads this module with
# `-p tools.mutants` (before conftest.py reads $HYPOTHESIS_PROFILE): the `ci` profile's examples
# (25, derandomized, so CI would draw the same ones) without shrinking, which under the
# interpreter costs minutes per kill. `--shrink` uses the `ci` profile itself.
MUTANT_PROFILE = "mutants"
try:
    from hypothesis import HealthCheck, Phase, settings

    settings.register_profile(MUTANT_PROFILE, max_examples=25, derandomize=True, database=None,
                              deadline=None, print_blob=False, suppress_health_check=list(HealthCheck),
                              phases=(Phase.explicit, Phase.generate))
except ImportError:  # the catalogue check needs no Hypothesis
    pass


@dataclass
class Result:
    mutant: Mutant
    status: str  # killed | survived | masked | timeout | stale | broken | baseline-red | passed (baseline)
    killer: str = ""
    message: str = ""
    seconds: float = 0.0
    cases: list[str] = field(default_factory=list)
    failed_tests: list[str] = field(default_factory=list)  # the baseline's failing test (it runs -x too)


# -- applying a mutant ---------------------------------------------------------------------------
def stale_reasons(mutant: Mutant, root: Path = ROOT) -> list[str]:
    """Why the mutant cannot be applied to the source under root (empty when it applies)."""
    reasons = []
    texts: dict[str, str] = {}
    for e in mutant.edits:
        path = root / e.path
        if not path.exists():
            reasons.append(f"{e.path} does not exist")
            continue
        text = texts.setdefault(e.path, path.read_text())
        n = text.count(e.anchor)
        if n != 1:
            reasons.append(f"anchor occurs {n} times in {e.path}: {e.anchor!r}")
        elif e.anchor == e.replacement:
            reasons.append(f"replacement equals the anchor in {e.path}")
        else:
            texts[e.path] = text.replace(e.anchor, e.replacement)
    return reasons


def mutated_sources(mutant: Mutant, root: Path = ROOT) -> dict[str, str]:
    """path -> mutated text (raises ValueError if stale)."""
    reasons = stale_reasons(mutant, root)
    if reasons:
        raise ValueError(f"mutant {mutant.name} is stale: " + "; ".join(reasons))
    texts: dict[str, str] = {}
    for e in mutant.edits:
        text = texts.get(e.path, (root / e.path).read_text())
        texts[e.path] = text.replace(e.anchor, e.replacement)
    return texts


def copy_repo(dst: Path) -> Path:
    ignore = lambda _dir, names: [n for n in names if n in EXCLUDE or n.endswith((".pyc", ".egg-info"))]
    shutil.copytree(ROOT, dst, ignore=ignore, symlinks=True)
    return dst


# -- running ---------------------------------------------------------------------------------------
def _env(copy: Path, profile: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("KVFP8_IMPL", None)  # the suite must test the (mutated) fused kernel
    env.update(HYPOTHESIS_PROFILE=profile, KVFP8_FAILURES=str(copy / "failures"),
               PYTHONDONTWRITEBYTECODE="1", KVFP8_HYPOTHESIS_DB=str(copy / ".hypothesis"))
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """Run in its own process group; on timeout kill the group. Returns (rc or None, output)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out


def _junit_failures(path: Path) -> list[tuple[str, str]]:
    """(test id, first line of its message) of every failed or errored test, in run order."""
    if not path.exists():
        return []
    try:
        tree = ET.parse(path)
    except ET.ParseError:
        return []
    found = []
    for case in tree.iter("testcase"):
        for tag in ("failure", "error"):
            node = case.find(tag)
            if node is not None:
                test = f"{case.get('classname', '')}::{case.get('name', '')}".lstrip(":")
                text = node.get("message") or node.text or ""
                first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
                found.append((test, first[:160]))
    return found


def _pytest_cmd(modules: list[str], junit: Path, runner: str, stop_first: bool = True) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", *(["-x"] if stop_first else []), "-q", "-p", "no:cacheprovider",
           "-p", "no:xdist", "-p", "tools.mutants",
           f"--junitxml={junit}", *modules]
    return sanitizer_command("memcheck", cmd) if runner == "memcheck" else cmd


def run_one(mutant: Mutant | None, modules: list[str], budget: float, profile: str,
            cases_dir: Path) -> Result:
    """Run the suite on a mutated copy (mutant None: the baseline, which must pass)."""
    label = mutant or Mutant("(baseline)", "no mutation", ())
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvfp8-mutant-") as tmp:
        copy = copy_repo(Path(tmp) / "repo")
        if mutant is not None:
            reasons = stale_reasons(mutant, copy)
            if reasons:
                return Result(label, "stale", message="; ".join(reasons))
            for path, text in mutated_sources(mutant, copy).items():
                (copy / path).write_text(text)
        env = _env(copy, profile)
        if mutant is not None and mutant.runner == "memcheck":
            env = sanitizer_env(env)
        # The copy must import, and import itself (not the live tree), or the run means nothing.
        rc, out = _run([sys.executable, "-c", "import kernel; print(kernel.__file__)"], copy, env, 120)
        if rc != 0 or str(copy) not in out:
            return Result(label, "broken", message=out.strip().splitlines()[-1] if out.strip() else "no output",
                          seconds=time.monotonic() - start)
        present = [m for m in modules if (copy / m).exists()]
        junit = copy / "junit.xml"
        runner = mutant.runner if mutant is not None else "pytest"
        mods = [m for m in present if m in MEMCHECK_MODULES] if runner == "memcheck" else present
        rc, out = _run(_pytest_cmd(mods, junit, runner, stop_first=True), copy, env,
                       max(1.0, budget - (time.monotonic() - start)))
        seconds = time.monotonic() - start
        failures = _junit_failures(junit)
        test, message = failures[0] if failures else ("", "")
        saved = []
        for f in sorted((copy / "failures").glob("*.json")):
            dst = cases_dir / f"{label.name}-{f.name}"
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, dst)
            saved.append(str(dst))
        tail = "\n".join(out.strip().splitlines()[-3:])
        if rc is None:
            return Result(label, "timeout", test, message or f"budget of {budget:.0f} s spent", seconds, saved)
        if mutant is None:
            return Result(label, "passed" if rc == 0 else "baseline-red", test, message or tail, seconds, saved,
                          [f for f, _ in failures])
        if rc == 0:
            return Result(label, "survived", seconds=seconds)
        if runner == "memcheck" and any(error_counts(out)):
            return Result(label, "killed", test or "compute-sanitizer memcheck", message or tail, seconds, saved)
        if rc == 1 and test:  # pytest's "tests failed": a real failing test, named in the JUnit XML
            return Result(label, "killed", test, message, seconds, saved)
        if rc < 0:  # the test process died of a signal (a segfault from a wild write): the mutant did it
            return Result(label, "killed", test or f"(crash, signal {-rc})", message or tail, seconds, saved)
        # 2 interrupted, 3 internal error, 4 usage error, 5 no tests: the harness, not a kill.
        return Result(label, "broken", test, f"pytest exit {rc} with no failing test: {message or tail}", seconds,
                      saved)


# -- reporting -------------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(results: list[Result], tier: str, total: float, modules: list[str], profile: str,
          budget: float) -> str:
    killed = sum(r.status == "killed" for r in results)
    lines = [
        f"# Mutant kill report: tier {tier}",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; machine: {os.uname().nodename}, "
        f"{os.cpu_count()} cores; python {sys.version.split()[0]}",
        f"- modules (in order, `-x`): {', '.join(modules)}; Hypothesis profile `{profile}`; "
        f"budget {budget:.0f} s a mutant",
        f"- **{killed} of {len(results)} killed**; total wall time {total:.0f} s",
        "",
        "| mutant | tier | result | killed by | time (s) | shrunk case | first line of the failure / hint |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r.mutant
        tier_s = m.tier + (" (memcheck)" if m.runner == "memcheck" else "")
        note = r.message if r.status == "killed" else f"{r.message} would kill: {m.kill_hint}".strip()
        case = ", ".join(os.path.relpath(c, out_dir(ROOT / "reports")) for c in r.cases[:1])
        lines.append(f"| {m.name} | {tier_s} | {r.status} | {_cell(r.killer)} | {r.seconds:.0f} | "
                     f"{_cell(case)} | {_cell(note)} |")
    return "\n".join(lines) + "\n"


def mask_baseline_failures(results: list[Result], baseline: Result) -> None:
    """A kill by a test the unmutated copy also fails, on the same falsifying Case, is no kill.

    The examples are derandomized, so mutant and baseline draw the same sequence: the same saved
    Case means the mutant failed exactly where the baseline does (no evidence); a different Case
    means the mutant failed at an earlier example, which is a real kill. With -x no mutant gets
    past the baseline's first failure, so the baseline needs -x too.
    """
    base_cases = {Path(c).name.removeprefix(f"{baseline.mutant.name}-") for c in baseline.cases}
    for r in results:
        if r.status != "killed" or r.killer not in baseline.failed_tests:
            continue
        mine = {Path(c).name.removeprefix(f"{r.mutant.name}-") for c in r.cases}
        if not mine or mine <= base_cases:
            r.status = "masked"
            r.message = f"the baseline fails {r.killer} on the same case: no evidence. {r.message}"


def main(argv: list[str] | None = None) -> int:
    p = parser("mutants", __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tier", choices=("cpu", "gpu"), default="cpu",
                   help="cpu: the CPU-tier mutants under the interpreter; gpu: every mutant, GPU modules too")
    p.add_argument("--only", type=comma_list([m.name for m in MUTANTS]), default=(),
                   help="comma-separated mutant names")
    p.add_argument("--budget", type=float, default=600.0, help="wall-clock seconds per mutant")
    p.add_argument("-j", "--jobs", type=int, default=2, help="mutants run in parallel")
    p.add_argument("--profile", default=MUTANT_PROFILE,
                   help="Hypothesis profile for the runs (default: ci's examples, no shrinking)")
    p.add_argument("--shrink", action="store_true", help="use the ci profile: shrunk cases, slower kills")
    p.add_argument("--modules", type=comma_list(), default=(),
                   help="comma-separated test modules (default: the tier's list)")
    p.add_argument("--no-baseline", action="store_true", help="skip the unmutated run")
    p.add_argument("--check", action="store_true", help="only check that every anchor applies")
    args = p.parse_args(argv)

    if args.shrink:
        args.profile = "ci"
    chosen = [m for m in MUTANTS if args.tier == "gpu" or m.tier == "cpu"]
    if args.only:
        names = set(args.only)
        chosen = [m for m in MUTANTS if m.name in names]
    stale = {m.name: stale_reasons(m) for m in chosen}
    stale = {k: v for k, v in stale.items() if v}
    for name, reasons in stale.items():
        print(f"STALE mutant {name}: {'; '.join(reasons)}", file=sys.stderr)
    if args.check:
        print(f"{len(chosen) - len(stale)} of {len(chosen)} mutants apply")
        return 1 if stale else 0

    modules = list(args.modules) if args.modules else list(GPU_MODULES if args.tier == "gpu" else CPU_MODULES)
    modules = [m for m in modules if (ROOT / m).exists()]
    out = out_dir(ROOT / "reports")
    cases_dir = out / "mutant-cases"
    shutil.rmtree(cases_dir, ignore_errors=True)
    start = time.monotonic()
    jobs: list[Mutant | None] = ([] if args.no_baseline else [None]) + chosen
    print(f"{len(chosen)} mutants, {args.jobs} at a time, budget {args.budget:.0f} s each; modules: "
          f"{', '.join(modules)}", flush=True)

    def work(m: Mutant | None) -> Result:
        r = run_one(m, modules, args.budget if m is not None else 4 * args.budget, args.profile, cases_dir)
        print(f"  {r.mutant.name:32s} {r.status:9s} {r.seconds:6.0f} s  {r.killer}", flush=True)
        return r

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(work, jobs))
    total = time.monotonic() - start
    baseline = [r for r in results if r.mutant.name == "(baseline)"]
    results = [r for r in results if r.mutant.name != "(baseline)"]
    if baseline and baseline[0].status != "passed":
        mask_baseline_failures(results, baseline[0])
    report = table(results, args.tier, total, modules, args.profile, args.budget)
    if baseline:
        b = baseline[0]
        report += (f"\nBaseline (unmutated copy, -x): {b.status} in {b.seconds:.0f} s; failing tests: "
                   f"{', '.join(b.failed_tests) or 'none'}; {b.message}\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / "mutants.md").write_text(report)
    label = f"{args.tier}-{time.strftime('%Y-%m-%d-%H%M', time.gmtime())}"
    run = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": f"{os.uname().nodename}, {os.cpu_count()} cores, Python {sys.version.split()[0]}",
           "command": " ".join(["python -m tools.mutants", *(sys.argv[1:] if argv is None else argv)])}
    kills = {r.mutant.name: {"run": label, "result": r.status, "killed_by": r.killer, "seconds": round(r.seconds)}
             for r in results}
    (out / "mutants.json").write_text(dump_kills({"runs": {label: run}, "kills": kills}))
    print(report)
    print(f"written to {out / 'mutants.md'}")
    ok = all(r.status == "killed" for r in results) and not stale
    if baseline and baseline[0].status != "passed":
        print("BASELINE IS RED: the suite fails without any mutation; kills on the baseline's own failing "
              "case are reported as 'masked'", file=sys.stderr)
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
