"""The implementations under test: the fused kernel on each encoder the machine has, or one given
with --impl / $KVFP8_IMPL (a `module:function` or `path/to/file.py:function`, the file anywhere on
disk), called in its own convention (conformance.conventions).

An Implementation records how it was loaded (`spec`), its fixed keyword arguments (`kwargs`, e.g. the
fused kernel's encoder), its convention and the recipe it is held to, so that a failure file names
exactly what failed and `tools.repro` can load and call the same callable again on another machine.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import torch
from hypothesis import strategies as st

import kernel
from conformance import interpreter_casts
from conformance.conventions import KVFP8, Convention, detect
from kernel.backend import hardware_cast_available, interpreted
from strategies import cases
from strategies.build import Built
from strategies.case import Case

IMPL_ENV = "KVFP8_IMPL"
FUSED_SPEC = "kernel:fused_fp8_set_kv_buffer"
ENCODERS = ("hardware", "software")


class Inexpressible(pytest.skip.Exception):
    """A Case the implementation's convention cannot express: a skip with the reason, never a failure.

    It is pytest's skip outcome, so Hypothesis passes it straight through instead of shrinking it.
    """


@dataclass(frozen=True)
class Implementation:
    """A callable, its convention, its fixed keyword arguments and the recipe it is held to."""

    name: str
    fn: Callable[..., object]
    kwargs: dict = field(default_factory=dict)
    spec: str = ""  # how to load fn again: "module:function" or "/abs/path/file.py:function"
    convention: Convention = KVFP8
    recipe: str | None = None  # the recipe it is held to; None: every recipe, told by `recipe=` (kvfp8)
    recipe_note: str = ""  # how that recipe was chosen (identified, closest, given), for headers and reports

    @property
    def encoder(self) -> str | None:
        """The fused kernel's e4m3 encoder, when this is the fused kernel with one fixed."""
        return self.kwargs.get("encoder")

    @property
    def is_ours(self) -> bool:
        """This repository's fused kernel (held to the project's own stricter argument contract too)."""
        return self.fn is kernel.fused_fp8_set_kv_buffer

    def invoke(self, call: dict[str, object]) -> None:
        """Call the implementation with `call` (this project's argument names), as its convention says."""
        self.convention.invoke(self.fn, call, self.kwargs)

    def run(self, built: Built) -> None:
        """Call the implementation on a built Case and wait for the device; raises Inexpressible first
        when its convention cannot express the Case."""
        reason = self.convention.why_not(built.case)
        if reason:
            raise Inexpressible(reason)
        self.invoke(built.implementation_call())
        if built.k.device.type == "cuda":
            torch.cuda.synchronize(built.k.device)

    def telling(self, case: Case) -> Implementation:
        """impl, its fixed cache_dtype (a property told it a format) made the Case's own format: a replay
        that moves the format back to e4m3 tells it nothing, as the plain call does."""
        if "cache_dtype" not in self.kwargs:
            return self
        kwargs = {k: v for k, v in self.kwargs.items() if k != "cache_dtype"}
        if case.cache_format != "fp8_e4m3":
            kwargs["cache_dtype"] = case.cache_format
        return replace(self, kwargs=kwargs)

    def fit(self, case: Case) -> Case:
        """A fixed Case made expressible (scale kinds) and held to this implementation's recipe; raises
        Inexpressible (a skip) for a convention that makes no static-scale writes."""
        if not self.convention.static:
            raise Inexpressible(self.convention.dynamic_only)
        case = self.convention.fit(case)
        return case.replace(recipe=self.recipe) if self.recipe else case

    def cases(self, **space: object) -> st.SearchStrategy[Case]:
        """strategies.cases(**space), narrowed to what the convention expresses and the recipe held.

        Raises Inexpressible when nothing asked for is expressible in the convention.
        """
        if self.recipe:
            space["recipes"] = (self.recipe,)
        try:
            return cases(**self.convention.narrow(**space))
        except LookupError as exc:
            raise Inexpressible(str(exc)) from exc


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


def from_spec(spec: str, kwargs: dict | None = None, convention: Convention | None = None) -> Implementation:
    """An Implementation loaded from a spec, in the convention its signature declares (or the one given).

    The fused kernel's spec keeps its usual name. Raises ValueError when the convention cannot be told.
    """
    kwargs = dict(kwargs or {})
    if spec == FUSED_SPEC and set(kwargs) == {"encoder"} and kwargs["encoder"] in ENCODERS:
        return fused(kwargs["encoder"])
    fn = load_callable(spec)
    interpreter_casts.install()  # a Triton kernel's own casts, on the CPU, as the GPU makes them
    convention = convention or detect(fn)
    if kwargs and convention is not KVFP8:
        raise ValueError(f"--impl {spec!r}: fixed keywords {sorted(kwargs)} are for the kvfp8 convention, "
                         f"not {convention.name}")
    return Implementation(spec, fn, kwargs, resolve_spec(spec), convention)


def selected_implementations(spec: str | None, convention: Convention | None = None) -> list[Implementation]:
    """--impl (or $KVFP8_IMPL) if given, else the fused kernel on each encoder available."""
    spec = spec or os.environ.get(IMPL_ENV)
    if spec:
        return [from_spec(spec, convention=convention)]
    return default_implementations()
