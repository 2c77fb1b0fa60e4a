"""The pytest plugin behind tools.conformance: every test's outcome and its failures, classified.

Loaded with `-p conformance.diagnosis.recorder --kvfp8-record FILE`. In the process that runs a test (an
xdist worker, or the lone process) each failing test's exception is split into its leaves (one per
distinct bug Hypothesis reports) and each leaf is classified there (conformance.diagnosis.classify replays
its Case with the test's own implementation and device), so that a crash while replaying takes
down one worker, not the run. The result travels in the report's user_properties; the controller
appends one JSON line per test phase to FILE as it arrives, so a run cut short keeps what finished.
A crashed worker's report reaches the controller without the test's parameters, so the first worker
also writes every collected test's parameters to FILE.params (`params_file`).

It also makes sure Hypothesis's `report_multiple_bugs` is on, and with `--kvfp8-examples N` caps
the examples a property at N.
"""

from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

_CONFIG: pytest.Config | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvfp8 conformance report")
    group.addoption("--kvfp8-record", default=None, help="append each test's outcome and classified failures "
                                                         "to this JSON-lines file (tools.conformance)")
    group.addoption("--kvfp8-examples", type=int, default=None, help="at most this many examples a property")


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """After the session plugin has bounded the run: multiple bugs on, and the example cap."""
    global _CONFIG
    _CONFIG = config
    current = settings()
    changes: dict[str, Any] = {}
    if not current.report_multiple_bugs:
        changes["report_multiple_bugs"] = True
    cap = config.getoption("kvfp8_examples")
    if cap and current.max_examples > cap:
        changes["max_examples"] = cap
    if changes:
        settings.register_profile("kvfp8-report", parent=current, **changes)
        settings.load_profile("kvfp8-report")


def _simple(value: object) -> object:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "kind") and hasattr(value, "value"):  # a Scale
        return value.kind
    if isinstance(getattr(value, "id", None), str):  # an InputClass
        return value.id
    if hasattr(value, "name"):  # an Implementation, a Mutation
        return value.name
    if isinstance(value, (tuple, list)):
        return [_simple(v) for v in value]
    return str(value)


def params_of(item: pytest.Item) -> dict[str, object]:
    callspec = getattr(item, "callspec", None)
    return {k: _simple(v) for k, v in callspec.params.items()} if callspec else {}


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups; an ordinary exception is its own leaf."""
    subs = getattr(exc, "exceptions", None)  # BaseExceptionGroup (Python 3.11+, or its backport)
    if isinstance(subs, (tuple, list)) and all(isinstance(e, BaseException) for e in subs):
        return [leaf for sub in subs for leaf in leaves(sub)]
    return [exc]


def _classified(item: pytest.Item, exc: BaseException, unrepeatable: bool = False) -> list[dict[str, Any]]:
    from conformance.diagnosis.classify import Finding, classify_failure, out_of_memory, starved
    module = item.module.__name__.rsplit(".", 1)[-1] if getattr(item, "module", None) else ""
    test = getattr(item, "originalname", None) or item.name
    callspec = getattr(item, "callspec", None)
    params = dict(callspec.params) if callspec else {}
    if "mutation" in params:
        params["mutation"] = params["mutation"].name
    funcargs = getattr(item, "funcargs", {})
    # Twice with replays (a replay can trip over state an earlier call left, such as torch's "PythonDispatcher"
    # internal assert seen once under Triton's interpreter), then by the failure's text alone.
    attempts = [(funcargs.get("impl"), funcargs.get("device"))] * 2 + [(None, None)]
    detail = ""
    for impl, device in attempts:
        try:
            findings = classify_failure(exc, test, module, params, impl, device, unrepeatable)
            if detail and impl is None:  # the replays failed: say so, it is this suite's bug to report
                for f in findings:
                    f.facts = {**f.facts, "detail": f"read from the failure's text alone: the diagnosis's replays "
                                                    f"failed ({detail[:160]}; a bug of this suite's)"}
            return [f.to_dict() for f in findings]
        except Exception as err:  # the classifier's own failure must not hide the test's
            detail = "".join(traceback.format_exception_only(type(err), err)).strip()
            if out_of_memory(detail):  # its replays found the card full: the byte classes read off the text
                return [starved(detail).to_dict()]  # alone would name a defect for each (nine reports at once)
    findings = [Finding("unclassified", "unclassified:classifier", f"could not classify: {detail[:200]}",
                        replayable=False, excerpt="\n".join(str(exc).splitlines()[:14]))]
    return [f.to_dict() for f in findings]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if _CONFIG is None or not _CONFIG.getoption("kvfp8_record"):
        return
    report.user_properties.append(("kvfp8_params", json.dumps(params_of(item))))
    if report.failed and call.excinfo is not None:
        found = []
        # Hypothesis's FlakyFailure: the example failed, then passed when run again (a group of the failures)
        unrepeatable = type(call.excinfo.value).__name__ == "FlakyFailure"
        for exc in leaves(call.excinfo.value):
            if isinstance(exc, pytest.skip.Exception):
                continue
            started = time.perf_counter()  # the diagnosis's time, which pytest's durations leave out
            findings = _classified(item, exc, unrepeatable)
            found.append({"type": type(exc).__name__, "message": str(exc)[:4000], "findings": findings,
                          "seconds": round(time.perf_counter() - started, 2)})
        report.user_properties.append(("kvfp8_leaves", json.dumps(found)))


def params_file(record: str | Path) -> Path:
    """Where every collected test's parameters go, beside the record file."""
    return Path(f"{record}.params")


def pytest_collection_finish(session: pytest.Session) -> None:
    if _CONFIG is None or not _CONFIG.getoption("kvfp8_record"):
        return
    if getattr(_CONFIG, "workerinput", {}).get("workerid", "gw0") != "gw0":  # every worker collects the same
        return
    target = params_file(_CONFIG.getoption("kvfp8_record"))
    partial = target.with_name(target.name + ".partial")
    partial.write_text(json.dumps({item.nodeid: params_of(item) for item in session.items}))
    partial.replace(target)  # whole or absent: the controller may read it while a worker is replaced


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2]).removeprefix("Skipped: ")
        return reason.split(": ", 1)[1] if reason.startswith("conformance.impls.Inexpressible: ") else reason
    return str(longrepr or "")[:500]


def _write(record: dict[str, Any]) -> None:
    path = Path(_CONFIG.getoption("kvfp8_record"))
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def _controller() -> bool:
    return _CONFIG is not None and bool(_CONFIG.getoption("kvfp8_record")) and not hasattr(_CONFIG, "workerinput")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not _controller() or (report.when != "call" and report.passed):
        return
    props = dict(p for p in report.user_properties if isinstance(p, (tuple, list)) and len(p) == 2)
    record: dict[str, Any] = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                              "duration": round(report.duration, 3),
                              "params": json.loads(props.get("kvfp8_params", "{}"))}
    if report.skipped:
        record["skip"] = _skip_reason(report)
    if report.failed:
        record["leaves"] = json.loads(props.get("kvfp8_leaves", "[]"))
        if not record["leaves"]:  # a crashed worker, a hook error: only the text is left
            record["longrepr"] = str(report.longrepr)[-4000:]
    _write(record)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _controller() and report.failed:
        _write({"nodeid": report.nodeid, "when": "collect", "outcome": "failed", "params": {},
                "longrepr": str(report.longrepr)[-4000:]})
