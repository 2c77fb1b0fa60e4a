"""Fidelity of the per-token-head recipes: the reference (kernel.per_token_head.quantize_heads) equals the
plain torch op sequence each recipe models, bytes and stored scales, on the CPU.

vLLM's kernel (vllm/v1/attention/ops/triton_quant_kv/int8_fp8_per_token_head.py) does, per head:
amax, / 448, max with 1e-6, reciprocal, multiply, clamp to ±448, store to an fp8 pointer (the cast).
FlashInfer's test quantizer: amax, clamp(min=1e-12), / 448, divide, `.to(float8_e4m3fn)`.
Torch's CPU ops divide truly and its CPU cast rounds to nearest-even and saturates (docs/facts.md), so
the sequences are exact there. They are well defined only for finite heads: a NaN or an inf makes
torch's NaN, whose sign (and so its byte, 0x7F or 0xFF) the spec fixes and torch does not
(docs/per-token-head.md), so inputs here are finite, with all-zero, subnormal and small heads drawn.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kernel.per_token_head import PTH_RECIPES, quantize_heads, scale_bits
from strategies.cases import cases
from strategies.per_token_head import build_pth, pth_cases

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
D = 64


def torch_vllm(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's per-head steps as plain torch ops: (e4m3 bytes, fp32 scales)."""
    x32 = x.to(torch.float32)
    amax = x32.abs().amax(-1)
    s = torch.maximum(amax / 448.0, torch.tensor(1e-6, dtype=torch.float32))
    q = (x32 * (1.0 / s)[..., None]).clamp(-448.0, 448.0)
    return q.to(torch.float8_e4m3fn).view(torch.uint8), s


def torch_flashinfer(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's test quantizer as plain torch ops: (e4m3 bytes, fp32 scales)."""
    x32 = x.to(torch.float32)
    s = x32.abs().amax(-1).clamp(min=1e-12) / 448.0
    return (x32 / s[..., None]).to(torch.float8_e4m3fn).view(torch.uint8), s


TORCH_SEQUENCES = {"per-token-head-vllm": torch_vllm, "per-token-head-flashinfer": torch_flashinfer}


def assert_same(x: torch.Tensor, recipe: str) -> None:
    data, s = quantize_heads(x, PTH_RECIPES[recipe])
    want_data, want_s = TORCH_SEQUENCES[recipe](x)
    bad_s = (scale_bits(s) != scale_bits(want_s)).nonzero()
    assert not bad_s.numel(), (f"{recipe}: {bad_s.shape[0]} scales differ; first at {bad_s[0].tolist()}: "
                               f"reference {s[tuple(bad_s[0])].item()!r}, torch {want_s[tuple(bad_s[0])].item()!r}")
    bad = (data != want_data).nonzero()
    assert not bad.numel(), (f"{recipe}: {bad.shape[0]} of {data.numel()} bytes differ; first at {bad[0].tolist()}: "
                             f"x = {x[tuple(bad[0])].item()!r}, reference 0x{int(data[tuple(bad[0])]):02X}, "
                             f"torch 0x{int(want_data[tuple(bad[0])]):02X}")


def finite_patterns_as_heads(dtype: torch.dtype) -> torch.Tensor:
    """Every finite 16-bit pattern of `dtype`, spread over [heads, D] so that each head mixes magnitudes
    (a fixed odd-multiplier permutation, no RNG); the last partial head left out."""
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    x = x[torch.isfinite(x.to(torch.float32))]
    n = x.numel() - x.numel() % D
    order = (torch.arange(n, dtype=torch.int64) * 40503) % n  # 40503 is prime, coprime with n
    return x[order].reshape(-1, D)


@pytest.mark.parametrize("recipe", list(PTH_RECIPES))
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_finite_pattern_equals_the_torch_sequence(dtype: str, recipe: str):
    assert_same(finite_patterns_as_heads(DTYPES[dtype]), recipe)


@given(data=st.data())
def test_drawn_heads_equal_the_torch_sequence(data):
    """Heads from the suite's cases (seeded values spanning e4m3's range, fp32 inputs too), with
    all-zero, subnormal, small and tiny heads (where the floors act); NaN and inf left out (see the
    module docstring)."""
    base = cases(size="small", scale_kinds=("none",), recipes=("single",), max_overrides=0)
    pc = data.draw(pth_cases(base, kinds=("zero", "subnormal", "small", "tiny")), label="pth_case")
    b = build_pth(pc, "cpu").built
    for x in (b.k, b.v):
        x3 = x if x.dim() == 3 else x.unflatten(1, (pc.case.num_heads, -1))
        assert_same(x3, pc.mode)
