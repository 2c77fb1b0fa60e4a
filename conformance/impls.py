"""The implementations under test: the fused kernel on each encoder the machine has, or one given
with --impl / $KVFP8_IMPL (a `module:function` or `path/to/file.py:function`, the file anywhere on
disk, with the same signature as kernel.fused_fp8_set_kv_buffer).

An Implementation records how it was loaded (`spec`) and its fixed keyword arguments (`kwargs`,
e.g. the fused kernel's encoder), so that a failure file names exactly what failed and
`tools.repro` can load the same callable again on another machine.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

import kernel
from kernel.backend import hardware_cast_available, interpreted

IMPL_ENV = "KVFP8_IMPL"
FUSED_SPEC = "kernel:fused_fp8_set_kv_buffer"
ENCODERS = ("hardware", "software")


@dataclass(frozen=True)
class Implementation:
    """A callable with fused_fp8_set_kv_buffer's signature, plus fixed keyword arguments."""

    name: str
    fn: Callable[..., object]
    kwargs: dict = field(default_factory=dict)
    spec: str = ""  # how to load fn again: "module:function" or "/abs/path/file.py:function"

    def __call__(self, *args, **kwargs) -> None:
        self.fn(*args, **kwargs, **self.kwargs)

    @property
    def encoder(self) -> str | None:
        """The fused kernel's e4m3 encoder, when this is the fused kernel with one fixed."""
        return self.kwargs.get("encoder")


def _split(spec: str) -> tuple[str, str]:
    target, sep, attr = spec.rpartition(":")
    # "C:\\x.py" has its drive colon before the last one; a bare "C:" target is not a spec.
    if not sep or not target or not attr or not attr.isidentifier():
        raise ValueError(f"--impl must look like module:function or path/to/file.py:function, got {spec!r}")
    return target, attr


def _is_path(target: str) -> bool:
    return target.endswith(".py") or os.sep in target or "/" in target


def resolve_spec(spec: str) -> str:
    """The spec with a file path made absolute, so that it loads from any working directory."""
    target, attr = _split(spec)
    return f"{Path(target).resolve()}:{attr}" if _is_path(target) else spec


def load_callable(spec: str) -> Callable[..., object]:
    """'pkg.module:function' or 'path/to/file.py:function' -> the function.

    A file is loaded as a fresh module (named after its path, so two files called impl.py do not
    collide) with its own folder on sys.path for its sibling imports. Errors name the spec.
    """
    target, attr = _split(spec)
    if _is_path(target):
        path = Path(target).resolve()
        if not path.is_file():
            raise ValueError(f"--impl {spec!r}: no such file {path}")
        name = f"kvfp8_impl_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"--impl {spec!r}: cannot load {path}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        if str(path.parent) not in sys.path:
            sys.path.append(str(path.parent))
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"--impl {spec!r}: {target} has no callable named {attr!r}")
    return fn


def test_device() -> torch.device:
    """CUDA when present, else the CPU (where the kernel runs under Triton's interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() and not interpreted() else "cpu")


def fused(encoder: str) -> Implementation:
    """The fused kernel with its e4m3 encoder fixed."""
    return Implementation(f"fused-{encoder}", kernel.fused_fp8_set_kv_buffer, {"encoder": encoder},
                          FUSED_SPEC)


def default_implementations() -> list[Implementation]:
    """The fused kernel on every encoder available here: both on sm_89+, software elsewhere."""
    if hardware_cast_available(test_device()):
        return [fused("hardware"), fused("software")]
    return [fused("software")]


def from_spec(spec: str, kwargs: dict | None = None) -> Implementation:
    """An Implementation loaded from a spec; the fused kernel's spec keeps its usual name."""
    kwargs = dict(kwargs or {})
    if spec == FUSED_SPEC and set(kwargs) == {"encoder"} and kwargs["encoder"] in ENCODERS:
        return fused(kwargs["encoder"])
    return Implementation(spec, load_callable(spec), kwargs, resolve_spec(spec))


def selected_implementations(spec: str | None) -> list[Implementation]:
    """--impl (or $KVFP8_IMPL) if given, else the fused kernel on each encoder available."""
    spec = spec or os.environ.get(IMPL_ENV)
    if spec:
        return [from_spec(spec)]
    return default_implementations()
