"""conformance/interpreter_casts.py: a tested Triton kernel's float downcasts, under the interpreter, are the GPU's
(round to nearest even, satfinite, NaN 0x7F), so that a CPU report blames no kernel for the interpreter's casts."""

from __future__ import annotations

import pytest
import torch

from conformance import interpreter_casts
from kernel.backend import interpreted
from kernel.recipe import get_recipe
from kernel.reference import E4M3, E5M2, encode_fp8

pytestmark = pytest.mark.skipif(not interpreted(), reason="the interpreter's casts: Triton is compiled here (CUDA), "
                                                         "so there is no interpreter cast to replace")


def _patterns(dtype: torch.dtype) -> torch.Tensor:
    """Every 16-bit pattern of dtype, and 2**16 hashed fp32 values, as fp32."""
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype).float()
    hashed = (torch.arange(65536, dtype=torch.int64) * 0x9E3779B1 % 2**32).to(torch.int64)
    return torch.cat([bits, (hashed - (hashed >= 2**31) * 2**32).to(torch.int32).view(torch.float32)])


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def cast(x_ptr, y_ptr, n, BLOCK: tl.constexpr, OUT: tl.constexpr):
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + o, tl.load(x_ptr + o, mask=o < n).to(OUT), mask=o < n)

    @triton.jit
    def store(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # tl.store casts into the fp8 pointer's type
        o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + o, tl.load(x_ptr + o, mask=o < n), mask=o < n)
    return cast, store


@pytest.mark.parametrize("source", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("target", "fmt"), [(torch.float8_e4m3fn, E4M3), (torch.float8_e5m2, E5M2)])
def test_fp8_casts_of_a_tested_kernel_are_round_to_nearest_even_and_satfinite(source, target, fmt):
    import triton.language as tl
    assert interpreter_casts.install()
    cast, store = _kernels()
    x = _patterns(torch.bfloat16 if source == torch.float32 else source).to(source)
    expected = encode_fp8(x.float(), get_recipe("single"), fmt)
    out = {torch.float8_e4m3fn: tl.float8e4nv, torch.float8_e5m2: tl.float8e5}[target]
    for run in (lambda y: cast[(x.numel() // 4096,)](x, y, x.numel(), BLOCK=4096, OUT=out),
                lambda y: store[(x.numel() // 4096,)](x, y, x.numel(), BLOCK=4096)):
        y = torch.zeros(x.numel(), dtype=target)
        run(y)
        wrong = (y.view(torch.uint8) != expected).nonzero().flatten()
        assert wrong.numel() == 0, [(x[i].item(), hex(y.view(torch.uint8)[i].item()), hex(expected[i].item()))
                                    for i in wrong[:5].tolist()]


def test_bf16_casts_of_a_tested_kernel_are_round_to_nearest_even():
    import triton.language as tl
    assert interpreter_casts.install()
    cast, _ = _kernels()
    x = _patterns(torch.bfloat16)[65536:]  # the hashed fp32 values: bf16 patterns are exact already
    y = torch.zeros(x.numel(), dtype=torch.bfloat16)
    cast[(x.numel() // 4096,)](x, y, x.numel(), BLOCK=4096, OUT=tl.bfloat16)
    expected = x.to(torch.bfloat16).view(torch.int16)
    expected = torch.where(x.isnan(), torch.tensor(0x7FFF, dtype=torch.int16), expected)
    assert torch.equal(y.view(torch.int16), expected)


def test_facts_measure_the_interpreter_as_shipped():
    """tools.facts measures Triton's own casts (fact 4): inside interpreter_as_shipped the replacement is off."""
    from triton.runtime import interpreter
    assert interpreter_casts.install()
    assert getattr(interpreter._convert_float, "kvfp8_faithful", False)
    with interpreter_casts.interpreter_as_shipped():
        assert not getattr(interpreter._convert_float, "kvfp8_faithful", False)
    assert getattr(interpreter._convert_float, "kvfp8_faithful", False)


def test_bf16_subnormals_reach_fp32_whole():
    """The interpreter's bf16 -> fp32 upcast flushes bf16 subnormals to zero; a GPU's shift keeps them, so that a
    subnormal input divided by a tiny scale saturates instead of giving 0 (vLLM's own Triton write on the CPU)."""
    assert interpreter_casts.install()
    _, store = _kernels()
    x = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    y = torch.zeros(x.numel(), dtype=torch.float32)
    store[(x.numel() // 4096,)](x, y, x.numel(), BLOCK=4096)
    same = (y == x.float()) | (y.isnan() & x.isnan())
    assert bool(same.all()), x[~same][:5]
