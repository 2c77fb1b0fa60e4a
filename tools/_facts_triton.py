"""Triton casts for tools.facts: each kernel stores one cast of fp32 values, nothing else.

Imported by tools.facts only after `kernel` (which picks the interpreter before triton loads).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernel.triton_kernel import fma_probe as _fma_probe

BLOCK = 2**14


@triton.jit
def _cast_kernel(x_ptr, out_ptr, n, KIND: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if KIND == 0:
        tl.store(out_ptr + offs, x.to(tl.float8e4nv).to(tl.uint8, bitcast=True), mask=mask)
    elif KIND == 1:
        tl.store(out_ptr + offs, x.to(tl.bfloat16).to(tl.float32), mask=mask)
    else:
        tl.store(out_ptr + offs, x.to(tl.float16).to(tl.float32), mask=mask)


def _run(x: torch.Tensor, kind: int, dtype: torch.dtype) -> torch.Tensor:
    x = x.to(torch.float32).contiguous()
    out = torch.empty(x.shape, dtype=dtype, device=x.device)
    _cast_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, out, x.numel(), KIND=kind, BLOCK=BLOCK)
    return out


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> e4m3 bytes (uint8) through Triton's `.to(tl.float8e4nv)`."""
    return _run(x, 0, torch.uint8)


def to_bf16(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 through Triton's `.to(tl.bfloat16)`, widened back to fp32 (exact)."""
    return _run(x, 1, torch.float32)


def to_fp16(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> fp16 through Triton's `.to(tl.float16)`, widened back to fp32 (exact)."""
    return _run(x, 2, torch.float32)


def fma_probe() -> float:
    """tl.fma(1 + 2**-12, 1 + 2**-12, -1) as Triton computes it here."""
    out = torch.zeros(1, dtype=torch.float32)
    _fma_probe[(1,)](out)
    return out.item()
