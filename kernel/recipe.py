"""Recipes: the quantization arithmetic, named after the real implementations they model.

A recipe is small immutable data. The reference (`kernel.reference`) and the fused Triton kernel
(`kernel.fused`) both read it; neither guesses.  Every step a recipe names is an IEEE operation or a
round-to-nearest-even (RNE) step onto a named number format:

    s  = fp32(scale)                              exact for tensors, RNE for Python floats
    s  = round_to(input dtype, s)                 only if scale_dtype == "input"
    y  = x_f32 * (1 / s)   or   x_f32 / s         scale_op; both operations IEEE, in fp32
    y  = round_to(input dtype, y)                 only if intermediate == "input"
    q  = round_to(e4m3, y)                        RNE onto the e4m3 grid, then overflow:
         |q| > 448  ->  +-448 (0x7E/0xFE)         overflow == "saturate" (+-inf too)
         |q| > 448  ->  NaN (0x7F/0xFF)           overflow == "nan"      (+-inf too)
    NaN in any step -> 0x7F                       every recipe (sign dropped)

A scale of None means 1.0.

e5m2 caches (vLLM's kv_cache_dtype="fp8_e5m2"; docs/e5m2.md): the cache's number format is part of
the call (kernel.plan), not of the recipe. Every recipe applies unchanged up to the last step, which
rounds onto the e5m2 grid instead (2 mantissa bits, subnormals from 2**-16, largest finite 57344):
         |q| > 57344 -> +-57344 (0x7B/0xFB)       overflow == "saturate" (+-inf too): cvt.rn.satfinite.e5m2
         |q| > 57344 -> +-inf (0x7C/0xFC)         overflow == "nan": the non-saturating cast's rule, which on
                                                  e5m2 (a format with infinities) overflows to inf, as
                                                  torch's .to(float8_e5m2) does (CPU: docs/facts.md)
    NaN in any step -> 0x7F                       as for e4m3 (e5m2's NaN bytes are 0x7D..0x7F; 0x7F is
                                                  the one cvt.rn.satfinite.e5m2 and torch write for +NaN)
So `divide` on an e5m2 cache is vLLM's CUDA write (csrc/quantization/fp8/nvidia/quant_utils.cuh,
scaled_vec_conversion: __nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E5M2)), `single` is
Triton's (x * (1/s)).to(tl.float8e5) on sm_89+, and `unfused-nan` is the unfused torch write
`k.div_(s).to(float8_e5m2)` (torch's e5m2 cast never saturates: docs/facts.md, fact 5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ScaleOp = Literal["mul_reciprocal", "divide"]
ScaleDtype = Literal["fp32", "input"]
Intermediate = Literal["none", "input"]
Overflow = Literal["saturate", "nan"]

#: The byte every NaN becomes, in every recipe.
NAN_BYTE = 0x7F


@dataclass(frozen=True)
class Recipe:
    """One exactly specified way to quantize an input value to an fp8 byte (e4m3, or e5m2 for an e5m2 cache)."""

    name: str
    scale_op: ScaleOp
    scale_dtype: ScaleDtype
    intermediate: Intermediate
    overflow: Overflow
    models: str

    def __post_init__(self) -> None:
        for field, allowed in (
            ("scale_op", ("mul_reciprocal", "divide")),
            ("scale_dtype", ("fp32", "input")),
            ("intermediate", ("none", "input")),
            ("overflow", ("saturate", "nan")),
        ):
            if getattr(self, field) not in allowed:
                raise ValueError(f"Recipe.{field} must be one of {allowed}, got {getattr(self, field)!r}")

    @property
    def arithmetic(self) -> str:
        """The recipe's arithmetic as one line, for tables and reports."""
        scale = "fp32(in(s))" if self.scale_dtype == "input" else "fp32(s)"
        op = f"x * (1/{scale})" if self.scale_op == "mul_reciprocal" else f"x / {scale}"
        rounded = f"in({op})" if self.intermediate == "input" else op
        over = "saturate to ±448" if self.overflow == "saturate" else "NaN past ±464"
        return f"e4m3({rounded}), {over}"


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "unfused", "mul_reciprocal", "fp32", "input", "saturate",
            "the unfused server write on CUDA: k.div_(float_scale) then .to(float8_e4m3fn), "
            "on a torch whose cast saturates",
        ),
        Recipe(
            "unfused-nan", "mul_reciprocal", "fp32", "input", "nan",
            "the same unfused write on torch <= 2.11 (CUDA), whose cast gives NaN above 464",
        ),
        Recipe(
            "unfused-tensor0d", "divide", "input", "input", "saturate",
            "k.div_(scale) with a 0-d fp32 CUDA tensor: the scale is first rounded to k's dtype",
        ),
        Recipe(
            "unfused-tensor1", "divide", "fp32", "input", "saturate",
            "k.div_(scale) with a 1-element fp32 CUDA tensor, or with a float on the CPU",
        ),
        Recipe(
            "single", "mul_reciprocal", "fp32", "none", "saturate",
            "Triton's (x.to(f32) * (1/s)).to(tl.float8e4nv) on sm_89+ (cvt.rn.satfinite), "
            "TensorRT-LLM-style fused kernels",
        ),
        Recipe(
            "divide", "divide", "fp32", "none", "saturate",
            "vLLM's CUDA cache write: __nv_cvt_float_to_fp8(x / s, __NV_SATFINITE, __NV_E4M3)",
        ),
    )
}

DEFAULT_RECIPE: Recipe = RECIPES["unfused"]


def get_recipe(recipe: Recipe | str) -> Recipe:
    """Accept a Recipe or the name of one in RECIPES."""
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, str):
        if recipe in RECIPES:
            return RECIPES[recipe]
        raise ValueError(f"recipe must be one of {sorted(RECIPES)}, got {recipe!r}")
    raise TypeError(f"recipe must be a kernel.Recipe or a recipe name, got {type(recipe).__name__}")


# -- dynamic per-(token, head) scales (kernel/per_token_head.py: the steps, edge cases and layouts) ----------

PTHRule = Literal["vllm", "flashinfer"]


@dataclass(frozen=True)
class PerTokenHeadRecipe:
    """One exactly specified dynamic per-(token, head) quantization: its steps are written out in
    kernel/per_token_head.py, whose reference follows `rule`."""

    name: str
    rule: PTHRule
    models: str


PTH_RECIPES: dict[str, PerTokenHeadRecipe] = {
    r.name: r
    for r in (
        PerTokenHeadRecipe(
            "per-token-head-vllm", "vllm",
            "vLLM's fp8_per_token_head write (vllm#38378): _reshape_cache_per_token_head_kernel in "
            "vllm/v1/attention/ops/triton_quant_kv/int8_fp8_per_token_head.py: "
            "s = max(amax / 448, 1e-6), clamp(x * (1 / s), -448, 448), stored to an fp8 pointer",
        ),
        PerTokenHeadRecipe(
            "per-token-head-flashinfer", "flashinfer",
            "FlashInfer's test quantizer: s = max(amax, 1e-12) / 448, (x / s).to(float8_e4m3fn)",
        ),
    )
}
DEFAULT_PTH_RECIPE = "per-token-head-vllm"
