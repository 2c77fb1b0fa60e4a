"""Fresh-process replays: whether a defect depends on the calls made before it.

A kernel that keeps state between calls (a reciprocal memoized by the scale tensor's address, a launch
cached with the first call's scale) writes bytes that depend on what came before. In a run of thousands
of calls its failures read as many unrelated defects, each a chance fit of one call's bytes. The
experiment: replay a defect's smallest Case in a fresh Python process (`python -m tools.repro`), where it
is the implementation's first call. A Case that fails in the run and passes there is a defect of the
history, not of the call (conformance.diagnosis.report merges every such defect into one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: One replay's limit: a fresh process imports torch and compiles (or interprets) one kernel variant.
TIMEOUT_S = 240

#: case file -> True (passes in a fresh process), False (fails there too), None (no answer)
Fresh = Callable[[list[str]], dict[str, bool | None]]


def _replay(path: str, env: Mapping[str, str]) -> bool | None:
    try:
        done = subprocess.run([sys.executable, "-m", "tools.repro", path, "-n", "1"], cwd=ROOT, env=dict(env),
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None
    return {0: True, 1: False}.get(done.returncode)


def replayer(env: Mapping[str, str] | None = None, jobs: int | None = None) -> Fresh:
    """A Fresh that replays each case file in its own process, `jobs` at a time (half the cores by default),
    with the run's environment (`env` over os.environ: the encoder, the interpreter)."""
    full = {**os.environ, **(env or {})}
    workers = jobs or max(1, (os.cpu_count() or 2) // 2)

    def fresh(paths: list[str]) -> dict[str, bool | None]:
        unique = sorted(set(paths))
        with ThreadPoolExecutor(workers) as pool:
            return dict(zip(unique, pool.map(lambda p: _replay(p, full), unique)))
    return fresh
