"""Failure artifacts: the shrunk Case as self-contained JSON, and the command that replays it."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import torch

from kernel.backend import describe
from strategies.case import Case

FAILURES_ENV = "KVFP8_FAILURES"
DEFAULT_DIR = "failures"


def _is_final_example() -> bool:
    """True outside Hypothesis, or on the last (shrunk) example Hypothesis replays."""
    try:
        from hypothesis.control import current_build_context
        return current_build_context().is_final
    except Exception:
        return True


def environment() -> dict[str, str]:
    import hypothesis
    import triton
    return {
        "torch": torch.__version__, "triton": triton.__version__,
        "hypothesis": hypothesis.__version__, "python": platform.python_version(),
        "backend": describe(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
    }


def save_failure(case: Case, impl, report: str) -> str:
    """Write the Case (plus impl, environment and report) and return the replay instructions.

    Only the final, shrunk example is written, so a red run leaves one file per failing test.
    """
    if not _is_final_example():
        return ""
    folder = Path(os.environ.get(FAILURES_ENV, DEFAULT_DIR))
    folder.mkdir(parents=True, exist_ok=True)
    blob = case.to_json()
    path = folder / f"case-{hashlib.sha1(blob.encode()).hexdigest()[:12]}.json"
    record = {"case": case.to_dict(), "impl": impl.name, "impl_kwargs": impl.kwargs,
              "environment": environment(), "report": report}
    path.write_text(json.dumps(record, indent=1))
    return f"saved {path}\nreplay: make repro CASE={path}   (or: python -m tools.repro {path})"


def load_case(path: str | Path) -> tuple[Case, dict]:
    """Read a failure file (or a bare Case JSON); returns the Case and the whole record."""
    record = json.loads(Path(path).read_text())
    if "case" in record:
        return Case.from_dict(record["case"]), record
    return Case.from_dict(record), {"case": record}
