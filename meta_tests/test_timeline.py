"""tools.timeline reads what conformance/timeline.py writes, and sums it up right."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tools.timeline import busy_by_slice, read, summary

ROOT = Path(__file__).resolve().parent.parent


def test_summary_of_a_made_up_timeline(tmp_path: Path):
    lines = ["100.0 main import", "101.0 gw0 configure", "102.0 gw0 collected 2", "102.0 gw1 collected 2",
             "103.0 gw0 start a", "113.0 gw0 cpu 4.500", "113.0 gw0 finish a",
             "103.0 gw1 start b", "105.0 gw1 finish b",
             "104.0 gw0 compile 1.250 miss abc", "106.0 gw1 compile 0.010 hit abc",
             "103.0 main start a"]  # the controller's copy of a worker's event is not a worker's test
    path = tmp_path / "tl.txt"
    path.write_text("\n".join(lines) + "\n")
    procs = read(path)
    assert procs["gw0"].tests == [("a", 3.0, 13.0)] and procs["gw1"].busy == 2.0
    workers = [procs["gw0"], procs["gw1"]]
    assert busy_by_slice(workers, 3.0, 13.0, 5.0) == [(3.0, 1.4), (8.0, 1.0)]
    text = summary(procs, width=5.0)
    assert text.startswith("first test at 3.0 s; tests ran 10.0 s, to 13.0 s; 2 tests on 2 worker(s), 12 s busy")
    assert procs["gw0"].cpu == 4.5
    assert "| gw0 | 1.0 | 2.0 | 3.0 | 13.0 | 1 | 10.0 | 100 | 4.5 |" in text, text
    assert procs["gw0"].compiles == [(1.25, False, "abc")] and procs["gw1"].compiles == [(0.01, True, "abc")]
    assert ("Triton compilations: 2 (1.3 s), of which 1 compiled from scratch (1.2 s) and 1 loaded from the "
            "on-disk cache; 1 distinct variants") in text, text


def test_a_pytest_run_writes_its_timeline(tmp_path: Path):
    path = tmp_path / "tl.txt"
    env = dict(os.environ, KVFP8_TIMELINE=str(path))
    env.pop("PYTEST_XDIST_WORKER", None)  # under xdist this test's own worker id would name the child run
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "meta_tests/test_tiles.py"],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    procs = read(path)
    assert {"import", "configure", "collected", "start", "cpu", "finish", "sessionfinish"} <= set(procs["main"].marks)
    tests_in_module = (ROOT / "meta_tests" / "test_tiles.py").read_text().count("\ndef test_")
    assert len(procs["main"].tests) == tests_in_module, procs["main"].tests


def test_compile_volume_names_what_multiplies_the_variants(tmp_path: Path):
    lines = ["100.0 gw0 start a",
             "101.0 gw0 compile 1.000 miss v1 kern;A=1,B=64,k=*bf16;w4",
             "102.0 gw0 compile 1.000 miss v2 kern;A=2,B=64,k=*bf16;w4",
             "103.0 gw0 compile 1.000 miss v3 kern;A=1,B=128,k=*fp16;w4",
             "104.0 gw0 finish a"]
    path = tmp_path / "tl.txt"
    path.write_text("\n".join(lines) + "\n")
    procs = read(path)
    assert procs["gw0"].specs == {"v1": "kern;A=1,B=64,k=*bf16;w4", "v2": "kern;A=2,B=64,k=*bf16;w4",
                                  "v3": "kern;A=1,B=128,k=*fp16;w4"}
    text = summary(procs)
    assert "kern: 3 variants" in text, text
    for row in ("| A | 2: 1, 2 | 2 |", "| B | 2: 128, 64 | 3 |", "| num_warps | 1: 4 | 3 |"):
        assert row in text, text
