"""Which backend the Triton kernel runs on, decided once, before triton is imported.

CUDA present: the compiled kernel. No CUDA: Triton's interpreter (TRITON_INTERPRET=1), which runs
the same kernel source on CPU tensors in numpy. The interpreter must be chosen before the first
`import triton`, so `kernel/__init__.py` imports this module first.
"""

from __future__ import annotations

import functools
import os
import sys

import torch

ENCODER_ENV = "KVFP8_ENCODER"  # "hardware" | "software": force the e4m3 encoder of the fused kernel

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def interpreted() -> bool:
    """True when Triton runs kernels in its interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def hardware_cast_available(device: torch.device) -> bool:
    """The native fp32 -> e4m3 cast exists on compiled CUDA at compute capability 8.9 and above."""
    return (not interpreted() and device.type == "cuda"
            and torch.cuda.get_device_capability(device) >= (8, 9))


def resolve_encoder(encoder: str | None, device: torch.device) -> str:
    """'hardware' or 'software': the explicit choice, else $KVFP8_ENCODER, else the best available."""
    choice = encoder if encoder is not None else os.environ.get(ENCODER_ENV) or None
    if choice is None:
        return "hardware" if hardware_cast_available(device) else "software"
    if choice not in ("hardware", "software"):
        raise ValueError(f"encoder must be 'hardware' or 'software' (or ${ENCODER_ENV}), got {choice!r}")
    if choice == "hardware" and not hardware_cast_available(device):
        raise ValueError("encoder='hardware' needs compiled CUDA on sm_89 or newer; "
                         "use encoder='software' here")
    return choice


@functools.cache
def fma_is_exact() -> bool:
    """True when Triton's tl.fma rounds once here: always when compiled; under the interpreter only
    where it computes fp32 FMAs exactly (triton 3.9 does; 3.6 computes x * y + z, two roundings).
    Measured once per process with a one-element probe kernel, not inferred from a version."""
    if not interpreted():
        return True
    from kernel.triton_kernel import fma_probe
    out = torch.zeros(1, dtype=torch.float32)
    fma_probe[(1,)](out)
    return out.item() == 2.0**-11 + 2.0**-24


def describe() -> str:
    """One line naming the backend, for test headers and repro reports."""
    if interpreted():
        return "triton interpreter (TRITON_INTERPRET=1), software encoder"
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        return f"compiled CUDA on {name} (sm_{''.join(map(str, torch.cuda.get_device_capability()))})"
    return "no CUDA and no interpreter"
