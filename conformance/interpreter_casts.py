"""Triton's interpreter, made to cast floats down as the GPU does, for the implementation under test.

Under `TRITON_INTERPRET=1` (the CPU), Triton 3.9's interpreter converts fp32, fp16 and bf16 to e4m3 and e5m2, and
fp32 to bf16, with bit operations that round ties away from zero, round subnormal results twice, and neither
saturate nor keep NaN: fp32 464 becomes 0x7F (NaN), inf 0x78, NaN 0x7C (docs/facts.md, fact 4;
triton-lang/triton#8322, open fixes #9808 and #11897); and its bf16 -> fp32 upcast flushes bf16 subnormals to zero.
A Triton kernel that casts with `.to(tl.float8e4nv)`, or lets `tl.store` cast into an fp8 cache, would be blamed on
the CPU for bytes no GPU writes. So, for every implementation loaded to be tested (`conformance.impls.from_spec`),
those casts are the compiled kernel's: round to nearest even, finite overflow and ±inf saturated to the largest
finite value (PTX `cvt.rn.satfinite`), NaN the format's canonical 0x7F; fp32 -> bf16 rounded to nearest even
(`cvt.rn.bf16.f32`), NaN 0x7FFF; and bf16 -> fp32 exact, subnormals kept. Round-toward-zero casts, other upcasts,
fnuz and other formats stay the interpreter's. Our own kernel does not depend on this: under the interpreter it
encodes in software (kernel/triton_kernel.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from kernel.backend import interpreted
from kernel.recipe import get_recipe
from kernel.reference import E4M3, E5M2, encode_fp8

#: triton dtype name -> the reference's format; the saturating rule is the satfinite cast's (recipe `single`)
_FP8 = {"fp8e4nv": E4M3, "fp8e5": E5M2}
_SATFINITE = get_recipe("single")
_SOURCES = {"fp32": np.uint32, "fp16": np.uint16, "bf16": np.uint16}
_original = None


def _as_float32(data: np.ndarray, source: str) -> torch.Tensor:
    """The interpreter's fp32/fp16/bf16 array (bf16 held as uint16) as exact fp32 values."""
    bits = np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=_SOURCES[source])
    if source == "fp32":
        return torch.from_numpy(bits.view(np.float32).copy())
    if source == "fp16":
        return torch.from_numpy(bits.view(np.float16).astype(np.float32))
    return torch.from_numpy((bits.astype(np.uint32) << 16).view(np.float32))


def hardware_downcast(data: np.ndarray, source: str, target: str) -> np.ndarray:
    """The compiled kernel's cast of `data` (a `source` array as the interpreter holds it) to `target`, as
    unsigned bits of the target's width."""
    x = _as_float32(data, source)
    if target == "bf16":
        out = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).copy()
        out[np.isnan(x.numpy())] = 0x7FFF
    else:
        out = encode_fp8(x, _SATFINITE, _FP8[target]).numpy()
    return out.reshape(np.shape(data))


def _faithful(original):
    from triton._C.libtriton import ir

    def convert(input, input_dtype, output_dtype, rounding_mode):  # noqa: A002 (the interpreter's names)
        source, target = input_dtype.name, output_dtype.name
        if source == "bf16" and target == "fp32":  # exact on a GPU; the interpreter flushes subnormals to zero
            return _as_float32(input, source).numpy().view(np.uint32).reshape(np.shape(input))
        downcast = input_dtype.primitive_bitwidth > output_dtype.primitive_bitwidth
        if (downcast and source in _SOURCES and (target in _FP8 or target == "bf16")
                and rounding_mode in (None, ir.ROUNDING_MODE.RTNE)):
            return hardware_downcast(input, source, target)
        return original(input, input_dtype, output_dtype, rounding_mode)
    convert.kvfp8_faithful = True
    return convert


def install() -> bool:
    """Give the interpreter the compiled kernel's downcasts (once; nothing when Triton is compiled). True when
    they are in place."""
    global _original
    if not interpreted():
        return False
    from triton.runtime import interpreter
    if not getattr(interpreter._convert_float, "kvfp8_faithful", False):
        _original = interpreter._convert_float
        interpreter._convert_float = _faithful(_original)
    return True


@contextlib.contextmanager
def interpreter_as_shipped() -> Iterator[None]:
    """The interpreter's own casts inside (tools.facts measures them), whatever install() did."""
    from triton.runtime import interpreter
    current = interpreter._convert_float
    if _original is not None:
        interpreter._convert_float = _original
    try:
        yield
    finally:
        interpreter._convert_float = current
