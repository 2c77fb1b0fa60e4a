"""tools.conformance end to end on a small planted-defect implementation (meta_tests/planted_impl.py), on
the CPU: its exact defect list, the capability rows that show them, the replay of a defect's case, and
conformance-diff's verdict. Kept small (the probes, bit-exact and isolation with few examples, no xdist).

The run is the CPU's (CUDA hidden from it): the defect list is the CPU's, and on CUDA torch divides a
tensor by a Python float as a multiplication by its reciprocal, so there the planted implementation
computes another recipe (docs/facts.md). A CUDA runner skips the module: it would repeat the CPU CI's run,
61 s on a loaded H100 (docs/results/h100-2026-12-06.md).
"""

from __future__ import annotations

import copy
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conformance.diagnosis.report import diff
from tools import conformance_diff, repro

# one make conformance run, shared by the module's tests; the CPU's, so a CUDA runner leaves it to the CPU CI
pytestmark = [pytest.mark.long("module"), pytest.mark.skipif(
    torch.cuda.is_available(), reason="a CPU run with CUDA hidden: make test without CUDA (the CPU CI) runs it; "
    "here it would repeat that run beside the GPU tests")]

ROOT = Path(__file__).resolve().parents[1]
PLANTED = "meta_tests/planted_impl.py:fused_fp8_set_kv_buffer"
EXPECTED = {"padding:wraps-to-end@padding": "writes outside", "encoding:nan-sign@any": "wrong bytes",
            "scale:ignored@scale-kind:float": "wrong bytes"}
ROWS = {"padding": "writes outside", "special-values": "wrong bytes", "v_scale-float": "wrong bytes"}


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "KVFP8_", "HYPOTHESIS_"))}
    env.update(OMP_NUM_THREADS="1", KVFP8_HYPOTHESIS_DB=str(tmp_path / "db"), CUDA_VISIBLE_DEVICES="")
    return env


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, dict, Path]:
    out = tmp_path_factory.mktemp("conformance")
    done = subprocess.run(
        [sys.executable, "-m", "tools.conformance", PLANTED, "--out", str(out), "--jobs", "1",
         "--families", "capabilities,bit_exact,isolation,graphs,bigcache", "--examples", "5", "--probe-examples",
         "3"], cwd=ROOT, env=_env(out), capture_output=True, text=True, timeout=300)
    path = out / "planted_impl.fused_fp8_set_kv_buffer.json"
    assert path.exists(), done.stdout + done.stderr
    return done, json.loads(path.read_text()), out


def test_exact_defects_and_exit_status(run):
    done, report, out = run
    assert done.returncode == 1, done.stdout + done.stderr
    found = {d["key"]: d["cell"] for d in report["defects"]}
    assert found == EXPECTED, json.dumps(report["defects"], indent=1)
    assert report["recipe"]["held"] == "divide", report["recipe"]
    assert "# Conformance report" in done.stdout and (out / "planted_impl.fused_fp8_set_kv_buffer.md").exists()
    # where the time went: the failing tests' diagnoses, which pytest's durations leave out
    diagnosis = report["run"]["diagnosis"]
    assert diagnosis["seconds"] > 0 and diagnosis["slowest"] and "| diagnosis |" in done.stdout, diagnosis


def test_capability_rows(run):
    _, report, _ = run
    cells = {c["id"]: c for c in report["capabilities"]}
    for row, status in ROWS.items():
        assert cells[row]["status"] == status, cells[row]
    wrong = {i: c["status"] for i, c in cells.items()
             if c["group"] == "input classes" and i not in ROWS and not i.startswith(("graph-", "bigcache"))
             and c["status"] != "conforms" and "not selected" not in c.get("detail", "")
             # sglang's call has no kv_cache_dtype, and takes one key a cache_loc entry
             and not (i in ("format-alias", "padded-keys") and c["status"] == "not applicable")}
    assert not wrong, wrong
    for row in ("graph-none", "graph-float", "graph-tensor0d", "graph-tensor1", "bigcache"):
        assert cells[row]["status"] == "not applicable" and "needs CUDA" in cells[row]["detail"], cells[row]
    assert cells["arg-aliased-caches"]["status"] == "not run", cells["arg-aliased-caches"]


def test_each_defect_replays(run):
    _, report, _ = run
    for d in report["defects"]:
        assert d["case"] and d["replay"] == f"python -m tools.repro {d['case']}", d
        record = json.loads(Path(d["case"]).read_text())
        # In this process (tools.repro's own CLI is tested in conformance/test_repro.py): a subprocess
        # each would start torch again, 10 s or more a replay on a loaded GPU runner.
        args = repro._parser().parse_args([d["case"], "--device", "cpu", "--impl", f"{ROOT}/{PLANTED}"])
        out = io.StringIO()
        assert repro.replay(d["case"], args, out) == 1, out.getvalue()
        assert record["report"] in out.getvalue() and "the same as the recorded one" in out.getvalue(), out.getvalue()


def test_diff_names_a_new_defect_and_a_worse_cell(run, tmp_path, capsys):
    _, report, _ = run
    old = copy.deepcopy(report)
    old["defects"] = [d for d in old["defects"] if d["key"] != "scale:ignored@scale-kind:float"]
    for c in old["capabilities"]:
        if c["id"] == "v_scale-float":
            c["status"], c["detail"] = "conforms", ""
    worse, better, _ = diff(old, report)
    assert any("scale:ignored@scale-kind:float" in w for w in worse) and any("v_scale" in w for w in worse), worse
    assert not better
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(report))
    assert conformance_diff.main([str(tmp_path / "old.json"), str(tmp_path / "new.json")]) == 1
    assert conformance_diff.main([str(tmp_path / "new.json"), str(tmp_path / "old.json")]) == 0
    assert "REGRESSION" in capsys.readouterr().out


def test_a_crashed_tests_row_shows_the_crash(tmp_path):
    """A crashed worker's report reaches the controller without the test's parameters. The first
    worker's list of every collected test's parameters puts the crash in the test's row, where it
    would otherwise read "not run"."""
    from conformance.diagnosis import report
    from conformance.diagnosis.capabilities import argument_rows
    from conformance.diagnosis.recorder import params_file

    node = "conformance/test_errors.py::test_invalid_argument_raises_and_writes_nothing[impl-x.py:f-cache-rank]"
    records = tmp_path / "records.jsonl"
    records.write_text(json.dumps({"nodeid": node, "when": "call", "outcome": "failed", "duration": 1.0,
                                   "params": {}, "leaves": [],
                                   "longrepr": f"worker 'gw3' crashed while running '{node}'"}) + "\n")
    row = next(r for r in argument_rows() if r.id == "arg-cache-rank")
    for with_params, expected in ((False, "not run"), (True, "crashes")):
        if with_params:
            params_file(records).write_text(json.dumps({node: {"mutation": "cache-rank", "target": "impl"}}))
        nodes = report.nodes_from(report.read_records(records))
        defects = report.defects_from(nodes, tmp_path / "cases", {"args": ""})
        cell = report.cell_for(row, nodes, defects, {"errors"}, argument=True)
        assert cell["status"] == expected, cell
    # an invalid call's crash is the argument contract's (meta_tests/test_defect_causes.py)
    assert [d.key for d in defects] == ["validation:crash"] and cell["defects"] == [defects[0].id], (defects, cell)
