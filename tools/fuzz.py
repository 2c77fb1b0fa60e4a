"""A HypoFuzz campaign over every property of the suite: `make fuzz [FUZZ_ARGS=...]`.

    python -m tools.fuzz [--minutes M] [-n N] [--profile P] [--dashboard [--port 9999]] [MODULE ...]
                         [-- PYTEST_ARGS]

Processes: one per visible GPU on CUDA, each pinned to its GPU (CUDA_VISIBLE_DEVICES set before it
starts: HypoFuzz numbers no workers, so each GPU gets a HypoFuzz hub of its own with one worker,
and the hubs share their corpus and failures through the example database); else one per core,
under one hub. All of them read and write the project's database (conformance/database.py:
$KVFP8_HYPOTHESIS_DB and the shared databases of docs/database.md) under a Hypothesis profile that
has one ($HYPOTHESIS_PROFILE, default `thorough`; HypoFuzz skips derandomized tests such as `ci`'s).

HypoFuzz runs until stopped: --minutes bounds the campaign (0: until Ctrl-C). At the end, a summary
(examples and examples/s per process, the failures in the database with a replay command) goes to
stdout and to $OUT/fuzz-summary.{md,json} (else reports/fuzz/); each hub's log goes beside it.
The dashboard (--dashboard) is HypoFuzz's own web page over the same database; it needs no other
package, but is off by default: a headless runner has nobody to look at it, and --dashboard-only
serves it later, over the finished campaign's database, without fuzzing.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from conformance.database import DIR_ENV
from conformance.pinning import visible_devices
from tools import _cli

ROOT = Path(__file__).resolve().parent.parent
# HypoFuzz's CLI with the 'spawn' start method: its hub collects the tests (importing torch and
# kernel, which asks CUDA for its devices) before it forks its workers, and CUDA in a child forked
# after that may fail to initialize. Spawned workers start clean, through start_worker below.
BOOT = ("import multiprocessing, sys\n"
        "multiprocessing.set_start_method('spawn')\n"
        "import hypofuzz.hypofuzz, tools.fuzz\n"
        "hypofuzz.hypofuzz._start_worker = tools.fuzz.start_worker\n"
        "from hypofuzz.entrypoint import fuzz\n"
        "fuzz.main(sys.argv[1:], prog_name='hypothesis fuzz')\n")
GRACE_S = 20


def hypofuzz_compat() -> None:
    """Coverage of the product only, and three fixes for HypoFuzz 25.11.1 workers, applied in each
    worker process (start_worker):
    - HypoFuzz keeps an input for its coverage only when a re-execution covers the same branches.
      torch, Triton and the suite's strategies cache per shape, so the first run of an input always
      takes branches its repeat does not: traced everywhere, no kernel property ever grew a corpus
      (0 behaviors after 100 examples each), leaving blind random generation. Only kernel/ is
      traced, and on Python < 3.12 (sys.settrace) other code is not even line-traced;
    - it reads `slice_comments`, which Hypothesis (6.170 here) calls `span_comments`: without an
      alias a worker dies at the end of its first shrink, leaving the failure unshrunk;
    - it reuses a test's FixtureRequest when it comes back to that test, after tearing down every
      fixture: pytest then finds the old, torn-down `device` and the worker dies ("The fixture value
      for "device" is not available"). pytest makes a new request for every run (_initrequest);
    - a worker tells the hub which tests it still fuzzes only after a batch of 100 examples (or a
      whole shrink), and the hub quits, printing "Found a failing input for every test!", when no
      worker has told it anything at its minutely check: a slow batch (the CPU interpreter, CUDA
      compiling the first kernels) ended the campaign after a minute or two. Workers now report
      before each batch."""
    import hypofuzz.coverage as coverage
    from hypofuzz.hypofuzz import FuzzTarget, FuzzWorker
    from hypothesis.internal.conjecture.data import ConjectureData, ConjectureResult

    if getattr(FuzzWorker, "_kvfp8_compat", False):
        return
    FuzzWorker._kvfp8_compat = True
    traced, product = coverage.should_trace, str(ROOT / "kernel") + os.sep
    coverage.should_trace = functools.cache(lambda name: name.startswith(product) and traced(name))
    line_trace = coverage.CoverageCollector.trace_pre_312

    def trace_product_frames(self: Any, frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and not coverage.should_trace(frame.f_code.co_filename):
            return None  # no line events for this frame
        return line_trace(self, frame, event, arg)

    coverage.CoverageCollector.trace_pre_312 = trace_product_frames

    if not hasattr(ConjectureResult, "slice_comments") and hasattr(ConjectureResult, "span_comments"):
        ConjectureResult.slice_comments = property(lambda self: self.span_comments)
        ConjectureData.slice_comments = property(lambda self: self.span_comments,
                                                 lambda self, value: setattr(self, "span_comments", value))
    enter = FuzzTarget._enter_fixtures

    def enter_with_a_new_request(self: FuzzTarget) -> None:
        if hasattr(self.pytest_item, "_initrequest"):
            self.pytest_item._initrequest()
        enter(self)

    FuzzTarget._enter_fixtures = enter_with_a_new_request
    update = FuzzWorker._update_targets

    def update_and_report(self: FuzzWorker, nodeids: Any) -> None:
        update(self, nodeids)
        self.shared_state["worker_state"]["valid_nodeids"] = [t.nodeid for t in self.valid_targets]

    FuzzWorker._update_targets = update_and_report


def start_worker(**kwargs: Any) -> None:
    """HypoFuzz's worker process entry point, after hypofuzz_compat()."""
    hypofuzz_compat()
    from hypofuzz.hypofuzz import _start_worker

    _start_worker(**kwargs)


def out_dir() -> Path:
    return _cli.out_dir(ROOT / "reports" / "fuzz", create=False)


def property_modules() -> list[str]:
    """Every module of conformance/ holding a property (@given): the campaign's default targets."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "conformance").glob("test_*.py")
                  if "@given(" in p.read_text())


def cuda_devices() -> list[str]:
    """The GPUs to fuzz on (CUDA_VISIBLE_DEVICES entries); [] when the kernel runs interpreted."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return []
    return visible_devices()


def plan(processes: int, devices: list[str]) -> list[tuple[int, dict[str, str]]]:
    """(HypoFuzz processes, environment overrides) for each hub: one hub per pinned process on
    CUDA, round robin over the GPUs; one hub with every process on the CPU."""
    if devices:
        return [(1, {"CUDA_VISIBLE_DEVICES": devices[i % len(devices)]}) for i in range(processes)]
    return [(processes, {})]


def hub_env(profile: str, overrides: dict[str, str], total: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_WORKER"}
    env["HYPOTHESIS_PROFILE"] = profile
    # Like conftest.py's one torch thread per xdist worker: N fuzzing processes each spinning
    # a full-width torch thread pool oversubscribe the cores.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // total)))
    env.update(overrides)
    return env


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGINT each process group, then SIGKILL what is left after GRACE_S."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGINT)
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


class Hub:
    """One `hypothesis fuzz` process tree, its log, and how often it was restarted."""

    def __init__(self, index: int, n: int, overrides: dict[str, str], env: dict[str, str],
                 pytest_args: list[str], folder: Path) -> None:
        self.cmd = [sys.executable, "-c", BOOT, "-n", str(n), "--no-dashboard", "--", *pytest_args]
        self.env, self.log_path, self.restarts = env, folder / f"fuzz-hub{index}.log", -1
        self.log_path.write_text(f"# {' '.join(f'{k}={v}' for k, v in overrides.items())} "
                                 f"hypothesis fuzz {' '.join(self.cmd[3:])}\n")
        self.start()

    def start(self) -> None:
        self.restarts += 1
        self.started = time.monotonic()
        with open(self.log_path, "a") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def running(self) -> bool:
        """False once it is done. A hub also quits when its workers died (it then prints "Found a
        failing input for every test!" all the same), so any exit after 30 s is restarted until
        the deadline: the database keeps the corpus and the failures, and the new hub goes on
        where the last stopped. A quicker exit is a broken setup (a collection error: see the log)."""
        if self.proc.poll() is None:
            return True
        if time.monotonic() - self.started < 30:
            return False
        self.start()
        return True


def run_campaign(args: argparse.Namespace, pytest_args: list[str], folder: Path) -> tuple[float, list[Hub]]:
    """Start the hubs (and the dashboard), stop them after --minutes; returns (seconds, hubs)."""
    hubs = [Hub(i, n, overrides, hub_env(args.profile, overrides, args.processes), pytest_args, folder)
            for i, (n, overrides) in enumerate(plan(args.processes, args.devices))] if not args.dashboard_only else []
    dashboard = None
    if args.dashboard or args.dashboard_only:
        cmd = [sys.executable, "-c", BOOT, "--dashboard-only", "--host", args.host, "--port", str(args.port),
               "--", *pytest_args]
        dashboard = subprocess.Popen(cmd, cwd=ROOT, env=hub_env(args.profile, {}, 1), start_new_session=True)
    started = time.monotonic()
    deadline = started + args.minutes * 60 if args.minutes > 0 else float("inf")
    try:
        while time.monotonic() < deadline and (any([hub.running() for hub in hubs])  # a list: ask each hub
                                                or (dashboard and not hubs and dashboard.poll() is None)):
            time.sleep(1)
    except KeyboardInterrupt:
        print("\nstopping the campaign", flush=True)
    finally:
        _stop([hub.proc for hub in hubs] + ([dashboard] if dashboard else []))
    return time.monotonic() - started, hubs


def summarize(pytest_args: list[str], since: float) -> dict[str, Any]:
    """Examples per HypoFuzz process (its reports saved since `since`) and the failures in the database."""
    from hypofuzz.collection import collect_tests
    from hypofuzz.database import FailureState, HypofuzzDatabase
    from hypothesis import settings
    from hypothesis.internal.conjecture.data import Status

    collection = collect_tests(pytest_args)  # the test -> database key map, and the database
    db = HypofuzzDatabase(settings().database)
    per_worker: dict[str, dict[str, list[float]]] = defaultdict(dict)  # worker -> test -> [examples, s]
    failures, skipped = [], []
    for target in collection.fuzz_targets:
        found = None  # when this campaign's first report counting a failing example was saved
        for report in db.reports.fetch(target.database_key):
            if report.timestamp < since:
                continue
            if report.status_counts.get(Status.INTERESTING, 0) and (found is None or report.timestamp < found):
                found = report.timestamp
            seen = per_worker[report.worker_uuid].get(target.nodeid, [0, 0.0])
            if report.elapsed_time >= seen[1]:  # reports are cumulative: keep the latest
                per_worker[report.worker_uuid][target.nodeid] = [sum(report.status_counts.values()),
                                                                 report.elapsed_time]
        # Hypothesis's own runs share these keys (conformance/database.py) and save examples without
        # HypoFuzz's observations: count them all, describe the failure from an observation.
        entry: dict[str, Any] = {"test": target.nodeid, "error": "", "example": "",
                                 "found_after_s": round(found - since) if found else None}
        for state in (FailureState.SHRUNK, FailureState.UNSHRUNK):
            stored = list(db.failures(state=state).fetch(target.database_key))
            entry[state.name.lower()] = len(stored)
            for choices in stored:
                obs = db.failure_observations(state=state).fetch(target.database_key, choices)
                if obs is not None and not entry["error"]:
                    entry.update(error=obs.status_reason, example=obs.representation)
        fatal = db.fatal_failures.fetch(target.database_key)
        if fatal is not None:
            entry.update(error="fatal: " + fatal.traceback.strip().splitlines()[-1], fatal=True)
        if _is_skip(entry["error"]):  # HypoFuzz stores a test's pytest.skip like a failure
            skipped.append(entry)
        elif entry["shrunk"] or entry["unshrunk"] or fatal is not None:
            failures.append(entry)
    workers = {w: {"examples": int(sum(e for e, _ in tests.values())),
                   "seconds_in_tests": round(sum(s for _, s in tests.values()), 1), "tests": sorted(tests)}
               for w, tests in per_worker.items()}
    return {"fuzzed": [t.nodeid for t in collection.fuzz_targets],
            "not_fuzzed": {k: v["status_reason"] for k, v in collection.not_collected.items()},
            "workers": workers, "failures": failures, "skipped": skipped}


def _is_skip(reason: str) -> bool:
    """True for a pytest.skip (`Skipped: ...`, or with its module path), which is no failure."""
    return re.match(r"^([\w.]*\.)?Skipped\b", reason) is not None


def markdown(summary: dict[str, Any]) -> str:
    c = summary["campaign"]
    lines = [f"# HypoFuzz campaign ({c['started']}, {c['seconds']:.0f} s, {c['processes']} processes"
             f"{', GPUs ' + ','.join(c['devices']) if c['devices'] else ', CPU'}; profile {c['profile']}; "
             f"hub restarts {c['hub_restarts']})", "",
             f"Fuzzed {len(summary['fuzzed'])} tests; not fuzzed: {len(summary['not_fuzzed'])} "
             f"({', '.join(sorted(set(summary['not_fuzzed'].values()))) or 'none'}).", "",
             "| process | examples | examples/s (wall) | tests touched |", "|---|---|---|---|"]
    for uuid, w in summary["workers"].items():
        rate = w["examples"] / max(c["seconds"], 1)
        lines.append(f"| {uuid[:8]} | {w['examples']} | {rate:.2f} | {len(w['tests'])} |")
    total = sum(w["examples"] for w in summary["workers"].values())
    lines.append(f"| all ({c['processes']} at a time) | {total} | {total / max(c['seconds'], 1) / c['processes']:.2f} "
                 f"a process | {len({t for w in summary['workers'].values() for t in w['tests']})} |")
    lines += ["", f"## Failures in the database ({len(summary['failures'])})", ""]
    for f in summary["failures"]:
        when = f"; first reported {f['found_after_s']} s in" if f["found_after_s"] is not None else ""
        lines.append(f"- `{f['test']}` ({f['shrunk']} shrunk, {f['unshrunk']} unshrunk{when}): "
                     f"{f['error'] or 'saved by a pytest run'}")
    if summary["skipped"]:
        lines += ["", "Skipped, not failures (HypoFuzz stores a skip like a failing example): "
                  + ", ".join(f"`{f['test']}`" for f in summary["skipped"])]
    if summary["failures"]:
        lines += ["", "Replay one (Hypothesis replays the database's example first, shrinks it and writes "
                      f"the failure file): `{replay_command('TEST', summary['extra_args'])}`"]
    return "\n".join(lines) + "\n"


def replay_command(test: str, extra: list[str]) -> str:
    """The command that replays `test` from this campaign's database, with the campaign's pytest arguments."""
    db = os.environ.get(DIR_ENV)
    prefix = f"{DIR_ENV}={shlex.quote(db)} " if db else ""
    return " ".join([f"{prefix}HYPOTHESIS_PROFILE=dev python -m pytest -p no:cacheprovider", shlex.quote(test),
                     *map(shlex.quote, extra)])


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = _cli.parser("fuzz", __doc__)
    p.add_argument("modules", nargs="*", help="test modules or node ids (default: every property module)")
    p.add_argument("--minutes", type=float, default=0, help="stop after this long (default 0: until Ctrl-C)")
    p.add_argument("-n", "--processes", type=int, default=None,
                   help="fuzzing processes (default: one per GPU on CUDA, else one per core)")
    p.add_argument("--profile", default=os.environ.get("HYPOTHESIS_PROFILE") or "thorough",
                   help="a Hypothesis profile with the example database (default $HYPOTHESIS_PROFILE, else thorough)")
    p.add_argument("--dashboard", action="store_true", help="also serve HypoFuzz's dashboard")
    p.add_argument("--dashboard-only", action="store_true", help="serve the dashboard over the database, no fuzzing")
    p.add_argument("--host", default="localhost")
    p.add_argument("--port", type=int, default=9999)
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = p.parse_args(argv)
    if args.profile == "ci":
        p.error("the ci profile is derandomized and has no database: HypoFuzz would skip every test")
    args.devices = cuda_devices()
    args.processes = args.processes or len(args.devices) or os.cpu_count() or 1
    args.extra = extra
    return args, [*(args.modules or property_modules()), "-p", "no:cacheprovider", *extra]


def main(argv: list[str] | None = None) -> int:
    args, pytest_args = parse(argv)
    if importlib.util.find_spec("hypofuzz") is None:
        print("fuzz: needs hypofuzz: make install (or pip install -e '.[fuzz]'; offline: docs/fuzz.md's wheels)",
              file=sys.stderr)
        return 2
    folder = out_dir()
    layout = plan(args.processes, args.devices)
    where = "pinned to GPUs " + ",".join(env["CUDA_VISIBLE_DEVICES"] for _, env in layout) if args.devices else "on CPU"
    print(f"fuzz: {args.processes} processes in {len(layout)} hub(s) {where}; "
          f"profile {args.profile}; {args.minutes or 'unlimited'} min; logs in {folder}\n"
          f"fuzz: pytest args {' '.join(pytest_args)}", flush=True)
    if args.dry_run:
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    if os.environ.get("KVFP8_GITHUB_DB"):
        # Download GPU CI's artifact once, here: every fuzzing process shares one cache folder, and
        # processes pruning its older zips at once would race (docs/database.md).
        from conformance.database import example_database
        list(example_database().fetch(b"kvfp8-fuzz-warm-up"))
    since, wall_start = time.time(), time.strftime("%Y-%m-%d %H:%M:%S %Z")
    seconds, hubs = run_campaign(args, pytest_args, folder)
    if args.dashboard_only:
        return 0
    os.environ["HYPOTHESIS_PROFILE"] = args.profile  # the summary's collection loads the same database
    summary = summarize(pytest_args, since)
    summary["extra_args"] = args.extra
    summary["campaign"] = {"started": wall_start, "seconds": round(seconds, 1), "processes": args.processes,
                           "devices": args.devices, "profile": args.profile,
                           "hub_restarts": [hub.restarts for hub in hubs]}
    (folder / "fuzz-summary.json").write_text(json.dumps(summary, indent=1))
    text = markdown(summary)
    (folder / "fuzz-summary.md").write_text(text)
    print(text, flush=True)
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
