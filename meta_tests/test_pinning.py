"""conformance.pinning: which GPU each xdist worker gets, with simulated GPUs (no CUDA needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance import pinning
from conformance.pinning import device_for_worker, parse_visible, pin_worker_gpu, visible_devices, worker_gpu_env

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("worker, visible, expected", [
    ("gw0", ["0", "1"], "0"),
    ("gw1", ["0", "1"], "1"),
    ("gw2", ["0", "1"], "0"),  # round robin
    ("gw7", ["0", "1", "2", "3", "4", "5", "6", "7"], "7"),
    ("gw3", ["2", "5", "6"], "2"),  # an inherited subset keeps its original indices
    ("gw1", ["GPU-aaaa", "GPU-bbbb"], "GPU-bbbb"),  # UUIDs pass through
    ("gw5", ["0"], None),  # one GPU: nothing to choose
    ("gw0", [], None),  # no GPU
    (None, ["0", "1"], None),  # not an xdist worker
    ("main", ["0", "1"], None),
])
def test_device_for_worker(worker, visible, expected):
    assert device_for_worker(worker, visible) == expected


@pytest.mark.parametrize("value, expected", [
    ("0,1,2", ["0", "1", "2"]),
    (" 3 , 1", ["3", "1"]),
    ("", []),
    ("-1", []),  # CUDA's "no GPU"
    ("0,-1,2", ["0"]),  # CUDA stops at the first invalid entry
    ("GPU-1234,MIG-5678", ["GPU-1234", "MIG-5678"]),
])
def test_parse_visible(value, expected):
    assert parse_visible(value) == expected


def test_visible_devices_prefers_the_inherited_list_over_any_count():
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "4,6", "KVFP8_GPU_COUNT": "8"}) == ["4", "6"]
    assert visible_devices({"KVFP8_GPU_COUNT": "3"}) == ["0", "1", "2"]


def test_count_falls_back_from_nvml_to_nvidia_smi(monkeypatch):
    monkeypatch.setattr(pinning, "_nvml_count", lambda: None)
    monkeypatch.setattr(pinning.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    listing = ("GPU 0: NVIDIA H200 (UUID: GPU-aaaa)\n  MIG 3g.71gb Device 0: (UUID: MIG-bbbb)\n"
               "GPU 1: NVIDIA H200 (UUID: GPU-cccc)\n")
    monkeypatch.setattr(pinning.subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=listing))
    assert visible_devices({}) == ["0", "1"]
    monkeypatch.setattr(pinning.shutil, "which", lambda name: None)
    assert visible_devices({}) == []


@pytest.mark.parametrize("env", [
    {"KVFP8_GPU_COUNT": "4"},  # not an xdist worker
    {"PYTEST_XDIST_WORKER": "gw3", "KVFP8_GPU_COUNT": "1"},
    {"PYTEST_XDIST_WORKER": "gw3", "KVFP8_GPU_COUNT": "0"},
    {"PYTEST_XDIST_WORKER": "gw3", "KVFP8_GPU_COUNT": "4", "KVFP8_NO_PIN": "1"},
    {"PYTEST_XDIST_WORKER": "gw3", "CUDA_VISIBLE_DEVICES": "5"},
])
def test_no_op_cases(env):
    assert worker_gpu_env(env) == {}
    before = dict(env)
    assert pin_worker_gpu(env) is None and env == before


def test_pin_sets_the_original_entry():
    env = {"PYTEST_XDIST_WORKER": "gw3", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert pin_worker_gpu(env) == "7"
    assert env["CUDA_VISIBLE_DEVICES"] == "7"
    env = {"PYTEST_XDIST_WORKER": "gw3", "KVFP8_GPU_COUNT": "2"}
    assert pin_worker_gpu(env) == "1" and env["CUDA_VISIBLE_DEVICES"] == "1"


def test_conftest_pins_before_torch_first_asks_cuda():
    """Import conftest.py as pytest does in worker gw3, recording CUDA_VISIBLE_DEVICES at the first
    torch.cuda.is_available() (kernel's import): it must already be the worker's GPU."""
    probe = (
        "import json, os, torch\n"
        "seen = []\n"
        "def is_available():\n"
        "    seen.append(os.environ.get('CUDA_VISIBLE_DEVICES'))\n"
        "    return False\n"
        "torch.cuda.is_available = is_available\n"
        "import conftest\n"
        "print(json.dumps({'first': seen[0], 'calls': len(seen), 'now': os.environ['CUDA_VISIBLE_DEVICES'],"
        " 'initialized': torch.cuda.is_initialized()}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("KVFP8_NO_PIN", "KVFP8_GPU_COUNT")}
    env.update(PYTEST_XDIST_WORKER="gw3", CUDA_VISIBLE_DEVICES="4,5,6,7", HYPOTHESIS_PROFILE="dev")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["first"] == "7", f"torch saw CUDA_VISIBLE_DEVICES={seen['first']!r} before the pin: {seen}"
    assert seen["now"] == "7" and not seen["initialized"], seen


def test_each_test_names_its_gpu(monkeypatch):
    item = SimpleNamespace(user_properties=[])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    monkeypatch.setattr(sys.modules["torch"].cuda, "is_available", lambda: True)
    pinning.pytest_runtest_setup(item)
    assert item.user_properties == [("gpu", "7")]


def test_no_gpu_property_without_cuda(monkeypatch):
    item = SimpleNamespace(user_properties=[])
    monkeypatch.setattr(sys.modules["torch"].cuda, "is_available", lambda: False)
    pinning.pytest_runtest_setup(item)
    assert item.user_properties == []


def test_header_says_how_workers_are_spread(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("KVFP8_NO_PIN", raising=False)
    monkeypatch.setenv("KVFP8_GPU_COUNT", "2")
    config = SimpleNamespace(option=SimpleNamespace(numprocesses=4))
    assert pinning.pytest_report_header(config) == [
        "kvfp8: xdist workers over GPUs 0,1: round robin, one GPU a worker (junit property 'gpu')"]
    config.option.numprocesses = None
    assert pinning.pytest_report_header(config) == []
