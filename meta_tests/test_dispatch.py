"""kernel/dispatch.py, the eager fast path: it must launch exactly what the slow path launches.

On a CPU-only machine Triton has no compiled kernel, so these tests drive the fast path with a
recording launcher in place of the compiled one, and compare the arguments it receives with the
slow path's (`kernel.fused.kernel_args`, pointers as addresses). The CUDA test runs both paths for
real and compares the caches' bytes; it skips on CPU.
"""

from __future__ import annotations

import pytest
import torch

import kernel
from kernel import dispatch, fused
from kernel.plan import make_plan
from kernel.triton_kernel import fp8_kv_write


class Recorder:
    """Stands in for a compiled kernel: `run` records its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.function, self.packed_metadata = "function", "metadata"

    def run(self, *args: object) -> None:
        self.calls.append(args)


def _tensors(tokens: int = 5, offset: int = 0, *, scale: object = 0.5) -> dict:
    gen = torch.Generator().manual_seed(tokens + offset)
    k = torch.randn(tokens + offset, 3, 32, generator=gen).to(torch.bfloat16)[offset:]
    return dict(k=k, v=k * 2, k_cache=torch.zeros(4, 16, 3, 32, dtype=torch.float8_e4m3fn),
                v_cache=torch.zeros(4, 16, 3, 32, dtype=torch.float8_e4m3fn),
                cache_loc=torch.arange(tokens), k_scale=scale, v_scale=scale)


def _key(c: dict) -> tuple | None:
    return dispatch.call_key(c["k"], c["v"], c["k_cache"], c["v_cache"], c["cache_loc"], c["k_scale"],
                             c["v_scale"], 16, kernel.DEFAULT_RECIPE, None)


def _slow(c: dict) -> tuple:
    """The slow path's plan, grid, arguments and constexprs for the call c."""
    plan = make_plan(*c.values(), 16, recipe=kernel.DEFAULT_RECIPE)
    return (plan, *fused.kernel_args(plan, software=True)[:3])


def _expected(c: dict) -> tuple:
    """What the launcher receives when the slow path launches c (tensors as their addresses)."""
    _, grid, args, constexprs = _slow(c)
    pointers = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
    return (*grid, "stream", "function", "metadata", None, None, None, *pointers, *constexprs.values())


def _remember(c: dict) -> tuple[tuple, Recorder]:
    """Remember c's layout as the slow path does, with a Recorder as the compiled kernel."""
    plan, grid, args, constexprs = _slow(c)
    rec, key = Recorder(), _key(c)
    dispatch.remember_scales(c["k_scale"], c["v_scale"], plan)
    dispatch.remember(key, plan, rec, grid, args, constexprs,
                      fused._vectorizable_layout(fused.geometry(plan)), fp8_kv_write.arg_names)
    return key, rec


def _fast(key: tuple, c: dict) -> bool:
    return dispatch.launch_known(key, c["k"], c["v"], c["k_cache"], c["v_cache"], c["cache_loc"],
                                 c["k_scale"], c["v_scale"])


@pytest.fixture
def simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU-only machine as the fast path sees a CUDA one: device -1 current, a named stream."""
    monkeypatch.setattr(dispatch, "current_device", lambda: -1)
    monkeypatch.setattr(dispatch, "current_stream", lambda device: "stream")
    monkeypatch.setattr(dispatch, "_ENTRIES", {})
    monkeypatch.setattr(dispatch, "_FP32", {})  # float scales validated by earlier tests in this process
    monkeypatch.setattr(dispatch, "_enabled", True)


@pytest.mark.parametrize("scale", [0.5, None, "tensor"], ids=["float", "none", "tensor"])
def test_fast_path_passes_the_slow_paths_arguments(simulated, scale) -> None:
    first = _tensors(scale=torch.tensor(0.5) if scale == "tensor" else scale)
    key, rec = _remember(first)
    # Another call of the same layout, on other buffers: the launcher gets those buffers' addresses.
    second = _tensors(scale=torch.tensor(0.25) if scale == "tensor" else scale)
    assert _key(second) == key
    assert _fast(key, second)
    assert rec.calls == [_expected(second)]


def test_fast_path_declines_what_it_cannot_vouch_for(simulated) -> None:
    c = _tensors()
    key, rec = _remember(c)
    assert not _fast(key, dict(c, k_scale=0.3))  # a float value never validated
    assert not _fast(key, dict(c, v_cache=c["k_cache"]))  # the caches overlap: the slow path raises
    assert not _fast(key, dict(c, k=c["k_cache"].view(torch.bfloat16)[0, :5]))  # k inside k_cache
    # Same layout, but k two bytes off 16-byte alignment: the VEC=False variant, never compiled yet.
    shifted = torch.zeros(c["k"].numel() + 1, dtype=torch.bfloat16)[1:].view(c["k"].shape)
    assert _key(dict(c, k=shifted)) == key and not _fast(key, dict(c, k=shifted))
    assert dispatch.call_key(c["k"], c["v"], c["k_cache"], c["v_cache"], c["cache_loc"], 0.5, 0.5,
                             True, "unfused", None) is None  # page_size=True: the slow path refuses it
    assert rec.calls == []  # a declined call launches nothing: the slow path does it


def test_the_key_holds_the_cache_format(simulated) -> None:
    """An e5m2 call never takes an e4m3 entry (docs/e5m2.md): the caches' dtypes and cache_dtype are keyed,
    and the remembered launch of an e5m2 layout carries E5M2=True."""
    c = _tensors()
    u8 = dict(c, k_cache=c["k_cache"].view(torch.uint8), v_cache=c["v_cache"].view(torch.uint8))
    e5 = dict(c, k_cache=c["k_cache"].view(torch.float8_e5m2), v_cache=c["v_cache"].view(torch.float8_e5m2))
    key = lambda d, cache_dtype=None: dispatch.call_key(  # noqa: E731
        d["k"], d["v"], d["k_cache"], d["v_cache"], d["cache_loc"], d["k_scale"], d["v_scale"], 16,
        kernel.DEFAULT_RECIPE, None, cache_dtype)
    keys = [key(c), key(e5), key(u8), key(u8, "fp8_e5m2"), key(u8, torch.float8_e5m2), key(u8, "fp8_e4m3")]
    assert len(set(keys)) == len(keys), keys
    assert key(u8, 3) is None  # not a dtype or a string: the slow path raises
    plan = make_plan(*e5.values(), 16, recipe=kernel.DEFAULT_RECIPE)
    assert fused.kernel_args(plan, software=True)[2]["E5M2"] is True
    plan = make_plan(*u8.values(), 16, recipe=kernel.DEFAULT_RECIPE, cache_dtype="fp8_e5m2")
    assert fused.kernel_args(plan, software=True)[2]["E5M2"] is True
    plan = make_plan(*u8.values(), 16, recipe=kernel.DEFAULT_RECIPE)
    assert fused.kernel_args(plan, software=True)[2]["E5M2"] is False


def test_interleaved_pool_takes_the_fast_path(simulated) -> None:
    pool = torch.zeros(4, 2, 16, 3, 32, dtype=torch.float8_e4m3fn)
    c = dict(_tensors(), k_cache=pool[:, 0], v_cache=pool[:, 1])
    key, rec = _remember(c)
    assert _fast(key, c)
    assert rec.calls == [_expected(c)]


@pytest.mark.skipif(not kernel.backend.interpreted(), reason="the interpreter's behaviour (CPU tensors)")
def test_cpu_calls_remember_no_launch() -> None:
    """Under the interpreter nothing is compiled, so no layout gets a launcher (only T == 0 ones)."""
    c = _tensors()
    kernel.fused_fp8_set_kv_buffer(*c.values(), 16)
    entry = dispatch._ENTRIES.get(_key(c))
    assert entry is None or not entry.launchers


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only: the fast path launches compiled kernels")
def test_fast_path_bytes_equal_the_reference_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(fused, "make_plan", lambda *a, **kw: calls.append(1) or make_plan(*a, **kw))
    for i, scale in enumerate((0.7, 0.7, torch.tensor(0.3), None, 0.7)):
        c = {name: t.cuda() if isinstance(t, torch.Tensor) else t for name, t in _tensors(i + 1).items()}
        scale = scale.cuda() if isinstance(scale, torch.Tensor) else scale
        c = dict(c, k_scale=scale, v_scale=scale)
        ref = {name: c[name].clone() for name in ("k_cache", "v_cache")}
        kernel.naive_fp8_set_kv_buffer(c["k"], c["v"], ref["k_cache"], ref["v_cache"], c["cache_loc"],
                                       c["k_scale"], c["v_scale"], 16)
        kernel.fused_fp8_set_kv_buffer(*c.values(), 16)
        for name in ("k_cache", "v_cache"):
            c[name].view(torch.uint8).zero_()
        kernel.fused_fp8_set_kv_buffer(*c.values(), 16)  # the second call of a layout: the fast path
        for name in ("k_cache", "v_cache"):
            assert torch.equal(c[name].view(torch.uint8), ref[name].view(torch.uint8)), (i, name)
    assert len(calls) == 5, f"make_plan ran {len(calls)} times for 10 calls of 5 layouts: expected 5"


def test_importing_the_kernel_leaves_dynamo_alone_and_a_compiled_reference_still_matches():
    """make_plan stays out of dynamo's tracing (kernel.plan.not_traced) without importing torch._dynamo
    when the package is imported, which takes seconds in every process: a fresh process that imports
    the kernel has no dynamo, and the reference compiled afterwards writes the eager bytes."""
    import subprocess
    import sys
    from pathlib import Path

    code = """
import sys, torch, kernel
assert "torch._dynamo" not in sys.modules, "importing kernel imported torch._dynamo"
g = torch.Generator().manual_seed(0)
k = torch.randn(5, 2, 16, generator=g).to(torch.bfloat16)
loc = torch.tensor([0, 3, 7, -1, 9])
caches = [torch.zeros(4, 4, 2, 16, dtype=torch.uint8) for _ in range(4)]
kernel.naive_fp8_set_kv_buffer(k, k, caches[0], caches[1], loc, 0.7, 0.3, 4)
torch.compile(kernel.naive_fp8_set_kv_buffer, backend="eager")(k, k, caches[2], caches[3], loc, 0.7, 0.3, 4)
assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3]), "compiled bytes differ"
"""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
