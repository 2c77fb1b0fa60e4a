"""Per-(token, head) dynamic scales: each written head's bytes and its stored fp32 scale, byte for byte.

`per_token_head=` (kernel/per_token_head.py: the recipes per-token-head-vllm and -flashinfer) with the
scale stored inline (the caches' last dim widened to D + 4) or in float32 `k_scale_cache`/`v_scale_cache`
of any strides. Asserted against the reference, over every whole buffer: both caches with their guard
bands and untouched slots, the scale caches with their guards, and the inputs and cache_loc (which
must come back unmodified). Heads that are all zero, subnormal, or hold an inf or a NaN are drawn on
purpose (strategies/per_token_head.py). Also: calls whose every slot is padding or out of range write
nothing; each invalid argument raises before anything is written; (CUDA) a captured call replays.

Only implementations that take `per_token_head=` are called (this repository's kernel); others skip.
"""

from __future__ import annotations

import inspect
import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kernel
from conformance.budgets import share
from conformance.capture import graph_capture
from conformance.harness import fail
from conformance.impls import test_device as _test_device  # not collected as a test
from conformance.pth_bytediff import bits as _bytes
from conformance.pth_bytediff import located_diff, misplaced
from conformance.test_graphs import graph_settings
from kernel.recipe import DEFAULT_PTH_RECIPE, PTH_RECIPES
from strategies.case import Case, Layout
from strategies.cases import cases
from strategies.per_token_head import LAYOUTS, PTH_MODES, PTHBuilt, PTHCase, build_pth, pth_cases

FIRST_N = 8

# These re-draw the layouts test_per_token_head_is_bit_exact covers, to check one more thing each.
redrawn = share(3)


def _takes_mode(impl) -> bool:
    try:
        return "per_token_head" in inspect.signature(impl.fn).parameters
    except (TypeError, ValueError):
        return False


def _target(impl) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The recipes (modes) and layouts impl's per-token-head calls take; skips one that makes none.
    kvfp8 (per_token_head=): every recipe, told, and both layouts. vllm-per-token-head: the recipe it is
    held to (identified), scale caches (and inline scales where its scale caches default to None), 3-D
    inputs and 4-D caches."""
    conv = impl.convention
    if not conv.per_token_head or (conv.name == "kvfp8" and not _takes_mode(impl)):
        takes = ", no per_token_head= parameter" if conv.per_token_head else ""
        pytest.skip(f"{impl.name} makes no per-token-head writes (the {conv.name} convention{takes})")
    if conv.name == "kvfp8":
        return PTH_MODES, LAYOUTS
    layouts = ("separate", "inline") if _takes_inline(impl) else ("separate",)
    return (impl.recipe if impl.recipe in PTH_RECIPES else DEFAULT_PTH_RECIPE,), layouts


def _takes_inline(impl) -> bool:
    """A vllm-per-token-head write whose k_scale_cache and v_scale_cache default to None: called without them,
    it stores the scales inline (its caches' last dim D + 4), and is held to that layout too."""
    try:
        params = inspect.signature(impl.fn).parameters
    except (TypeError, ValueError):
        return False
    return all(n in params and params[n].default is None for n in ("k_scale_cache", "v_scale_cache"))


def _skip_unless_per_token_head(impl) -> None:
    """This project's own per-token-head contract (its error messages, its documented edge bytes, the
    inline layout through per_token_head=): the kvfp8 convention only."""
    _target(impl)
    if impl.convention.name != "kvfp8":
        pytest.skip(f"this repository's own per-token-head contract (the {impl.convention.name} convention)")


def _base(size: str, impl=None, **space: object) -> st.SearchStrategy[Case]:
    if impl is not None and impl.convention.name != "kvfp8":
        space = {"input_ranks": impl.convention.input_ranks, "cache_ranks": impl.convention.cache_ranks, **space}
    return cases(size=size, scale_kinds=("none",), recipes=("single",), allow_out_of_range=True, **space)


def _fail(impl, what: str, report: str, pc: PTHCase, kind: str = "bytes") -> None:
    """fail(), with the PTHCase saved as a failure file that `python -m tools.repro FILE` replays."""
    from conformance.artifacts import save_failure
    saved = save_failure(pc.case, impl, report, extra={"pth_case": pc.to_dict()})
    fail(impl, what, f"{report}\n{saved}".rstrip(), kind=kind)


def _run(impl, b: PTHBuilt) -> str | None:
    try:
        impl.convention.invoke_per_token_head(impl.fn, b.call(), impl.kwargs)
        if b.built.k.device.type == "cuda":
            torch.cuda.synchronize(b.built.k.device)
    except Exception as exc:  # noqa: BLE001  (reported, with the case)
        return f"{type(exc).__name__}: {exc}"
    return None


def _reference(b: PTHBuilt) -> None:
    kernel.naive_fp8_set_kv_buffer(**b.call())


def diff(expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> str | None:
    """The first differing elements of each buffer (bit patterns of the whole buffers), or None."""
    lines = []
    for name, want in expected.items():
        a, e = _bytes(actual[name]).flatten(), _bytes(want).flatten()
        bad = (a != e).nonzero().flatten()
        if bad.numel():
            shown = ", ".join(f"[{i}] expected 0x{int(e[i]) & 0xFFFFFFFF:02X} actual 0x{int(a[i]) & 0xFFFFFFFF:02X}"
                              for i in bad[:FIRST_N].tolist())
            lines.append(f"{name}: {bad.numel()} of {e.numel()} bytes differ; first: {shown}")
    return "\n".join(lines) or None


def _describe(pc: PTHCase) -> str:
    c = pc.case
    return (f"{pc.mode}, {pc.layout}; T={c.num_tokens} H={c.num_heads} D={c.head_dim} page_size={c.page_size} "
            f"pages={c.num_pages} {c.input_dtype} -> {c.cache_dtype} rank {c.input_rank}/{c.cache_rank}; "
            f"cache_loc={list(c.cache_loc)}; special heads={list(pc.heads)}; seed={c.seed}")


@pytest.mark.parametrize("layout", LAYOUTS)
@given(data=st.data())
def test_per_token_head_is_bit_exact(data, layout, impl, device):
    """Whole caches (inline scale bytes included), whole scale caches, and unmodified inputs; one test a
    layout (the capability table's rows per-token-head-inline and -separate)."""
    modes, layouts = _target(impl)
    if layout not in layouts:
        pytest.skip(f"the {impl.convention.name} convention stores the scales in scale caches only (its "
                    "k_scale_cache and v_scale_cache have no default of None)")
    size = "large" if device.type == "cuda" else "small"
    _check_bit_exact(impl, data.draw(pth_cases(_base(size, impl), modes, (layout,)), label="pth_case"), device)


@redrawn
@given(data=st.data())
def test_serving_shapes_are_bit_exact_inline(data, impl, device):
    """Inline scales on the shapes servers run: H a multiple of 4, D a power of two, contiguous tensors
    (where a kernel may take a fast path: this repository's writes four heads' slot bytes at a time)."""
    modes, layouts = _target(impl)
    if "inline" not in layouts:
        pytest.skip(f"the {impl.convention.name} convention stores the scales in scale caches only")
    heads = data.draw(st.sampled_from((4, 8)), label="num_heads")
    dim = data.draw(st.sampled_from((16, 32, 64, 128)), label="head_dim")
    base = _base("small", impl, contiguous=True, min_heads=heads, max_heads=heads, max_dim=dim)
    pc = data.draw(pth_cases(base.filter(lambda c: c.head_dim == dim), modes, ("inline",)), label="pth_case")
    _check_bit_exact(impl, pc, device)


def _check_bit_exact(impl, pc: PTHCase, device: torch.device) -> None:
    expected, actual = build_pth(pc, device), build_pth(pc, device)
    _reference(expected)
    error = _run(impl, actual)
    if error:
        _fail(impl, f"raises on a valid per-token-head call ({_describe(pc)}):", error, pc)
    report = located_diff(expected, actual)
    if report:
        # Rows out of place and wrong values are two failures to Hypothesis (report_multiple_bugs shows each), so
        # that a slot defect is not hidden behind a scale defect of the same kernel, which every Case shows
        kind = "placement" if misplaced(expected, actual, build_pth(pc, device)) else "bytes"
        _fail(impl, f"differs from the reference ({_describe(pc)}):", report, pc, kind)


@redrawn
@given(data=st.data())
def test_padding_and_out_of_range_slots_write_nothing(data, impl, device):
    """A call whose every cache_loc entry is negative or >= the number of slots changes no byte."""
    modes, layouts = _target(impl)
    pc = data.draw(pth_cases(_base("small", impl), modes, layouts, kinds=()), label="pth_case")
    slots = pc.case.num_slots
    loc = tuple(data.draw(st.sampled_from((-1, -7, slots, slots + 3, 2**31 - 1)), label=f"loc_{t}")
                for t in range(pc.case.num_tokens))
    pc = PTHCase(pc.case.replace(cache_loc=loc, checked=False), pc.mode, pc.layout, pc.k_scale_layout,
                 pc.v_scale_layout)
    b = build_pth(pc, device)
    before = b.snapshot()
    error = _run(impl, b)
    if error:
        _fail(impl, f"raises on a call of padding and out-of-range slots ({_describe(pc)}):", error, pc)
    report = diff(before, b.buffers)
    if report:
        _fail(impl, f"writes with no slot in range ({_describe(pc)}):", report, pc)


def _fixed(layout: str, cache_dtype: str = "uint8") -> PTHCase:
    case = Case(num_tokens=2, num_heads=3, head_dim=8, page_size=4, num_pages=2, cache_loc=(1, 6),
                input_dtype="float32", cache_dtype=cache_dtype, seed=1, recipe="single")
    if layout == "separate":
        return PTHCase(case, PTH_MODES[0], "separate", Layout.contiguous(3), Layout.contiguous(3))
    return PTHCase(case, PTH_MODES[0], "inline")


def _unwidened(b: PTHBuilt) -> dict:
    kc = torch.zeros(2, 4, 3, 8, dtype=torch.uint8, device=b.built.k.device)
    return dict(k_cache=kc, v_cache=kc.clone())


def _widened_by(n: int):
    def change(b: PTHBuilt) -> dict:
        kc = torch.zeros(2, 4, 3, 8 + n, dtype=torch.uint8, device=b.built.k.device)
        return dict(k_cache=kc, v_cache=kc.clone())
    return change


def _scale_cache_overlapping_cache(b: PTHBuilt) -> dict:
    kc = b.built.k_cache  # [2, 4, 3, 8] uint8, contiguous: 2 float32 a head
    return dict(k_scale_cache=kc.view(torch.float32)[..., 0])


# (name, layout, changes to the call, error type, message)
MUTATIONS = (
    ("unwidened-page", "inline", _unwidened, ValueError, r"k_cache's last dim must be widened to head_dim \+ 4 = 12"),
    ("widened-by-2", "inline", _widened_by(2), ValueError, r"k_cache's last dim must be widened"),
    ("separate-but-widened", "separate", _widened_by(4), ValueError, r"k_cache's last dim must be head_dim = 8"),
    ("one-scale-cache", "inline", lambda b: dict(k_scale_cache=torch.zeros(2, 4, 3, device=b.built.k.device)),
     ValueError, r"v_scale_cache must be given too"),
    ("scale-cache-shape", "separate", lambda b: dict(v_scale_cache=torch.zeros(2, 4, 4, device=b.built.k.device)),
     ValueError, r"v_scale_cache must have shape \[2, 4, 3\]"),
    ("scale-cache-dtype", "separate",
     lambda b: dict(k_scale_cache=torch.zeros(2, 4, 3, dtype=torch.float16, device=b.built.k.device)),
     TypeError, r"k_scale_cache.dtype must be float32"),
    ("scale-cache-expanded", "separate",
     lambda b: dict(k_scale_cache=torch.zeros(1, device=b.built.k.device).expand(2, 4, 3)),
     ValueError, r"k_scale_cache strides .* overlap"),
    ("scale-cache-overlaps-cache", "separate", _scale_cache_overlapping_cache, ValueError,
     r"k_scale_cache must not overlap k_cache"),
    ("scale-caches-overlap", "separate", lambda b: dict(v_scale_cache=b.k_scale_cache), ValueError,
     r"v_scale_cache must not overlap k_scale_cache"),
    ("static-scale-given", "inline", lambda b: dict(k_scale=0.5), ValueError,
     r"k_scale must be None with per_token_head"),
    ("recipe-given", "inline", lambda b: dict(recipe="divide"), ValueError,
     r"recipe does not apply with per_token_head"),
    ("unknown-mode", "inline", lambda b: dict(per_token_head="per-token-head-sglang"), ValueError,
     r"per_token_head must be True or one of"),
    ("mode-not-bool-or-name", "inline", lambda b: dict(per_token_head=1), TypeError,
     r"per_token_head must be a bool or a recipe name"),
    ("scale-cache-without-mode", "separate", lambda b: dict(per_token_head=False), ValueError,
     r"k_scale_cache is for per_token_head writes"),
    ("e5m2-cache-dtype", "inline", lambda b: dict(cache_dtype="fp8_e5m2"), ValueError,
     r"per_token_head writes e4m3"),
    ("e5m2-caches", "separate", lambda b: dict(k_cache=b.built.k_cache.view(torch.float8_e5m2),
                                               v_cache=b.built.v_cache.view(torch.float8_e5m2)), ValueError,
     r"per_token_head writes e4m3"),
    ("fnuz-caches", "separate", lambda b: dict(k_cache=b.built.k_cache.view(torch.float8_e4m3fnuz),
                                               v_cache=b.built.v_cache.view(torch.float8_e4m3fnuz)), ValueError,
     r"per_token_head writes e4m3"),
    ("checked-out-of-range", "inline",
     lambda b: dict(checked=True, cache_loc=torch.tensor([1, 8], device=b.built.k.device)), ValueError,
     r"cache_loc entries must be < 8"),
)


@pytest.mark.parametrize("name, layout, change, kind, message", MUTATIONS, ids=[m[0] for m in MUTATIONS])
@pytest.mark.parametrize("which", ("impl", "reference"))
def test_invalid_arguments_raise_before_writing(name, layout, change, kind, message, which, impl, device):
    """Each invalid argument raises its TypeError/ValueError, naming it, and no byte of any buffer the
    call could write (caches, scale caches, and those the mutation brings) changes."""
    _skip_unless_per_token_head(impl)
    b = build_pth(_fixed(layout), device)
    call = {**b.call(), **change(b)}
    watched = {**b.buffers, **{n: t for n, t in call.items() if isinstance(t, torch.Tensor)}}
    before = {n: _bytes(t).clone() for n, t in watched.items()}
    fn = kernel.naive_fp8_set_kv_buffer if which == "reference" else (lambda **kw: impl.fn(**kw, **impl.kwargs))
    with pytest.raises(kind, match=message):
        fn(**call)
    report = diff(before, {n: _bytes(t) for n, t in watched.items()})
    assert report is None, f"{name}: written before the error:\n{report}"


@pytest.mark.cuda
@pytest.mark.skipif(_test_device().type != "cuda", reason="CUDA graphs need CUDA (no CUDA device here, or "
                                                        "TRITON_INTERPRET is set)")
@graph_settings
@given(data=st.data())
def test_per_token_head_replays_from_a_cuda_graph(data, impl, device):
    """A captured per-token-head call, replayed after new K/V values are copied in, writes what the
    reference writes for those values (bytes and scales)."""
    modes, layouts = _target(impl)
    pc = data.draw(pth_cases(_base("small", impl, checked=False), modes, layouts), label="pth_case")
    other = data.draw(st.integers(0, 2**32 - 1), label="replay_seed")
    b = build_pth(pc, device)
    _run(impl, b)  # compiles outside the capture
    pristine = b.snapshot()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream), graph_capture(graph, stream=stream):
        impl.convention.invoke_per_token_head(impl.fn, b.call(), impl.kwargs)
    torch.cuda.current_stream(device).wait_stream(stream)
    for name, buf in pristine.items():
        b.buffers[name].copy_(buf)
    replayed = PTHCase(pc.case.replace(seed=other), pc.mode, pc.layout, pc.k_scale_layout, pc.v_scale_layout,
                       pc.heads)
    fresh = build_pth(replayed, device)
    b.built.k.copy_(fresh.built.k)
    b.built.v.copy_(fresh.built.v)
    graph.replay()
    torch.cuda.synchronize(device)
    expected = build_pth(pc, device)
    expected.built.k.copy_(fresh.built.k)
    expected.built.v.copy_(fresh.built.v)
    _reference(expected)
    report = diff({n: expected.buffers[n] for n in ("k_cache", "v_cache", "k_scale_cache", "v_scale_cache")
                   if n in expected.buffers}, b.buffers)
    if report:
        fail(impl, f"a replay differs from the reference for the values copied in ({_describe(pc)}):", report)


# Heads of docs/per-token-head.md's edge-case table: (values, bytes, scale bits) per recipe.
_EDGE_HEADS = (
    ((0.0, -0.0, 0.0, -0.0), (0x00, 0x80, 0x00, 0x80),
     {"per-token-head-vllm": 0x358637BD, "per-token-head-flashinfer": 0x2720D7C5}),  # the floors
    ((1.0, -2.0, float("inf"), float("-inf")), (0x00, 0x80, 0x7F, 0x7F), 0x7F800000),  # s = inf
    ((1.0, float("nan"), 2.0, 3.0), (0x7F,) * 4, 0x7FC00000),  # a NaN head is NaN throughout
    ((1344.0, -1.0, 0.5, 1e-3), (0x7E, 0xAB, 0x23, 0x00), 0x40400000),  # s = 3
)


@pytest.mark.parametrize("mode", PTH_MODES)
@pytest.mark.parametrize("which", ("impl", "reference"))
def test_edge_case_heads_as_documented(mode, which, impl, device):
    """One token of four heads, inline: each head's bytes and scale bits are the documented ones."""
    _skip_unless_per_token_head(impl)
    k = torch.tensor([h[0] for h in _EDGE_HEADS], dtype=torch.float32, device=device)[None]
    cache = torch.full((1, 1, 4, 8), 0x55, dtype=torch.uint8, device=device)
    caches = (cache, cache.clone())
    fn = kernel.naive_fp8_set_kv_buffer if which == "reference" else (lambda *a, **kw: impl.fn(*a, **kw, **impl.kwargs))
    fn(k, k.clone(), *caches, torch.tensor([0], device=device), page_size=1, per_token_head=mode)
    for c in caches:
        for h, (values, data, scale) in enumerate(_EDGE_HEADS):
            bits = scale[mode] if isinstance(scale, dict) else scale
            want = list(data) + [(bits >> (8 * j)) & 0xFF for j in range(4)]
            assert c[0, 0, h].tolist() == want, f"{mode}: head {values}: got {[hex(b) for b in c[0, 0, h].tolist()]}"


# -- the other families, on per-token-head writes ----------------------------------------------------

@redrawn
@given(data=st.data())
def test_a_second_call_of_a_layout_is_bit_exact(data, impl, device):
    """Repeat: the same layouts again with other values (a second seed): no state of the first call leaks."""
    modes, layouts = _target(impl)
    pc = data.draw(pth_cases(_base("small", impl), modes, layouts), label="pth_case")
    other = data.draw(st.integers(0, 2**31 - 1).filter(lambda s: s != pc.case.seed), label="second_seed")
    second = PTHCase(pc.case.replace(seed=other), pc.mode, pc.layout, pc.k_scale_layout, pc.v_scale_layout, pc.heads)
    error = _run(impl, build_pth(pc, device))
    expected, actual = build_pth(second, device), build_pth(second, device)
    _reference(expected)
    error = error or _run(impl, actual)
    if error:
        _fail(impl, f"raises on a second per-token-head call of one layout ({_describe(second)}):", error, second)
    report = located_diff(expected, actual)
    if report:
        _fail(impl, f"a second call of one layout differs from the reference ({_describe(second)}):", report, second)


@redrawn
@given(data=st.data())
def test_uint8_and_fp8_caches_hold_the_same_bytes(data, impl, device):
    """Equivalence: a uint8 cache gets the bytes a float8_e4m3fn cache gets, stored scales included."""
    modes, layouts = _target(impl)
    pc = data.draw(pth_cases(_base("small", impl, cache_dtypes=("float8_e4m3fn",)), modes, layouts), label="pth_case")
    as_uint8 = PTHCase(pc.case.replace(cache_dtype="uint8"), pc.mode, pc.layout, pc.k_scale_layout,
                       pc.v_scale_layout, pc.heads)
    fp8, u8 = build_pth(pc, device), build_pth(as_uint8, device)
    error = _run(impl, fp8) or _run(impl, u8)
    if error:
        _fail(impl, f"raises on a valid per-token-head call ({_describe(as_uint8)}):", error, as_uint8)
    report = located_diff(fp8, u8)
    if report:
        _fail(impl, f"a uint8 cache differs from a float8_e4m3fn cache ({_describe(as_uint8)}):", report, as_uint8)


@pytest.mark.parametrize("dtype", ("bfloat16", "float16"))
def test_every_input_pattern(dtype, impl, device):
    """Exhaustive: all 65,536 bit patterns of the input dtype, 512 heads of 128 in order (K) and permuted (V),
    so each pattern is quantized beside others of its own range (NaN and inf heads included), in each layout
    the implementation takes."""
    from conformance.test_exhaustive import patterns
    modes, layouts = _target(impl)
    # 64 distinct slots of 80 (7 is prime to 80): a shared slot's bytes would be either token's.
    case = Case(num_tokens=64, num_heads=8, head_dim=128, page_size=16, num_pages=5,
                cache_loc=tuple((7 * t + 3) % 80 for t in range(64)), input_dtype=dtype, seed=7, recipe="single")
    for mode, layout in itertools.product(modes, layouts):
        scales = (Layout.contiguous(3), Layout.contiguous(3)) if layout == "separate" else (None, None)
        pc = PTHCase(case, mode, layout, *scales)
        expected, actual = build_pth(pc, device), build_pth(pc, device)
        for b in (expected, actual):
            for name, permuted in (("k", False), ("v", True)):
                view = getattr(b.built, name)
                view.copy_(patterns(getattr(torch, dtype), permuted).reshape(view.shape).to(device))
        _reference(expected)
        error = _run(impl, actual)
        if error:
            fail(impl, f"raises on all {dtype} patterns ({mode}):", error)
        report = located_diff(expected, actual)
        if report:
            fail(impl, f"differs from the reference over all {dtype} patterns ({mode}, {pc.layout}):", report)
