"""Errors, the argument contract: every class of invalid argument raises a clear TypeError/ValueError
naming the argument, before anything is written, in the fused kernel and in the reference alike (both
validate in kernel/plan.py).

This is this project's stricter contract, not what every implementation must do: the whole module is
marked `argument_contract`, so a run against another implementation reports "does not validate"
apart from "writes wrong bytes", and `-m "not argument_contract"` deselects it. An implementation in
another convention is held to the message naming the argument as its own signature spells it; this
repository's kernel is held to the exact messages (the `match` patterns).

Each class is a `Mutation`: it takes the valid arguments of a small drawn Case and breaks one of
them. Device mismatches use 'meta' tensors, so they run on CPU-only machines too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conformance.budgets import share
from conformance.cachemap import CACHES
from conformance.conventions import POSITIONAL
from conformance.harness import abandon_if_context_lost, fail
from conformance.impls import Implementation, Inexpressible
from kernel import naive_fp8_set_kv_buffer
from strategies.build import Built, build
from strategies.cases import small_cases
from strategies.overlap import overlapping_pair, placements, pools, storage_bytes

Call = dict  # argument name -> value; "recipe" and "checked" too

pytestmark = pytest.mark.argument_contract


@dataclass(frozen=True)
class Mutation:
    name: str
    error: type[Exception]
    match: str  # a regex the message must contain: names the argument
    apply: Callable[[Call, Built, st.DataObject], None]
    # Also require every argument the mutation replaced to be named (ours and the reference): the
    # overlap classes draw which cache and which other argument, and the regex cannot know the pair.
    names_each: bool = False


def _set(key: str, fn: Callable[[Call, Built, st.DataObject], object]) -> Callable:
    def apply(call: Call, built: Built, data: st.DataObject) -> None:
        call[key] = fn(call, built, data)
    return apply


def _meta(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")


def _which(data: st.DataObject, options: tuple[str, ...], label: str) -> str:
    return data.draw(st.sampled_from(options), label=label)


def _retype(names: tuple[str, ...], dtypes: tuple[torch.dtype, ...]) -> Callable:
    def apply(call: Call, built: Built, data: st.DataObject) -> None:
        name = _which(data, names, "argument")
        dtype = data.draw(st.sampled_from(dtypes), label="bad_dtype")
        call[name] = torch.zeros(call[name].shape, dtype=dtype, device=call[name].device)
    return apply


def _to_meta(names: tuple[str, ...]) -> Callable:
    def apply(call: Call, built: Built, data: st.DataObject) -> None:
        name = _which(data, names, "argument")
        call[name] = _meta(call[name])
    return apply


def _bad_float_scale(call: Call, built: Built, data: st.DataObject) -> None:
    name = _which(data, ("k_scale", "v_scale"), "argument")
    call[name] = data.draw(st.sampled_from((0.0, -0.0, -1.0, -2.0**-6, float("nan"), float("inf"),
                                            float("-inf"), 1e-50, 1e39, 0)), label="bad_scale")


def _scale_tensor(shape: tuple[int, ...] | str, dtype: torch.dtype = torch.float32, device: str | None = None):
    """A scale tensor of this shape; "heads+1": one value more than the heads (neither one value nor one
    per head, which is a valid per-head scale)."""
    def apply(call: Call, built: Built, data: st.DataObject) -> None:
        name = _which(data, ("k_scale", "v_scale"), "argument")
        size = (built.case.num_heads + 1,) if shape == "heads+1" else shape
        call[name] = torch.ones(size, dtype=dtype, device=device or built.k.device)
    return apply


def _expanded(call: Call, built: Built, data: st.DataObject) -> None:
    name = _which(data, CACHES, "argument")
    cache = call[name]
    # Only dims of size >= 2, so the shape (and every other check) is unchanged.
    dim = data.draw(st.sampled_from([i for i, n in enumerate(cache.shape) if n > 1]), label="expanded_dim")
    call[name] = cache.narrow(dim, 0, 1).expand(cache.shape)


def _grow(name: str, dim: int, by: int = 1) -> Callable:
    def apply(call: Call, built: Built, data: st.DataObject) -> None:
        x = call[name]
        shape = list(x.shape)
        shape[dim] += by
        call[name] = torch.zeros(shape, dtype=x.dtype, device=x.device)
    return apply


def _input_shape(call: Call, built: Built, data: st.DataObject) -> None:
    name = _which(data, ("k", "v"), "argument")
    x = call[name]
    form = data.draw(st.sampled_from(("heads+1", "dim+1", "rank4", "rank1", "flat+1")), label="form")
    t, h, d = x.shape[0], built.case.num_heads, built.case.head_dim
    shape = {"heads+1": (t, h + 1, d), "dim+1": (t, h, d + 1), "rank4": (t, h, d, 1), "rank1": (t * h * d,),
             "flat+1": (t, h * d + 1)}[form]
    call[name] = torch.zeros(shape, dtype=x.dtype, device=x.device)


def _not_a_tensor(call: Call, built: Built, data: st.DataObject) -> None:
    name = _which(data, POSITIONAL[:5], "argument")
    form = data.draw(st.sampled_from(("list", "None", "int")), label="form")
    call[name] = {"list": call[name].tolist(), "None": None, "int": 3}[form]


def _page_size_mismatch(call: Call, built: Built, data: st.DataObject) -> None:
    call["page_size"] = call["page_size"] + data.draw(st.integers(1, 4), label="delta")


def _out_of_range(call: Call, built: Built, data: st.DataObject) -> None:
    loc = call["cache_loc"].clone()
    i = data.draw(st.integers(0, loc.numel() - 1), label="token")
    loc[i] = built.case.num_slots + data.draw(st.integers(0, 100), label="past_end")
    call["cache_loc"], call["checked"] = loc, True


def _overlapping(call: Call, built: Built, data: st.DataObject) -> None:
    name = _which(data, CACHES, "argument")
    cache = call[name]
    call[name] = cache.as_strided(cache.shape, (1,) * cache.dim(), cache.storage_offset())  # elements alias


# -- memory overlap: a cache shares a byte with the other cache or with an argument the call reads ------
# strategies.overlap draws the byte (`placements`: anywhere, or exactly one byte at the ends of the two
# extents, inside a 2-, 4- or 8-byte element of the other) and copies both views, values kept, into one
# buffer: the call is valid in every other way (cache_loc and scales read as they did).

def _overlap(cache: str, other: str, call: Call, data: st.DataObject) -> None:
    a, b = call[cache], call[other]
    placement = data.draw(placements(tuple(a.shape), tuple(b.shape), b.element_size()), label="placement")
    call[cache], call[other] = overlapping_pair(a, b, placement)


def _caches_overlap(call: Call, built: Built, data: st.DataObject) -> None:
    k_cache = call["k_cache"]
    if data.draw(st.booleans(), label="pool_strides"):  # the halves of a real pool, then one half moved
        pool = data.draw(pools(built.case.cache_shape, k_cache.dim()), label="pool")
        scratch = torch.zeros(pool.offset + pool.span(built.case.cache_shape), dtype=torch.uint8,
                              device=k_cache.device)
        call["k_cache"], call["v_cache"] = pool.views(scratch, 0, built.case.cache_shape, k_cache.dim(),
                                                      k_cache.dtype)
    cache = _which(data, CACHES, "cache")
    _overlap(cache, "v_cache" if cache == "k_cache" else "k_cache", call, data)
    if data.draw(st.booleans(), label="v_cache_retyped"):  # the same bytes through the other cache dtype
        v = call["v_cache"]
        call["v_cache"] = v.view(torch.float8_e4m3fn if v.dtype == torch.uint8 else torch.uint8)


def _cache_overlaps(others: tuple[str, ...]) -> Callable:
    def apply(call: Call, built: Built, data: st.DataObject) -> None:
        _overlap(_which(data, CACHES, "cache"), _which(data, others, "other"), call, data)
    return apply


def _cache_overlaps_scale(call: Call, built: Built, data: st.DataObject) -> None:
    name = _which(data, ("k_scale", "v_scale"), "other")
    scale = call[name]
    if not isinstance(scale, torch.Tensor):  # a float (or None) scale becomes a tensor of the same value
        shape = data.draw(st.sampled_from(((1,), ())), label="scale_shape")
        value = 1.0 if scale is None else float(scale)
        scale = torch.full(shape, value, dtype=torch.float32, device=built.k.device)
    call[name] = scale
    _overlap(_which(data, CACHES, "cache"), name, call, data)


MUTATIONS = [
    Mutation("overlapping-cache", ValueError, r"(k|v)_cache .*overlap", _overlapping),
    Mutation("aliased-caches", ValueError, r"v_cache .*k_cache",
             lambda c, b, d: c.__setitem__("v_cache", c["k_cache"])),
    Mutation("caches-overlap", ValueError, r"v_cache must not overlap k_cache in memory", _caches_overlap),
    Mutation("cache-overlaps-input", ValueError, r"\b[kv]_cache must not overlap [kv] in memory",
             _cache_overlaps(("k", "v")), names_each=True),
    Mutation("cache-overlaps-cache-loc", ValueError, r"\b[kv]_cache must not overlap cache_loc in memory",
             _cache_overlaps(("cache_loc",)), names_each=True),
    Mutation("cache-overlaps-scale", ValueError, r"\b[kv]_cache must not overlap [kv]_scale in memory",
             _cache_overlaps_scale, names_each=True),
    Mutation("not-a-tensor", TypeError, r"(k|v|k_cache|v_cache|cache_loc) must be a torch.Tensor", _not_a_tensor),
    Mutation("input-shape", ValueError, r"\b[kv] must (have shape|be 2-D)", _input_shape),
    Mutation("input-dtype", TypeError, r"\b[kv]\.dtype must be",
             _retype(("k", "v"), (torch.float64, torch.int32, torch.int8, torch.float8_e4m3fn))),
    Mutation("kv-dtype-mismatch", TypeError, r"v\.dtype must equal k\.dtype",
             lambda c, b, d: c.__setitem__("v", c["v"].to(
                 torch.float16 if c["k"].dtype != torch.float16 else torch.bfloat16))),
    Mutation("kv-token-mismatch", ValueError, r"v has \d+ tokens but k has", _grow("v", 0)),
    Mutation("cache-dtype", TypeError, r"(k|v)_cache\.dtype must be",
             # float8_e5m2 is a valid cache now (docs/e5m2.md); its fnuz variant is not
             _retype(CACHES, (torch.float16, torch.int8, torch.int32, torch.float8_e5m2fnuz))),
    Mutation("cache-rank", ValueError, r"(k|v)_cache must be 3-D",
             lambda c, b, d: c.__setitem__("k_cache", c["k_cache"].unsqueeze(0))),
    Mutation("cache-shape-mismatch", ValueError, r"v_cache shape .* must equal k_cache shape", _grow("v_cache", 0)),
    Mutation("device", ValueError, r"(v|k_cache|v_cache|cache_loc) must be on \S+ like k",
             _to_meta(("v", "k_cache", "v_cache", "cache_loc"))),
    Mutation("page-size-type", TypeError, r"page_size must be an int",
             _set("page_size", lambda c, b, d: d.draw(st.sampled_from((16.0, True, "16", None)), label="page_size"))),
    Mutation("page-size-value", ValueError, r"page_size must be >= 1",
             _set("page_size", lambda c, b, d: d.draw(st.integers(-3, 0), label="page_size"))),
    Mutation("page-size-mismatch", ValueError, r"k_cache\.shape\[1\] must equal page_size", _page_size_mismatch),
    Mutation("cache-loc-dtype", TypeError, r"cache_loc\.dtype must be int32 or int64",
             _retype(("cache_loc",), (torch.int16, torch.uint8, torch.float32))),
    Mutation("cache-loc-rank", ValueError, r"cache_loc must have shape",
             lambda c, b, d: c.__setitem__("cache_loc", c["cache_loc"][:, None])),
    Mutation("cache-loc-length", ValueError, r"cache_loc must have shape", _grow("cache_loc", 0)),
    Mutation("cache-loc-out-of-range", ValueError, r"cache_loc entries must be <", _out_of_range),
    Mutation("scale-type", TypeError, r"[kv]_scale must be None, a float",
             lambda c, b, d: c.__setitem__(_which(d, ("k_scale", "v_scale"), "argument"),
                                           d.draw(st.sampled_from(("0.5", [0.5], True, 1j)), label="scale"))),
    Mutation("scale-dtype", TypeError, r"[kv]_scale must be a float32 tensor", _scale_tensor((1,), torch.float64)),
    Mutation("scale-numel", ValueError, r"[kv]_scale must be a 0-d or 1-element", _scale_tensor("heads+1")),
    Mutation("scale-device", ValueError, r"[kv]_scale must be on \S+ like k", _scale_tensor((), device="meta")),
    Mutation("scale-value", ValueError, r"[kv]_scale must be a positive finite", _bad_float_scale),
    Mutation("expanded-cache", ValueError, r"(k|v)_cache must not be an expanded view", _expanded),
    Mutation("recipe-name", ValueError, r"recipe must be one of",
             _set("recipe", lambda c, b, d: d.draw(st.sampled_from(("Unfused", "fp8", "")), label="recipe"))),
    Mutation("recipe-type", TypeError, r"recipe must be a kernel.Recipe",
             _set("recipe", lambda c, b, d: d.draw(st.sampled_from((None, 3)), label="recipe"))),
    Mutation("checked-type", TypeError, r"checked must be a bool",
             _set("checked", lambda c, b, d: d.draw(st.sampled_from((1, "yes", None)), label="checked"))),
]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # The reference's own checks are this repository's business: run them only when it tests its kernel.
    ours = all(i.is_ours for i in metafunc.config._kvfp8_impls)
    metafunc.parametrize("target", ["impl", "reference"] if ours else ["impl"])


def _mutated(before: Call, after: Call) -> list[str]:
    return [name for name in after if after[name] is not before.get(name)]


@pytest.mark.parametrize("mutation", [pytest.param(m, id=m.name) for m in MUTATIONS])
@share(3)  # one mutation over small layouts: validation has few branches, and the tests are 62 x 2 x 2
@given(data=st.data())
def test_invalid_argument_raises_and_writes_nothing(data, mutation: Mutation, target: str,
                                                    impl: Implementation, device):
    built = build(impl.fit(data.draw(small_cases(), label="case")), device)
    before = built.snapshot()
    call: Call = built.call()
    mutation.apply(call, built, data)
    caches_before = _cache_storages(call)  # a mutation may give a cache a buffer of its own
    names = _mutated(built.call(), call)
    convention = impl.convention
    missing = [n for n in names if n not in convention.arguments]
    if target == "impl" and missing:
        raise Inexpressible(f"the {convention.name} convention has no {'/'.join(missing)} argument")
    invoke = impl.invoke if target == "impl" else lambda c: naive_fp8_set_kv_buffer(**c)
    who = impl if target == "impl" else dataclasses.replace(impl, name="the reference")
    if target == "impl":
        # First a valid call of the same layout, on other buffers: an implementation that remembers
        # layouts it accepted (this kernel's eager fast path) must still refuse the invalid call.
        # Whether the valid call is right is the other properties' business.
        with contextlib.suppress(Exception):
            impl.invoke(built.copy().call())
        abandon_if_context_lost(impl, device, "on a valid call")
    spelled = [convention.spelling.get(n, n) for n in names]
    try:
        invoke(call)
    except (TypeError, ValueError) as exc:
        error = exc
    else:
        fail(who, f"does not validate {'/'.join(spelled)}: an invalid call ({mutation.name}) did not raise "
                  f"{mutation.error.__name__}", f"{_summary(call, names)}")
    finally:  # a lost CUDA context outranks any other outcome of the call
        abandon_if_context_lost(who, device, f"on an invalid call ({mutation.name})")
    if target == "reference" or impl.is_ours:  # this project's exact error types and messages
        if not isinstance(error, mutation.error) or not re.search(mutation.match, str(error)):
            fail(who, f"{mutation.name}: expected {mutation.error.__name__} matching {mutation.match!r}",
                 f"got {type(error).__name__}: {error}")
        unnamed = [n for n in names if mutation.names_each and not re.search(rf"\b{re.escape(n)}\b", str(error))]
        if unnamed:
            fail(who, f"{mutation.name}: the message does not name {'/'.join(unnamed)}",
                 f"{type(error).__name__}: {error}; {_summary(call, names)}")
    elif not any(re.search(rf"\b{re.escape(n)}\b", str(error)) for n in spelled):
        fail(who, f"raised for an invalid {'/'.join(spelled)} ({mutation.name}) without naming it",
             f"{type(error).__name__}: {error}")
    for which in CACHES:
        changed = which in caches_before and not torch.equal(caches_before[which], storage_bytes(call[which]))
        if changed or not torch.equal(before[which], built.buffers[which]):
            fail(who, f"wrote {convention.spelling.get(which, which)} before raising for an invalid argument",
                 f"{mutation.name}: {type(error).__name__}: {error}")


def _cache_storages(call: Call) -> dict[str, torch.Tensor]:
    """A copy of the whole buffer behind each cache the (mutated) call passes; meta tensors have none."""
    return {n: storage_bytes(call[n]).clone() for n in CACHES
            if isinstance(call[n], torch.Tensor) and call[n].device.type != "meta"}


def _summary(call: Call, names: list[str]) -> str:
    def show(x: object) -> str:
        if isinstance(x, torch.Tensor):
            return f"tensor(shape={tuple(x.shape)}, stride={x.stride()}, dtype={x.dtype}, device={x.device})"
        return repr(x)
    return "; ".join(f"{n}={show(call[n])}" for n in names)
