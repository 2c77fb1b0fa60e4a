"""The implementations under test: the fused kernel on each encoder the machine has, or one given
with --impl / $KVFP8_IMPL (a `module:function` or `path/to/file.py:function` with the same
signature as kernel.fused_fp8_set_kv_buffer)."""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

import kernel
from kernel.backend import hardware_cast_available, interpreted

IMPL_ENV = "KVFP8_IMPL"


@dataclass(frozen=True)
class Implementation:
    """A callable with fused_fp8_set_kv_buffer's signature, plus fixed keyword arguments."""

    name: str
    fn: Callable[..., object]
    kwargs: dict = field(default_factory=dict)

    def __call__(self, *args, **kwargs) -> None:
        self.fn(*args, **kwargs, **self.kwargs)


def load_callable(spec: str) -> Callable[..., object]:
    """'pkg.module:function' or 'path/to/file.py:function' -> the function."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(f"--impl must look like module:function or path/to/file.py:function, got {spec!r}")
    if target.endswith(".py") or os.sep in target:
        path = Path(target).resolve()
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"--impl: cannot load {path}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, attr)


def test_device() -> torch.device:
    """CUDA when present, else the CPU (where the kernel runs under Triton's interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() and not interpreted() else "cpu")


def default_implementations() -> list[Implementation]:
    """The fused kernel on every encoder available here: both on sm_89+, software elsewhere."""
    impls = [Implementation("fused-software", kernel.fused_fp8_set_kv_buffer, {"encoder": "software"})]
    if hardware_cast_available(test_device()):
        impls.insert(0, Implementation("fused-hardware", kernel.fused_fp8_set_kv_buffer,
                                       {"encoder": "hardware"}))
    return impls


def selected_implementations(spec: str | None) -> list[Implementation]:
    spec = spec or os.environ.get(IMPL_ENV)
    if spec:
        return [Implementation(spec, load_callable(spec))]
    return default_implementations()
