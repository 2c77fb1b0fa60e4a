"""The eager call's fast path: a call whose layout was seen before skips validation and Triton's binder.

Everything `make_plan` checks, and everything the launch derives (geometry, tile, grid, strides,
constexprs), depends only on the call's layout: dtypes, shapes, strides, devices, the scale kinds,
page_size, the recipe, the encoder and the cache's format. `call_key` packs those into a key; the first call of a key
goes the slow way (make_plan, then Triton's JIT launch) and `remember`s the outcome. A later call
of that key reads its data pointers, checks what depends on them or on values, and calls the
compiled kernel's launcher directly:
- each cache's bytes against the other cache and against every tensor the call reads (extents
  first; where extents meet, the exact test of kernel/overlap.py, cached by relative address);
- a float scale's fp32 value (positive and finite: cached by value);
- 16-byte alignment, which picks the VEC variant of the kernel;
- the current CUDA device.
Anything else, a failed check included, falls back to the slow path, which raises the error.
Triton's launch hooks (profilers) also take the slow path, so they see every call.
Measurements: docs/bench.md ("Host time per eager call").
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from kernel.backend import ENCODER_ENV
from kernel.overlap import Layout, shares_memory
from kernel.plan import Plan
from kernel.recipe import Recipe

_TENSOR = torch.Tensor
_NO_SCALE, _FLOAT_SCALE = 0, 1
_MAX_ENTRIES = 1024
_SCALE_KEYS = slice(20, 22)  # where call_key puts the two scale keys


@dataclass
class _Entry:
    device: int
    empty: bool  # T == 0: validated, nothing to launch
    k_kind: object  # _NO_SCALE, _FLOAT_SCALE, or the tensor key (a tensor scale)
    v_kind: object
    extents: tuple[int, int, int, int, int]  # bytes of k_cache, v_cache, k, v, cache_loc
    k_cache: Layout
    v_cache: Layout
    vec_layout: bool  # strides allow 16-byte accesses; the pointers decide per call
    grid: tuple[int, int, int]
    tails: dict[bool, tuple]  # VEC -> the arguments after the scales, constexprs included
    launchers: dict[bool, tuple]  # VEC -> (run, function, packed metadata) of the compiled kernel


# The CUDA runtime's current device and stream, as Triton's own launcher reads them (a meta-test
# replaces them to drive the fast path on a CPU-only machine).
current_device = getattr(torch._C, "_cuda_getDevice", None)
current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

_ENTRIES: dict[tuple, _Entry] = {}
_FP32: dict[float, float] = {}  # a float scale -> its fp32 value, for valid scales only
_enabled = True


def _scale_key(scale: object) -> object:
    if scale is None:
        return _NO_SCALE
    t = type(scale)
    if t is float or t is int:
        return _FLOAT_SCALE
    if t is _TENSOR and scale.numel() == 1:
        return (scale.dtype, scale.shape, scale.get_device())
    return None  # per-head scales (and anything else) take the slow path


def call_key(k: object, v: object, k_cache: object, v_cache: object, cache_loc: object, k_scale: object,
             v_scale: object, page_size: object, recipe: object, encoder: object,
             cache_dtype: object = None) -> tuple | None:
    """The call's layout as a dict key, or None when the call cannot take the fast path (arguments
    that are not plain tensors, ints and strings: the slow path validates those).

    The caches' dtypes and `cache_dtype` (as given: None, a string or a torch.dtype) are in the key, so
    the cache's format is: an e5m2 call never launches an e4m3 entry, and an e4m3 call's key only
    gains a trailing None."""
    t = _TENSOR
    if not (type(k) is t and type(v) is t and type(k_cache) is t and type(v_cache) is t
            and type(cache_loc) is t and type(page_size) is int
            and (type(recipe) is str or isinstance(recipe, Recipe))
            and (encoder is None or type(encoder) is str)
            and (cache_dtype is None or type(cache_dtype) is str or type(cache_dtype) is torch.dtype)):
        return None
    ks, vs = _scale_key(k_scale), _scale_key(v_scale)
    if ks is None or vs is None:
        return None
    return (k.dtype, k.shape, k.stride(), k.get_device(), v.dtype, v.shape, v.stride(), v.get_device(),
            k_cache.dtype, k_cache.shape, k_cache.stride(), k_cache.get_device(),
            v_cache.dtype, v_cache.shape, v_cache.stride(), v_cache.get_device(),
            cache_loc.dtype, cache_loc.shape, cache_loc.stride(), cache_loc.get_device(),
            ks, vs, page_size, recipe, encoder, os.environ.get(ENCODER_ENV), cache_dtype)


def _scale_args(kind: object, scale: object, dummy: int) -> tuple[int, float, int] | None:
    """(pointer, value, from_pointer) of a scale, or None when it needs the slow path's checks."""
    if kind == _NO_SCALE:
        return dummy, 1.0, 0
    if kind == _FLOAT_SCALE:
        value = _FP32.get(scale)  # type: ignore[call-overload]
        return None if value is None else (dummy, value, 0)
    return scale.data_ptr(), 0.0, 1  # type: ignore[attr-defined]


def launch_known(key: tuple, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 cache_loc: torch.Tensor, k_scale: object, v_scale: object) -> bool:
    """Launch a call of a remembered layout and return True; False: take the slow path."""
    e = _ENTRIES.get(key)
    if e is None or not _enabled or _hooked(_hooks.launch_enter_hook) or _hooked(_hooks.launch_exit_hook):
        return False
    kc, vc, a_k, a_v, loc = k_cache.data_ptr(), v_cache.data_ptr(), k.data_ptr(), v.data_ptr(), cache_loc.data_ptr()
    ks = _scale_args(e.k_kind, k_scale, loc)
    vs = _scale_args(e.v_kind, v_scale, loc)
    if ks is None or vs is None:
        return False
    read = [(a_k, e.extents[2]), (a_v, e.extents[3]), (loc, e.extents[4])]
    if ks[2]:
        read.append((ks[0], 4))
    if vs[2]:
        read.append((vs[0], 4))
    if not reads_disjoint(kc, vc, e, read):
        return False  # the slow path decides exactly, and raises
    if e.empty:
        return True
    if current_device() != e.device:
        return False
    vec = e.vec_layout and not ((a_k | a_v | kc | vc) & 15)
    launcher = e.launchers.get(vec)
    if launcher is None:
        return False
    run, function, packed = launcher
    g0, g1, g2 = e.grid
    try:
        run(g0, g1, g2, current_stream(e.device), function, packed, None, None, None,
            a_k, a_v, kc, vc, loc, ks[0], vs[0], ks[1], vs[1], ks[2], vs[2], *e.tails[vec])
    except TypeError:  # the launcher's calling convention changed (another Triton): stop using it
        disable()
        return False
    return True


def reads_disjoint(kc: int, vc: int, e: _Entry, read: list[tuple[int, int]]) -> bool:
    """True when the caches (at kc, vc) are disjoint from each other and from every (address, extent)
    the call reads; False also when extents meet but the exact test was not run (the slow path runs it)."""
    kc_end, vc_end = kc + e.extents[0], vc + e.extents[1]
    for a, n in read:
        if (a < kc_end and kc < a + n) or (a < vc_end and vc < a + n):
            return False
    return not (kc < vc_end and vc < kc_end and shares_memory(e.k_cache, kc, e.v_cache, vc))


def remember_scales(k_scale: object, v_scale: object, plan: Plan) -> None:
    """Remember the fp32 values of valid float scales (make_plan has just accepted them)."""
    for scale, arg in ((k_scale, plan.k_scale), (v_scale, plan.v_scale)):
        if arg.kind == "float":
            _remember_float(scale, arg.value)


def _remember_float(scale: object, value: float) -> None:
    if type(scale) in (float, int):
        if len(_FP32) > _MAX_ENTRIES:
            _FP32.clear()
        _FP32[scale] = value  # type: ignore[index]


def _new_entry(key: tuple, plan: Plan, grid: tuple[int, int, int], vec_layout: bool, empty: bool) -> _Entry:
    if len(_ENTRIES) > _MAX_ENTRIES:
        _ENTRIES.clear()
    layouts = [Layout.of(t) for t in (plan.k_cache, plan.v_cache, plan.k, plan.v, plan.cache_loc)]
    k_kind, v_kind = key[_SCALE_KEYS]  # as call_key packed them
    return _Entry(plan.device.index if plan.device.type == "cuda" else -1, empty, k_kind, v_kind,
                  tuple(lay.extent for lay in layouts), layouts[0], layouts[1], vec_layout, grid, {}, {})


def remember_empty(key: tuple, plan: Plan) -> None:
    """A validated call with T == 0: later calls of its layout need only the pointer checks."""
    _ENTRIES[key] = _new_entry(key, plan, (0, 0, 0), False, True)


def remember(key: tuple, plan: Plan, compiled: object, grid: tuple[int, int, int], args: tuple,
             constexprs: dict, vec_layout: bool, arg_names: list[str]) -> None:
    """Record a launched call: its layout's arguments and the compiled kernel of its VEC variant."""
    entry = _ENTRIES.get(key)
    if entry is None:  # the key fixes T, the layout and the encoder, so the grid and VEC's layout part too
        entry = _ENTRIES[key] = _new_entry(key, plan, grid, vec_layout, False)
    values = dict(zip(arg_names, args)) | constexprs
    vec = bool(constexprs["VEC"])
    entry.tails[vec] = tuple(values[name] for name in arg_names[11:])
    entry.launchers[vec] = (compiled.run, compiled.function, compiled.packed_metadata)  # type: ignore[attr-defined]


def disable() -> None:
    """Send every call through the slow path (the fast path's launcher call failed: Triton changed)."""
    global _enabled
    _enabled = False


def _hooked(hook: object) -> bool:
    """True when a launch hook is set: None in older Triton, an empty HookChain in newer ones means none."""
    return hook is not None and bool(getattr(hook, "calls", True))


class _NoHooks:
    launch_enter_hook = launch_exit_hook = None


try:  # Triton >= 3.4 keeps its launch hooks here
    from triton import knobs as _knobs
    _hooks = _knobs.runtime
except ImportError:  # pragma: no cover
    _hooks = _NoHooks()
