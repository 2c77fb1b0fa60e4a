"""Exact floating-point helpers in pure Python, for draw-time computations (no torch, no GPU).

Every function here is deterministic IEEE arithmetic: a Python float is a double, and rounding a
double to a narrower format is done on its exact value with `round` (ties to even), the way the
reference rounds. fp32 arithmetic is emulated by one double operation then one rounding to fp32,
which is exact for +, *, / of fp32 operands (double has more than 2 * 24 + 2 bits).
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass


@dataclass(frozen=True)
class Fmt:
    """A binary format: mantissa bits, the exponent of its smallest normal, largest finite, width."""

    name: str
    mantissa_bits: int
    min_normal_exp: int
    max_finite: float
    bits: int


FP32 = Fmt("float32", 23, -126, struct.unpack("<f", b"\xff\xff\x7f\x7f")[0], 32)
FP16 = Fmt("float16", 10, -14, 65504.0, 16)
BF16 = Fmt("bfloat16", 7, -126, (2 - 2**-7) * 2.0**127, 16)
E4M3_MAX = 448.0
FORMATS = {"float32": FP32, "float16": FP16, "bfloat16": BF16}


def round_to(x: float, fmt: Fmt) -> float:
    """x rounded to nearest, ties to even, onto fmt (overflow to ±inf; NaN and ±0 pass through)."""
    if math.isnan(x) or math.isinf(x) or x == 0.0:
        return x
    _, e = math.frexp(abs(x))  # |x| = m * 2**e, m in [0.5, 1)
    quantum = math.ldexp(1.0, max(e - 1, fmt.min_normal_exp) - fmt.mantissa_bits)
    q = round(x / quantum) * quantum  # x / quantum is exact (a power-of-two scaling)
    if abs(q) > fmt.max_finite:
        return math.copysign(math.inf, x)
    return q


def f32(x: float) -> float:
    return round_to(x, FP32)


def to_bits(x: float, dtype: str) -> int:
    """The bit pattern of x, which must already be exactly representable in dtype (NaN: quiet +NaN)."""
    if dtype == "float32":
        return struct.unpack("<I", struct.pack("<f", x))[0]
    if dtype == "float16":
        return struct.unpack("<H", struct.pack("<e", x))[0]
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16  # bf16 is the top half of fp32


def from_bits(bits: int, dtype: str) -> float:
    """The value of a bit pattern of dtype."""
    if dtype == "float32":
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    if dtype == "float16":
        return struct.unpack("<e", struct.pack("<H", bits))[0]
    return struct.unpack("<f", struct.pack("<I", bits << 16))[0]


def ieee_div(a: float, b: float) -> float:
    """IEEE a / b on doubles, with the infinities and NaNs Python's `/` raises for."""
    if b == 0.0:
        if a == 0.0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def e5m2_value(byte: int) -> float:
    """The value of an e5m2 byte (0x7C/0xFC are ±inf, 0x7D..0x7F and 0xFD..0xFF NaN)."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 2) & 0x1F, byte & 3
    if exp == 0x1F:
        return math.nan if man else sign * math.inf
    if exp == 0:
        return sign * man * 2.0**-16
    return sign * (1 + man / 4) * 2.0 ** (exp - 15)


def fnuz_value(byte: int) -> float:
    """The value of an e4m3fnuz byte (0x80 is its one NaN; no -0, no infinity; bias 8)."""
    if byte == 0x80:
        return math.nan
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 7
    if exp == 0:
        return sign * man * 2.0**-10
    return sign * (1 + man / 8) * 2.0 ** (exp - 8)


def e4m3_value(byte: int) -> float:
    """The value of an e4m3fn byte (0x7F/0xFF are NaN)."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 7
    if exp == 0xF and man == 7:
        return math.nan
    if exp == 0:
        return sign * man * 2.0**-9
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


# -- ties: fp32 values exactly halfway between two adjacent values of a narrower format ----------
def quantum(x: float, fmt: Fmt) -> float:
    """The spacing of fmt's values in |x|'s binade (subnormals share the smallest normal binade's)."""
    _, e = math.frexp(abs(x))
    return math.ldexp(1.0, max(e - 1, fmt.min_normal_exp) - fmt.mantissa_bits)


def is_tie(x: float, fmt: Fmt) -> bool:
    """x lies exactly halfway between two adjacent values of fmt, so RNE's tie rule decides its rounding.

    Includes the tie between 0 and fmt's smallest subnormal, and the one between its largest finite
    value and the next step, which RNE rounds to inf (both neighbours' "last bit" decides there too).
    """
    if not math.isfinite(x) or x == 0.0:
        return False
    half = quantum(x, fmt) / 2
    return (abs(x) / half) % 2 == 1 and abs(x) <= fmt.max_finite + half  # x / half is exact


def tie_above(bits: int, dtype: str) -> float:
    """The fp32 value exactly halfway between the positive dtype values with `bits` and `bits + 1`
    (bits + 1 may be inf's pattern: then the tie sits one half-step above the largest finite value)."""
    fmt = FORMATS[dtype]
    lower = from_bits(bits, dtype)
    mid = lower + quantum(lower if lower else math.ldexp(1.0, fmt.min_normal_exp), fmt) / 2
    if f32(mid) != mid or not is_tie(mid, fmt):
        raise ValueError(f"no fp32 tie above {dtype} bits 0x{bits:X}")
    return mid


def tie_lower_bits(x: float, dtype: str) -> int:
    """The bits of the dtype value just below |x|, toward zero: a tie's lower neighbour (its parity is
    what RNE looks at: even rounds the tie down, odd up)."""
    fmt = FORMATS[dtype]
    q = quantum(x, fmt)
    return to_bits(math.floor(abs(x) / q) * q, dtype)


def fp32_step(x: float, k: int) -> float:
    """The fp32 value k steps (ulps) from the finite fp32 x, upward for k > 0 (x >= 0)."""
    return from_bits(to_bits(x, "float32") + k, "float32")
