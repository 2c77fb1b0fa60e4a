"""One GPU per xdist worker: gw0, gw1, ... take the visible GPUs round robin.

conftest.py applies `worker_gpu_env()` to os.environ before `import kernel`: kernel's
`torch.cuda.is_available()` starts CUDA's runtime, which reads CUDA_VISIBLE_DEVICES once and never
again, so pinning after it changes nothing. For the same reason this module imports neither torch
nor kernel, and counts GPUs through NVML (or `nvidia-smi -L`), which does not start the runtime.

A worker is pinned to an entry of the list it inherited, never to a renumbered index: with
CUDA_VISIBLE_DEVICES=2,3 worker gw1 gets "3" (the GPU the parent called cuda:1), and UUID entries
(GPU-..., MIG-...) are passed on as they are. Nothing changes outside xdist, with one visible GPU or
none, or with KVFP8_NO_PIN=1. KVFP8_GPU_COUNT overrides the NVML count (simulated GPUs in tests).

Also a pytest plugin (conftest.py's pytest_plugins): each test's report carries a user property
("gpu", the entry its process runs on), which the JUnit XML keeps, and the xdist controller's header
says how workers are spread. PYTEST_DONT_REWRITE: conftest.py imports this module before pytest
registers it as a plugin, too early for assertion rewriting (it has no asserts), and the marker
silences pytest's warning about that.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, MutableMapping, Sequence

import pytest

NO_PIN_ENV = "KVFP8_NO_PIN"
COUNT_ENV = "KVFP8_GPU_COUNT"
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


def device_for_worker(worker_id: str | None, visible: Sequence[str]) -> str | None:
    """The entry of `visible` that xdist worker `worker_id` ("gw3") runs on; None: leave it alone."""
    match = re.fullmatch(r"gw(\d+)", worker_id or "")
    if match is None or len(visible) <= 1:
        return None
    return visible[int(match.group(1)) % len(visible)]


def parse_visible(value: str) -> list[str]:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: entries up to the first invalid one ("-1", "" = none)."""
    entries = []
    for entry in (e.strip() for e in value.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break  # CUDA ignores this entry and everything after it
        entries.append(entry)
    return entries


def _nvml_count() -> int | None:
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    count = ctypes.c_uint(0)
    ok = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
    nvml.nvmlShutdown()
    return count.value if ok else None


def _smi_count() -> int | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(line.startswith("GPU ") for line in out.splitlines())  # MIG lines are indented


def visible_devices(env: Mapping[str, str] = os.environ) -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries, without starting CUDA."""
    if VISIBLE_ENV in env:
        return parse_visible(env[VISIBLE_ENV])
    count = int(env[COUNT_ENV]) if env.get(COUNT_ENV) else _nvml_count()
    if count is None:
        count = _smi_count() or 0
    return [str(i) for i in range(count)]


def worker_gpu_env(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """{"CUDA_VISIBLE_DEVICES": entry} for this xdist worker, or {} when nothing is to change."""
    worker = env.get("PYTEST_XDIST_WORKER")
    if env.get(NO_PIN_ENV) == "1" or not worker:
        return {}
    device = device_for_worker(worker, visible_devices(env))
    return {} if device is None else {VISIBLE_ENV: device}


def pin_worker_gpu(env: MutableMapping[str, str] = os.environ) -> str | None:
    """Pin this xdist worker to its GPU; returns the entry pinned to, or None."""
    update = worker_gpu_env(env)
    env.update(update)
    return update.get(VISIBLE_ENV)


def gpu_label() -> str | None:
    """The GPU this process's cuda:0 is, as CUDA_VISIBLE_DEVICES names it; None without CUDA."""
    torch = sys.modules.get("torch")  # never import it here: only report what the run already uses
    if torch is None or not torch.cuda.is_available():
        return None
    visible = parse_visible(os.environ[VISIBLE_ENV]) if VISIBLE_ENV in os.environ else ["0"]
    return visible[0] if visible else None


# -- pytest plugin --------------------------------------------------------------------------------
def pytest_runtest_setup(item: pytest.Item) -> None:
    gpu = gpu_label()
    if gpu is not None:
        item.user_properties.append(("gpu", gpu))


def pytest_report_header(config: pytest.Config) -> list[str]:
    workers = getattr(config.option, "numprocesses", None)
    if not workers or os.environ.get("PYTEST_XDIST_WORKER"):
        return []
    visible = visible_devices()
    if len(visible) <= 1:
        return []
    how = "off ($KVFP8_NO_PIN=1)" if os.environ.get(NO_PIN_ENV) == "1" else "round robin, one GPU a worker"
    return [f"kvfp8: xdist workers over GPUs {','.join(visible)}: {how} (junit property 'gpu')"]
