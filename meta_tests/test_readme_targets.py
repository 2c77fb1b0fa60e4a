"""Every `make` command the README names runs here in its smallest mode, or, where it needs CUDA, exits 2
with a one-line reason and no traceback; `make install` installs what `make fuzz` needs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAKEFILE = (ROOT / "Makefile").read_text()
RED_RUN = "docs/results/h200-red-run-2026-12-02.json"
KERNEL_REPORTS = "docs/results/conformance-h200-2026-12-03-e/kernel.fused_fp8_set_kv_buffer-{}.json"
CUDA = torch.cuda.is_available()

# target -> (make arguments of its smallest mode, the recipe's exit status, text its output must hold).
SMALLEST: dict[str, tuple[list[str], int, str]] = {
    "test": (["JOBS=0", "PYTEST_ARGS=-p no:cacheprovider meta_tests/test_tiles.py"], 0, "passed"),
    "lint": ([], 0, "All checks passed"),
    "repro": ([f"CASE={RED_RUN}"], 1, "This report is the same as the recorded one"),
    "identify": (["IDENTIFY_ARGS=--quick --dtypes bfloat16"], 0, "RESULT: matches unfused"),
    "conformance": (["IMPL=kernel:fused_fp8_set_kv_buffer",
                     "CONFORMANCE_ARGS=--families capabilities --examples 1 --probe-examples 1 --quiet"],
                    1, "incomplete: no defect in what ran"),  # rows left out on purpose: incomplete, exit 1
    "conformance-diff": ([f"OLD={KERNEL_REPORTS.format('hardware')}", f"NEW={KERNEL_REPORTS.format('software')}"],
                         0, "no regression"),
    "mutants": (["MUTANTS_ARGS=--check"], 0, "mutants apply"),
    "throughput": (["EXAMPLES=5"], 0, "after warm-up"),
    "sweep-fp32": (["SWEEP_FP32_ARGS=--chunks 1 --chunk-log2 10 --recipes unfused"], 0, "PASS"),
    "fuzz": (["FUZZ_ARGS=--dry-run"], 0, "fuzz: pytest args"),
    "sanitize": (["SANITIZE_ARGS=--dry-run"], 0, "compute-sanitizer --tool memcheck"),
}
# CUDA-only: on a machine without CUDA the bare target must say so (exit 2, one line, no traceback).
CUDA_ONLY = {"sanitize", "bigcache", "sweep-fp32", "bench"}
LONG = {"conformance", "identify"}


def readme_targets() -> set[str]:
    text = README.read_text()
    blocks = "\n".join(re.findall(r"```[^\n]*\n(.*?)```", text, re.S))
    return set(re.findall(r"^make ([\w-]+)", blocks, re.M)) | set(re.findall(r"`make ([\w-]+)", text))


def make(target: str, *args: str, tmp_path: Path) -> tuple[int, str, str]:
    """(the recipe's exit status, stdout, stderr) of `make -s target args` with this interpreter. The
    environment drops what an outer `make test` exports (MAKEFLAGS, its command-line variables)."""
    names = set(re.findall(r"\$\((\w+)\)", MAKEFILE)) | set(re.findall(r"^(\w+)\s*[?:]?=", MAKEFILE, re.M))
    env = {k: v for k, v in os.environ.items()
           if k not in names and not k.startswith(("MAKE", "MFLAGS", "PYTEST_"))}
    env.update(OUT=str(tmp_path / "out"), KVFP8_FAILURES=str(tmp_path / "failures"))
    proc = subprocess.run(["make", "-s", target, f"PYTHON={sys.executable}", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode == 0:
        return 0, proc.stdout, proc.stderr
    status = re.search(rf"\[Makefile:\d+: {re.escape(target)}\] Error (\d+)", proc.stderr)
    assert status, f"make {target} failed without a recipe error:\n{proc.stderr[-2000:]}"
    return int(status.group(1)), proc.stdout, proc.stderr


def test_every_readme_target_has_a_smallest_mode_and_exists():
    targets = readme_targets()
    assert {"install", "test", "fuzz", "mutants"} <= targets, targets
    missing = targets - set(SMALLEST) - CUDA_ONLY - {"install"}
    assert not missing, f"README targets without a smallest mode here: {sorted(missing)}"
    in_makefile = set(re.findall(r"^([\w-]+):", MAKEFILE, re.M))
    assert targets <= in_makefile, f"README targets not in the Makefile: {sorted(targets - in_makefile)}"


def test_install_installs_what_fuzz_needs(tmp_path):
    proc = subprocess.run(["make", "-n", "install"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))})
    assert proc.returncode == 0, proc.stderr
    extras = re.search(r'-e "\.\[([\w,]+)\]"', proc.stdout)
    assert extras and {"dev", "fuzz"} <= set(extras.group(1).split(",")), proc.stdout


@pytest.mark.parametrize("target", [pytest.param(t, marks=[pytest.mark.long] if t in LONG else [], id=t)
                                    for t in sorted(SMALLEST)])
def test_smallest_mode(target: str, tmp_path):
    args, expected, text = SMALLEST[target]
    if target == "fuzz" and importlib.util.find_spec("hypofuzz") is None:
        expected, text = 2, "needs hypofuzz: make install"  # a runner without make install
    if target == "lint" and importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is in the dev extra, which make install installs; this Python has none")
    rc, out, err = make(target, *args, tmp_path=tmp_path)
    assert "Traceback" not in out + err, f"make {target}:\n{out[-3000:]}\n{err[-3000:]}"
    assert rc == expected, f"make {target}: exit {rc}, not {expected}:\n{out[-2000:]}\n{err[-2000:]}"
    assert text in out + err, f"make {target}: no {text!r} in its output:\n{out[-2000:]}\n{err[-2000:]}"
    if target == "conformance":
        (path,) = (tmp_path / "out").glob("kernel.fused_fp8_set_kv_buffer*.json")
        assert json.loads(path.read_text())["defects"] == [], path.read_text()


@pytest.mark.parametrize("target", sorted(CUDA_ONLY))
def test_cuda_only_targets_say_so_without_cuda(target: str, tmp_path):
    if CUDA:
        pytest.skip(f"CUDA is here: make {target} is a real run (minutes), done by the nightly or by hand")
    rc, out, err = make(target, tmp_path=tmp_path)
    lines = [ln for ln in (out + err).splitlines() if ln.strip() and not ln.startswith("make: ")]
    assert rc == 2 and len(lines) == 1 and "needs CUDA" in lines[0], f"make {target}: exit {rc}\n{out}\n{err}"


def test_readme_stays_within_10_kb():
    size = len(README.read_bytes())
    assert size <= 10 * 1024, f"README.md is {size} bytes: move detail to docs/"
