"""Suite throughput: examples per second for each property, and the kernel variants compiled.

The harness calls `record()` once per example. Each process (an xdist worker, or the lone process)
writes its counts to reports/stats/<run>/ when its session ends, where <run> is the controller's
process id (passed to the workers in $KVFP8_STATS_RUN, so two runs side by side in one checkout keep
apart); the controller adds them up, prints one table at the end of the run and removes the folder.
Registered as a pytest plugin from conftest.py.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import defaultdict
from pathlib import Path

import pytest

STATS_DIR = Path(os.environ.get("KVFP8_REPORTS", "reports")) / "stats"
_examples: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])  # test -> [examples, seconds]
_started = time.perf_counter()


def record(seconds: float) -> None:
    """Count one example of the running test, taking `seconds`."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0].split("[")[0]
    entry = _examples[test]
    entry[0] += 1
    entry[1] += seconds


def compiled_variants() -> int:
    """Kernel variants this process compiled or loaded (0 under the interpreter)."""
    from kernel.triton_kernel import fp8_kv_write
    caches = getattr(fp8_kv_write, "device_caches", {})
    return sum(len(entry[0]) for entry in caches.values())


RUN_ENV = "KVFP8_STATS_RUN"


def _worker_id(config: pytest.Config) -> str:
    return getattr(config, "workerinput", {}).get("workerid", "main")


def _run_dir() -> Path:
    return STATS_DIR / os.environ.get(RUN_ENV, str(os.getpid()))


def pytest_configure(config: pytest.Config) -> None:
    if _worker_id(config) == "main":  # before xdist starts its workers, which inherit the variable
        os.environ[RUN_ENV] = str(os.getpid())
        shutil.rmtree(_run_dir(), ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    folder = _run_dir()
    folder.mkdir(parents=True, exist_ok=True)
    data = {"examples": dict(_examples), "compiled": compiled_variants(),
            "seconds": time.perf_counter() - _started}
    (folder / f"{_worker_id(session.config)}.json").write_text(json.dumps(data))


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    folder = _run_dir()
    if _worker_id(config) != "main" or not folder.exists():
        return
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    compiled = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        compiled.append(data["compiled"])
        for test, (n, secs) in data["examples"].items():
            totals[test][0] += n
            totals[test][1] += secs
    shutil.rmtree(folder, ignore_errors=True)
    if not totals:
        return
    tr = terminalreporter
    tr.section("kvfp8 throughput (examples through check_case)")
    for test, (n, secs) in sorted(totals.items()):
        rate = n / secs if secs else float("inf")
        tr.write_line(f"{test:<70} {int(n):6d} examples {secs:8.1f} s {rate:8.1f} /s")
    tr.write_line(f"kernel variants compiled or loaded: {sum(compiled)} over {len(compiled)} process(es), "
                  f"at most {max(compiled)} in one")
