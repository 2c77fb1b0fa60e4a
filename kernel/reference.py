"""The specification: quantize K and V to fp8 bytes (e4m3, or e5m2 for an e5m2 cache), scatter them to slots.

Everything here is plain torch, and every rounding step is written out instead of being left to
`div_` or `.to(torch.float8_e4m3fn)` (or `float8_e5m2`), whose results depend on the device, the scale's type and the
torch version (docs/facts.md). The only operations trusted are ones IEEE defines exactly and
that torch computes the same way on every device: fp32 multiply and divide, float64 arithmetic on
exactly representable values, `torch.round` (ties to even), `torch.frexp`, and comparisons
(`torch.searchsorted` finds an exact value in a table).

So the reference gives the same bytes on CPU and CUDA, under any torch version.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from kernel.plan import CacheDtypeArg, Plan, ScaleArg, make_plan
from kernel.recipe import DEFAULT_RECIPE, NAN_BYTE, Recipe


@dataclass(frozen=True)
class Format:
    """A binary floating-point format, as far as rounding onto its grid needs it."""

    name: str
    mantissa_bits: int
    min_normal_exp: int  # the exponent of the smallest normal number; subnormals share its quantum
    max_finite: float
    overflow_byte: int = -1  # fp8 only: the byte past the range under overflow == "nan" (sign added)


BF16 = Format("bfloat16", 7, -126, (2 - 2**-7) * 2.0**127)
FP16 = Format("float16", 10, -14, 65504.0)
FNUZ_NAN_BYTE = 0x80  # e4m3fnuz's only NaN: the byte that would be -0
# e4m3fn has no infinity: past the range the non-saturating rule writes NaN (0x7F/0xFF).
E4M3 = Format("float8_e4m3fn", 3, -6, 448.0, NAN_BYTE)
# e5m2 is IEEE-like: past the range (|q| >= 61440, the tie with 65536 going to the even 65536) is
# inf, 0x7C/0xFC, which is what torch's .to(float8_e5m2) writes (docs/facts.md, fact 5).
E5M2 = Format("float8_e5m2", 2, -14, 57344.0, 0x7C)
# e4m3fnuz (ROCm MI300's e4m3, bias 8): no infinity, no -0, one NaN, 0x80. Largest finite 240 (0x7F),
# smallest normal 2**-7, subnormals M * 2**-10. Past the range (|q| >= 248, the tie with 256 going to
# the even 256) the non-saturating rule writes that NaN, as torch's .to(float8_e4m3fnuz) does (fact 6).
E4M3FNUZ = Format("float8_e4m3fnuz", 3, -7, 240.0, FNUZ_NAN_BYTE)
INPUT_FORMATS = {torch.bfloat16: BF16, torch.float16: FP16, torch.float32: None}  # None: already fp32
#: The cache's number format by kernel.plan's name for it.
CACHE_FORMATS = {"fp8_e4m3": E4M3, "fp8_e5m2": E5M2, "fp8_e4m3fnuz": E4M3FNUZ}


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2**exponent as float64, built from its bits so that it is exact on every device."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def round_to_grid(y: torch.Tensor, fmt: Format) -> torch.Tensor:
    """Round fp32 values to nearest, ties to even, onto fmt's grid with an unbounded exponent.

    Worked in float64, where every step is exact: the quantum (spacing of fmt's numbers in y's
    binade) is a power of two, y / quantum is exact, and torch.round breaks ties to even.
    ±inf and NaN pass through; the sign of zero is kept.
    """
    y64 = y.to(torch.float64)
    _, e = torch.frexp(y64.abs())  # |y| = m * 2**e with m in [0.5, 1), so floor(log2|y|) = e - 1
    binade = torch.clamp(e - 1, min=fmt.min_normal_exp)
    quantum = _pow2(binade - fmt.mantissa_bits)
    return torch.round(y64 / quantum) * quantum


def round_to_input_dtype(y: torch.Tensor, fmt: Format | None) -> torch.Tensor:
    """IEEE RNE of fp32 values to bf16/fp16, overflowing to ±inf, returned as fp32 (exact).

    This models the store of an unfused op's result in the input dtype (`__float2bfloat16_rn`,
    c10's `round_to_nearest_even`, `__float2half_rn`).
    """
    if fmt is None:
        return y
    q = round_to_grid(y, fmt)
    q = torch.where(q.abs() > fmt.max_finite, q * torch.inf, q)  # q * inf: inf of q's sign
    return q.to(torch.float32)


def fp8_magnitude(byte: int, fmt: Format) -> float:
    """The value of an fp8 byte with its sign bit clear, below fmt's first inf/NaN byte: the format's
    definition. Normal (exponent field E > 0): 2**(E + min_normal_exp - 1) * (1 + M / 2**m).
    Subnormal (E = 0): M * 2**(min_normal_exp - m). (e4m3: 2**(E-7) * (1 + M/8) and M * 2**-9.)"""
    m = fmt.mantissa_bits
    exp_field, man_field = byte >> m, byte & ((1 << m) - 1)
    if exp_field == 0:
        return man_field * 2.0 ** (fmt.min_normal_exp - m)
    return 2.0 ** (exp_field + fmt.min_normal_exp - 1) * (1 + man_field / 2**m)


def e4m3_magnitude(byte: int) -> float:
    """The value of an e4m3fn byte with its sign bit clear, 0x00..0x7E."""
    return fp8_magnitude(byte, E4M3)


@functools.cache  # an int on the host: nothing a kernel can reach
def _finite_bytes(fmt: Format) -> int:
    """How many bytes, from 0x00 up, hold fmt's finite magnitudes: 127 for e4m3 (0x00..0x7E), 124 for e5m2."""
    count = 1
    while fp8_magnitude(count - 1, fmt) < fmt.max_finite:
        count += 1
    return count


def _magnitudes(device: torch.device, fmt: Format = E4M3) -> torch.Tensor:
    """fmt's finite magnitudes by byte, ascending up to max_finite (float64, exact), as fp8_magnitude defines
    them, built on the device for each call from the bytes themselves. Not cached: a kernel under test that
    writes past its buffers can land on any live device memory, and a corrupted table would turn every
    later expected byte of the process wrong (seen on the H200: a write past V's cache, then "expected
    0x08" for an input of 0.0). (conformance/diagnosis reads e4m3's.)"""
    m = fmt.mantissa_bits
    byte = torch.arange(_finite_bytes(fmt), device=device, dtype=torch.int64)
    exp_field, man_field = byte >> m, (byte & ((1 << m) - 1)).to(torch.float64)
    normal = _pow2(exp_field + (fmt.min_normal_exp - 1)) * (1 + man_field / 2**m)  # exact in float64
    subnormal = man_field * 2.0 ** (fmt.min_normal_exp - m)
    return torch.where(exp_field == 0, subnormal, normal)


def encode_fp8(y: torch.Tensor, recipe: Recipe, fmt: Format = E4M3) -> torch.Tensor:
    """fp32 values -> fp8 bytes of fmt (E4M3, E5M2 or E4M3FNUZ): RNE onto fmt's grid, then the recipe's overflow rule.

    The byte of a magnitude on the grid is the one that decodes to it: its position in the table of
    fmt's magnitudes, which are ascending in their bytes.
    """
    q = round_to_grid(y, fmt)
    nan, mag = torch.isnan(q), q.abs()
    overflow = mag > fmt.max_finite  # includes ±inf
    # Saturate (cvt.rn.satfinite, torch >= 2.12's e4m3 cast): past the range is ±max_finite. The "nan"
    # rule replaces these bytes below; NaN gets a placeholder magnitude so that the lookup stays defined.
    mag = mag.clamp(max=fmt.max_finite).masked_fill(nan, 0.0)
    byte = torch.searchsorted(_magnitudes(q.device, fmt), mag)  # mag is exactly a table entry
    if recipe.overflow == "nan":  # the non-saturating cast: e4m3 NaN (c10's fp8e4m3fn_from_fp32_value), e5m2 inf
        byte = byte.masked_fill(overflow, fmt.overflow_byte)
    if fmt.overflow_byte == FNUZ_NAN_BYTE:
        # fnuz has no -0 (0x80 is its NaN): zero's sign is dropped, -0 and values rounding to -0 give 0x00.
        byte = byte | (torch.signbit(q) & (mag != 0)) * 0x80  # the sign bit, but not for zero
        byte = byte.masked_fill(nan, FNUZ_NAN_BYTE)  # every NaN is fnuz's one NaN
    else:
        byte = byte | torch.signbit(q) * 0x80  # the sign bit
        byte = byte.masked_fill(nan, NAN_BYTE)  # every recipe drops a NaN's sign, in both formats
    return byte.to(torch.uint8)


def encode_e4m3(y: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """fp32 values -> e4m3fn bytes: encode_fp8 onto e4m3."""
    return encode_fp8(y, recipe, E4M3)


def scale_to_fp32(scale: ScaleArg, device: torch.device) -> torch.Tensor:
    """The scale as a 0-d fp32 tensor: a float was rounded to fp32 in make_plan; tensors are fp32."""
    if scale.tensor is not None:
        return scale.tensor.reshape(())
    # A float64 fill then a cast (RNE, and inf past fp32's range, as torch.tensor(value, float32) does):
    # no host-to-device copy, and no error where a fill in fp32 would raise on overflow (1/s of a tiny s).
    return torch.full((), scale.value, dtype=torch.float64, device=device).to(torch.float32)


def head_scales(scale: ScaleArg, heads: int, device: torch.device) -> torch.Tensor:
    """One fp32 scale per head, [H]: a per-head tensor as given (vLLM indexes it scale[head]: vllm#30141);
    any other scale, the same value for every head."""
    if scale.kind == "per-head":
        return scale.tensor.reshape(heads)
    return scale_to_fp32(scale, device).expand(heads)


def scaled(x: torch.Tensor, scale: ScaleArg | torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """The fp32 values the recipe hands to the e4m3 rounding: scale, then the intermediate rounding.

    `scale` is a ScaleArg, or fp32 scales as a tensor that broadcasts against x (one per batch).
    """
    in_fmt = INPUT_FORMATS[x.dtype]
    x32 = x.to(torch.float32)  # exact widening
    s32 = scale if isinstance(scale, torch.Tensor) else scale_to_fp32(scale, x.device)
    if recipe.scale_dtype == "input":  # a 0-d tensor takes part in div_ in the input dtype
        s32 = round_to_input_dtype(s32, in_fmt)
    if recipe.scale_op == "mul_reciprocal":  # ATen's CUDA div by a scalar: x * (1.0f / s)
        y = x32 * (torch.ones_like(s32) / s32)
    else:  # IEEE fp32 division
        y = x32 / s32
    if recipe.intermediate == "input":  # the unfused op stores its quotient in the input dtype
        y = round_to_input_dtype(y, in_fmt)
    return y


def quantize(x: torch.Tensor, scale: ScaleArg | torch.Tensor, recipe: Recipe,
             cache_format: str = "fp8_e4m3") -> torch.Tensor:
    """The definition: input values -> fp8 bytes (the cache's format) under `recipe`, step by step."""
    return encode_fp8(scaled(x, scale, recipe), recipe, CACHE_FORMATS[cache_format])


def write_slots(plan: Plan) -> None:
    """Quantize each written token's K and V and store the bytes at slot cache_loc[t], which is page
    slot // page_size, offset slot % page_size. Negative or out-of-range slots write nothing.

    K and V go through `quantize` as one batch of two, each with its own scales (one per head): the
    same steps on the same values, in half the device launches.
    """
    loc = plan.cache_loc.to(torch.int64)
    tokens = ((loc >= 0) & (loc < plan.num_slots)).nonzero().flatten()
    slots = loc[tokens]
    index = (slots,) if plan.k_cache.dim() == 3 else (slots // plan.page_size, slots % plan.page_size)
    scales = torch.stack([head_scales(s, plan.num_heads, plan.k.device) for s in (plan.k_scale, plan.v_scale)])
    data = quantize(torch.stack((plan.k, plan.v))[:, tokens], scales.reshape(2, 1, plan.num_heads, 1), plan.recipe,
                    plan.cache_format)
    for cache, bytes_ in ((plan.k_cache, data[0]), (plan.v_cache, data[1])):
        # A view (none needed for uint8): writes land in the caller's storage.
        cache_bytes = cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)
        cache_bytes[index] = bytes_


def naive_fp8_set_kv_buffer(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_loc: torch.Tensor,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
    page_size: int = 16,
    use_triton: bool = False,
    *,
    recipe: Recipe | str = DEFAULT_RECIPE,
    checked: bool = False,
    cache_dtype: CacheDtypeArg = None,
    per_token_head: bool | str = False,
    k_scale_cache: torch.Tensor | None = None,
    v_scale_cache: torch.Tensor | None = None,
) -> None:
    """The reference KV write. Same signature as the fused kernel; `use_triton` is ignored."""
    if per_token_head is not False or k_scale_cache is not None or v_scale_cache is not None:
        from kernel.per_token_head import naive_per_token_head  # imports this module: imported late
        return naive_per_token_head(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
                                    per_token_head=per_token_head, recipe=recipe, checked=checked,
                                    k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache,
                                    cache_dtype=cache_dtype)
    plan = make_plan(k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, page_size,
                     recipe=recipe, checked=checked, cache_dtype=cache_dtype)
    if plan.num_tokens == 0:
        return
    write_slots(plan)
