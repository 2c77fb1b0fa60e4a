"""`make test` runs pytest with -q, which hides the header: the terminal summary says which recipe each
implementation was held to (conformance/session.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.session import held_lines

ROOT = Path(__file__).resolve().parent.parent
TINY = ["conformance/test_ties.py", "-k", "empty_batch"]  # one property, a few examples, well under a second
VLLM = "examples/vllm_divide.py:reshape_and_cache_flash"


def _pytest(tmp_path: Path, *args: str) -> str:
    env = {**os.environ, "KVFP8_FAILURES": str(tmp_path / "failures"), "HYPOTHESIS_PROFILE": "ci",
           "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TINY, *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    return proc.stdout + proc.stderr


def test_this_kernel_under_xdist_says_every_recipe(tmp_path):
    """As `make test` runs it (xdist, -q): the controller's summary."""
    out = _pytest(tmp_path, "-n", "1")
    assert re.search(r"^kvfp8: held fused-software to every recipe, passed as recipe=", out, re.M), out


def test_an_external_implementation_held_to_a_given_recipe(tmp_path):
    out = _pytest(tmp_path, "--impl", VLLM, "--recipe", "divide")
    assert f"kvfp8: held {VLLM} to recipe divide (given with --recipe)" in out, out


@pytest.mark.long
def test_an_identified_recipe_is_named(tmp_path):
    """--recipe auto (the default with --impl): the sweep's identification (about 25 s on 2 CPU cores)."""
    out = _pytest(tmp_path, "--impl", VLLM)
    assert re.search(rf"^kvfp8: held {re.escape(VLLM)} to recipe divide \(identified: matches divide", out, re.M), out


def test_the_line_for_each_kind_of_hold():
    from dataclasses import replace

    from conformance.impls import default_implementations
    ours = default_implementations()[0]
    closest = replace(ours, name="x.py:f", recipe="single", recipe_note="matches no recipe; held to the closest, "
                                                                        "single (3 of 9 bytes swept differ)")
    assert held_lines([closest]) == ["kvfp8: held x.py:f to recipe single (matches no recipe; held to the closest, "
                                     "single (3 of 9 bytes swept differ))"]
    assert held_lines([replace(ours, recipe=None, recipe_note="told")]) == [f"kvfp8: held {ours.name} to every "
                                                                            "recipe (told)"]
