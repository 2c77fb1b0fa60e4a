"""Failure artifacts: the shrunk Case as self-contained JSON, and the command that replays it.

A failure file holds everything a replay needs on another machine: the Case (every drawn
parameter, the value seed, the overrides, the recipe), the implementation (its spec and fixed
keyword arguments, e.g. the encoder), the test that failed, the environment it failed in (torch,
triton, hypothesis, backend, GPU), the report it printed and, when the values were overwritten
after `build` (the exhaustive property's every pattern), the fill that did it. Only Hypothesis's final, shrunk
example is written, and the file name is stable for (test, implementation, Case), so a red run
leaves one file per failing test.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

import torch

from conformance.impls import FUSED_SPEC, Implementation
from kernel.backend import describe
from strategies.case import Case

FAILURES_ENV = "KVFP8_FAILURES"
DEFAULT_DIR = "failures"
FORMAT = 2  # bump when a field changes meaning (2: seeded values by integer hashing, strategies.build)
#: A failure file's optional "fill": how the values of the Case's built tensors were overwritten after
#: `build`, by name -> "module:function" (Built -> Built, applied to the reference's and the
#: implementation's builds alike). The exhaustive property's Case holds every pattern this way.
FILLS = {"all-patterns": "conformance.test_exhaustive:fill_patterns"}


def failures_dir() -> Path:
    """Where failure files go: $KVFP8_FAILURES, else ./failures."""
    return Path(os.environ.get(FAILURES_ENV, DEFAULT_DIR))


def _is_final_example() -> bool:
    """True outside Hypothesis, or on the last (shrunk) example Hypothesis replays."""
    try:
        from hypothesis.control import current_build_context
    except ImportError:
        return True
    try:
        return bool(current_build_context().is_final)
    except Exception:  # InvalidArgument: not inside a Hypothesis test at all
        return True


def current_test() -> str:
    """The pytest node id of the running test ('' outside pytest)."""
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]


def environment() -> dict[str, Any]:
    import hypothesis
    import triton
    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__, "triton": triton.__version__,
        "hypothesis": hypothesis.__version__, "python": platform.python_version(),
        "backend": describe(),
        "gpu": torch.cuda.get_device_name() if cuda else "none",
        "capability": ".".join(map(str, torch.cuda.get_device_capability())) if cuda else "none",
        "cuda": torch.version.cuda or "none",
        "host": platform.node(),
    }


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:60]


def failure_path(case: Case, impl: Implementation, test: str, extra: dict | None = None) -> Path:
    """failures/<test>-<impl>-<hash>.json; the hash is over (test, impl, Case, extra)."""
    key = json.dumps([test, impl.name, impl.kwargs, case.to_dict(), extra or {}], sort_keys=True, default=str)
    digest = hashlib.sha1(key.encode()).hexdigest()[:10]
    test_name = test.rsplit("::", 1)[-1].split("[", 1)[0] or "case"
    return failures_dir() / f"{_slug(test_name)}-{_slug(impl.name)}-{digest}.json"


def replay_command(path: Path | str) -> str:
    return f"python -m tools.repro {path}"


def fill_function(name: str | None):
    """The function a failure file's "fill" names (FILLS), or None for the Case's own values."""
    if not name:
        return None
    if name not in FILLS:
        raise ValueError(f"unknown fill {name!r} (this version knows {', '.join(FILLS)}): its values cannot be "
                         "rebuilt; replay it with the suite version that wrote it")
    module, attr = FILLS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def save_failure(case: Case, impl: Implementation, report: str, final: bool = False, fill: str | None = None,
                 extra: dict | None = None) -> str:
    """Write the failure file and return the lines to print: its path and the replay command.

    `fill` (a FILLS name) says how the Case's values were overwritten after `build`. `extra`: more fields
    of the record (a per-token-head call's "pth_case", which tools.repro replays instead of the Case).
    Returns '' for the intermediate examples Hypothesis tries while shrinking (unless `final`).
    """
    if fill is not None and fill not in FILLS:
        raise ValueError(f"unknown fill {fill!r}: add it to conformance.artifacts.FILLS")
    if not (final or _is_final_example()):
        return ""
    test = current_test()
    path = failure_path(case, impl, test, extra)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "format": FORMAT,
        "case": case.to_dict(),
        "impl": {"name": impl.name, "spec": impl.spec or impl.name, "kwargs": impl.kwargs,
                 "convention": impl.convention.name},
        "test": test,
        "environment": environment(),
        "report": report,
    }
    if fill:
        record["fill"] = fill
    record |= extra or {}
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return f"failure case saved: {path}\nreplay: {replay_command(path)}   (or: make repro CASE={path})"


def load_case(path: str | Path) -> tuple[Case, dict[str, Any]]:
    """Read a failure file (or a bare Case JSON); returns the Case and the whole record.

    Files written before the impl became a dict (impl as a name, impl_kwargs beside it) still load.
    """
    record = json.loads(Path(path).read_text())
    if "case" not in record:
        record = {"case": record}
    elif record.get("format", 1) < 2:
        raise ValueError(f"{path} is a format-{record.get('format', 1)} failure file: its seeded values came from "
                         "torch's CPU generator, which this version no longer uses, so its bytes cannot be "
                         "rebuilt; replay it with the suite version that wrote it")
    impl = record.get("impl")
    if isinstance(impl, str):
        kwargs = record.get("impl_kwargs", {})
        spec = FUSED_SPEC if impl.startswith("fused-") and "encoder" in kwargs else impl
        record["impl"] = {"name": impl, "spec": spec, "kwargs": kwargs}
    return Case.from_dict(record["case"]), record
