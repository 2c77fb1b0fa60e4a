"""The Triton kernels compile for sm_90 on any machine (tools.compile_sm90): code that only the interpreter
accepts fails here, on the CPU, before it reaches a GPU runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tools.compile_sm90 import VARIANTS

ROOT = Path(__file__).resolve().parent.parent


def _ptxas() -> bool:
    try:
        import triton
    except ImportError:
        return False
    return os.access(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas", os.X_OK)


@pytest.mark.skipif(not _ptxas(), reason="this Triton install bundles no ptxas to compile for sm_90 with")
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA present: the suite compiles and runs every kernel "
                    "here; this check is for CPU-only runs, where the interpreter runs them")
def test_every_kernel_variant_compiles_for_sm90():
    # A process of its own: the kernels must import as compiled functions (TRITON_INTERPRET=0), while this
    # one may run them under the interpreter.
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    run = subprocess.run([sys.executable, "-m", "tools.compile_sm90"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line.split()[0] for line in run.stdout.splitlines()[1:] if line.strip()]
    assert rows == list(VARIANTS), run.stdout
