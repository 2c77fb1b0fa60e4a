"""Where a run's wall time goes: every process's start, collection and tests, as one line each.

With $KVFP8_TIMELINE set to a file, the controller and each xdist worker append lines
`<unix time> <process> <event> [<node id>]` to it (events: import, configure, collected, start,
cpu, finish, sessionfinish; `cpu` carries the CPU seconds the test took, its subprocesses such as
ptxas included, so a test that waits, on the GPU or on a lock, shows a wall far above its CPU time;
`compile` carries the seconds one Triton compilation took, from Triton's compilation listener where
the installed Triton has one, `hit` or `miss` for its on-disk cache, the variant's cache key and its
specialization: kernel, constexprs, pointer dtypes, warps);
unset, the plugin does nothing. `python -m tools.timeline FILE` sums it up: the time to the first
test, how busy each worker was, how long the tail ran, and the Triton compilations.
Registered as a pytest plugin from conftest.py.
"""

from __future__ import annotations

import os
import time
from typing import IO

import pytest

TIMELINE_ENV = "KVFP8_TIMELINE"
_out: IO[str] | None = None
_cpu_at_start = 0.0


def _write(event: str, what: str = "") -> None:
    global _out
    path = os.environ.get(TIMELINE_ENV)
    if not path:
        return
    if _out is None:  # appends of one short line each, from several processes: line-buffered
        _out = open(path, "a", buffering=1)  # noqa: SIM115 (kept open for the whole session)
    _out.write(f"{time.time():.3f} {os.environ.get('PYTEST_XDIST_WORKER', 'main')} {event} {what}".rstrip() + "\n")


def _cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


_write("import")


def _specialization(src: object, metadata: dict) -> str:
    """`kernel;NAME=value,...;w<num_warps>` for one compiled variant: its constexprs and pointer dtypes,
    so that a run can say which of them multiply the compile volume. Empty where Triton's source object
    does not look as expected (it is not a public API)."""
    try:
        fn, signature, constants = src.fn, src.signature, src.constants  # type: ignore[attr-defined]
        names = fn.arg_names
        # constants: the constexprs and any argument Triton specialized to a value (an int equal to 1)
        fields = [f"{names[k[0]]}={v}" for k, v in constants.items() if len(k) == 1]
        fields += [f"{name}={kind}" for name, kind in signature.items() if str(kind).startswith("*")]
        return f"{src.name};{','.join(sorted(fields))};w{metadata.get('num_warps', '?')}".replace(" ", "")  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 (a timing aid: never the reason a test run fails)
        return ""


def _on_compile(*, times, cache_hit: bool, metadata: dict | None = None, src: object = None, **_) -> None:
    variant = str((metadata or {}).get("hash", "?"))[:16]  # the on-disk cache key: one per compiled variant
    spec = _specialization(src, metadata or {})
    _write("compile", f"{times.total / 1e6:.3f} {'hit' if cache_hit else 'miss'} {variant} {spec}".rstrip())


def _listen_to_compiles() -> None:
    # Compiles from a cold cache are a suspect for the suite's CPU time; Triton (3.4+) reports each one.
    try:
        from triton import knobs
    except ImportError:
        return
    if hasattr(getattr(knobs, "compilation", None), "listener") and knobs.compilation.listener is None:
        knobs.compilation.listener = _on_compile


def pytest_configure(config: pytest.Config) -> None:
    _write("configure")
    if os.environ.get(TIMELINE_ENV):
        _listen_to_compiles()


def pytest_collection_finish(session: pytest.Session) -> None:
    _write("collected", str(len(session.items)))


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    global _cpu_at_start
    _cpu_at_start = _cpu_seconds()
    _write("start", nodeid)


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    _write("cpu", f"{_cpu_seconds() - _cpu_at_start:.3f}")
    _write("finish", nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _write("sessionfinish")
