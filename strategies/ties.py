"""Ties: inputs whose scaled value sits exactly on a rounding tie, at every element of K and V.

Random data almost never lands exactly halfway between two representable values, yet that is
where round-to-nearest-even, x * (1/s) versus x / s, and the order of the two roundings differ.
Three families, each as Overrides covering every [T, H, D] position:

- e4m3 ties (`e4m3_tie_overrides`): fp32 inputs x whose recipe-scaled value is exactly the midpoint
  of two adjacent e4m3 values. fp32 has enough inputs near t * s that one hits t exactly for most
  non-dyadic scales; x * (1/s) and x / s of the same x then often fall on different sides.
- input-dtype ties (`input_tie_overrides`): bf16/fp16 inputs whose fp32 scaled value is exactly
  halfway between two bf16/fp16 values *and* whose two neighbours have different e4m3 bytes, so
  the intermediate rounding's tie rule decides the byte ("decisive"). Found by enumerating every
  finite positive input of the dtype at a scale (vectorized in torch, then re-checked in pure
  Python); only scales that have such inputs are drawn (`TIE_SCALES`, filtered per recipe).
- scale ties (`scale_tie_overrides`): for recipes that round the scale to the input dtype, the scale
  is itself a bf16/fp16 tie or one fp32 ulp from one (strategies.scales.scale_tie_values), and every
  input is one whose byte differs between the scale's two possible roundings, so the scale's
  rounding, and its tie rule, decides every byte. Found by enumerating every input of the dtype
  through the reference at both roundings.
"""

from __future__ import annotations

import dataclasses
import math
from functools import lru_cache

import torch
from hypothesis import event
from hypothesis import strategies as st

from kernel.plan import ScaleArg
from kernel.recipe import RECIPES, Recipe, get_recipe
from kernel.reference import encode_e4m3, quantize
from strategies._cache import ints, sampled
from strategies.case import Override, Scale
from strategies.fp import FORMATS, Fmt, e4m3_value, f32, from_bits, ieee_div, quantum, round_to, to_bits
from strategies.values import scaled_value

E4M3 = Fmt("e4m3", 3, -6, 448.0, 8)  # rounding onto the e4m3 grid (overflow is the recipe's business)
_INF = {"float16": 0x7C00, "bfloat16": 0x7F80}
_INT = {"float16": torch.int16, "bfloat16": torch.int16}
_TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}

#: Non-dyadic fp32 scales to search for input-dtype ties (2/3 has decisive bf16 ties under unfused).
TIE_SCALES = tuple(f32(v) for v in (2 / 3, 1 / 3, 4 / 3, 5 / 3, 0.3, 0.7, 0.6, 0.75, 1.5, 3.0, 5.0, 7.0,
                                     1 / 7, 0.9, 1.1, 1.3, 2.5, 0.45, 0.15, 0.2, 1 / 6, 6.0, 10.0, 0.1))


def pre_intermediate(x: float, s: float, recipe: Recipe, fmt: Fmt) -> float:
    """The recipe's fp32 scaled value of x, before any rounding to the input dtype (s is fp32)."""
    if recipe.scale_dtype == "input":
        s = round_to(s, fmt)
    if recipe.scale_op == "mul_reciprocal":
        return f32(x * f32(ieee_div(1.0, s)))
    return f32(ieee_div(x, s))


def _quantum(y: float, fmt: Fmt) -> float:
    _, e = math.frexp(abs(y))
    return math.ldexp(1.0, max(e - 1, fmt.min_normal_exp) - fmt.mantissa_bits)


@lru_cache(maxsize=256)
def decisive_input_ties(recipe_name: str, dtype: str, scale: float) -> tuple[int, ...]:
    """Bits of every positive finite x of dtype whose scaled value is an input-dtype tie that decides
    the e4m3 byte (the two dtype neighbours of the tie have different e4m3 values)."""
    recipe, fmt = get_recipe(recipe_name), FORMATS[dtype]
    s = round_to(scale, fmt) if recipe.scale_dtype == "input" else scale
    bits = torch.arange(1, _INF[dtype], dtype=torch.int32)
    xs = bits.to(_INT[dtype]).view(_TORCH[dtype]).float()
    if recipe.scale_op == "mul_reciprocal":
        y = xs * torch.tensor(f32(ieee_div(1.0, s)), dtype=torch.float32)
    else:
        y = xs / torch.tensor(s, dtype=torch.float32)
    yd = y.double()
    _, e = torch.frexp(yd)
    quantum = torch.pow(2.0, (e - 1).clamp(min=fmt.min_normal_exp).double() - fmt.mantissa_bits)
    q = yd / quantum
    tie = torch.isfinite(yd) & (yd != 0) & (q - torch.floor(q) == 0.5) & (yd.abs() < fmt.max_finite)
    # The two neighbours' bytes under the recipe's own overflow rule (the reference's encoder: near
    # 448 a saturating recipe gives both 0x7E), then the exact pure-Python check of the tie itself.
    lo, hi = (yd - quantum / 2).float(), (yd + quantum / 2).float()
    tie &= encode_e4m3(lo, recipe) != encode_e4m3(hi, recipe)
    found = []
    for b in bits[tie].tolist():
        y1 = pre_intermediate(from_bits(b, dtype), scale, recipe, fmt)
        half = _quantum(y1, fmt) / 2
        if (y1 / half) % 2 == 1 and round_to(y1 - half, E4M3) != round_to(y1 + half, E4M3):
            found.append(b)
    return tuple(found)


@lru_cache(maxsize=32)
def tie_scales(recipe_name: str, dtype: str) -> tuple[float, ...]:
    """The TIE_SCALES at which decisive input-dtype ties exist for this recipe and dtype."""
    return tuple(s for s in TIE_SCALES if decisive_input_ties(recipe_name, dtype, s))


@lru_cache(maxsize=1)
def input_tie_recipes() -> tuple[str, ...]:
    """Recipes that round to the input dtype and have decisive bf16 and fp16 ties at some TIE_SCALES
    (not unfused-tensor0d: x / in(s) never lands on one there)."""
    return tuple(n for n, r in RECIPES.items() if r.intermediate == "input"
                 and all(tie_scales(n, d) for d in ("bfloat16", "float16")))


def non_dyadic_scales() -> st.SearchStrategy[float]:
    """Positive fp32 scales that are not powers of two, of moderate size (t * s stays normal)."""
    return st.one_of(sampled((f32(0.3), f32(2 / 3), f32(0.7), f32(1 / 3), 3.0, f32(0.1))),
                     st.floats(2.0**-4, 2.0**4, width=32).filter(lambda v: math.frexp(v)[0] != 0.5))


def e4m3_tie_inputs(target: float, scale: float, recipe: Recipe) -> list[float]:
    """fp32 inputs x (a few ulps around target * s) whose scaled value is exactly target."""
    near = f32(target * scale)
    base = to_bits(abs(near), "float32")
    xs = [math.copysign(from_bits(b, "float32"), near) for b in range(max(base - 3, 0), base + 4)]
    return [x for x in xs if scaled_value(x, Scale("float", scale), recipe, "float32") == target]


def _other_op_byte_differs(x: float, target: float, scale: float, recipe: Recipe) -> bool:
    other = "divide" if recipe.scale_op == "mul_reciprocal" else "mul_reciprocal"
    y = pre_intermediate(x, scale, dataclasses.replace(recipe, scale_op=other), FORMATS["float32"])
    return round_to(y, E4M3) != round_to(target, E4M3)


@st.composite
def e4m3_tie_overrides(draw: st.DrawFn, n: int, k_scale: float, v_scale: float,
                       recipe: Recipe | str) -> tuple[Override, ...]:
    """At each of the n flat positions of k and v, an fp32 input whose scaled value is an e4m3 tie."""
    recipe = get_recipe(recipe)
    out = []
    for tensor, scale in (("k", k_scale), ("v", v_scale)):
        for index in range(n):
            byte = draw(ints(0x00, 0x7D), label=f"{tensor}[{index}]_tie_below")  # 0x7E's upper neighbour is 480
            target = (e4m3_value(byte) + e4m3_value(byte + 1)) / 2
            if draw(st.booleans(), label=f"{tensor}[{index}]_negative"):
                target = -target
            xs = e4m3_tie_inputs(target, scale, recipe)
            # Prefer inputs where the other scale_op (x / s for x * (1/s), and back) rounds elsewhere:
            # there a recipe's operation is visible in the byte. Else any input that hits the tie.
            sensitive = [x for x in xs if _other_op_byte_differs(x, target, scale, recipe)]
            xs, label = (sensitive, "e4m3-tie-op-sensitive") if sensitive else (xs, "e4m3-tie")
            if not xs:
                event("e4m3 tie: no fp32 input hits it")
                continue
            x = xs[draw(ints(0, len(xs) - 1), label=f"{tensor}[{index}]_which")] if len(xs) > 1 else xs[0]
            out.append(Override(tensor, index, to_bits(x, "float32"), label))
            event(f"override: {label}")
    event(f"e4m3 ties: {len(out)} of {2 * n} positions")
    return tuple(out)


@st.composite
def input_tie_overrides(draw: st.DrawFn, n: int, dtype: str, k_scale: float, v_scale: float,
                        recipe: Recipe | str) -> tuple[Override, ...]:
    """At each of the n flat positions of k and v, a dtype input whose scaled value is a decisive tie."""
    recipe = get_recipe(recipe)
    out = []
    for tensor, scale in (("k", k_scale), ("v", v_scale)):
        pool = decisive_input_ties(recipe.name, dtype, scale)
        if not pool:
            raise ValueError(f"no decisive {dtype} ties at scale {scale!r} under {recipe.name}: "
                             "draw the scale from tie_scales()")
        out += _signed_picks(draw, tensor, n, pool, "tie", "input-tie")
    return tuple(out)


def _signed_picks(draw: st.DrawFn, tensor: str, n: int, pool: tuple[int, ...], name: str,
                  label: str) -> list[Override]:
    """Overrides of the n flat positions of one tensor: each an input of `pool` (16-bit patterns)
    with a drawn sign. Shrinks toward pool[0], positive."""
    out = []
    for index in range(n):
        bits = pool[draw(ints(0, len(pool) - 1), label=f"{tensor}[{index}]_{name}")]
        if draw(st.booleans(), label=f"{tensor}[{index}]_negative"):
            bits |= 1 << 15
        out.append(Override(tensor, index, bits, label))
    return out


# -- scale ties: the scale itself is a bf16/fp16 tie (recipes that round the scale to the input dtype)
@lru_cache(maxsize=1)
def scale_tie_recipes() -> tuple[str, ...]:
    """Recipes that round the scale to the input dtype (scale_dtype == "input"): unfused-tensor0d."""
    return tuple(n for n, r in RECIPES.items() if r.scale_dtype == "input")


def scale_rounding_pair(scale: float, dtype: str) -> tuple[float, float]:
    """The two adjacent dtype values around a positive fp32 scale that is not one of them (the upper
    one is inf past the largest finite value): what RNE chooses between when it rounds the scale."""
    fmt = FORMATS[dtype]
    q = quantum(scale, fmt)
    lower = math.floor(scale / q) * q
    if lower == scale:
        raise ValueError(f"scale {scale!r} is a {dtype} value: its rounding chooses nothing")
    upper = lower + q
    return lower, (math.inf if upper > fmt.max_finite else upper)


@lru_cache(maxsize=256)
def scale_decisive_inputs(recipe_name: str, dtype: str, lower: float, upper: float) -> tuple[int, ...]:
    """Bits of every non-negative finite x of dtype whose byte differs when the recipe's scale is
    rounded to `lower` rather than `upper` (the reference's own steps, with those two fp32 scales)."""
    recipe = dataclasses.replace(get_recipe(recipe_name), scale_dtype="fp32")  # the scale comes pre-rounded
    bits = torch.arange(0, _INF[dtype], dtype=torch.int32)
    xs = bits.to(_INT[dtype]).view(_TORCH[dtype])
    lo, hi = (quantize(xs, ScaleArg("float", s, None), recipe) for s in (lower, upper))
    return tuple(bits[lo != hi].tolist())


@st.composite
def scale_tie_overrides(draw: st.DrawFn, n: int, dtype: str, k_scale: float, v_scale: float,
                        recipe: Recipe | str) -> tuple[Override, ...]:
    """At each of the n flat positions of k and v, a dtype input whose byte tells the two roundings
    of its tensor's scale apart (label "scale-tie-decisive"), either sign. For recipes that round the
    scale (scale_tie_recipes()) and scales from strategies.scales.scale_tie_values(dtype); raises
    ValueError for a scale that is a dtype value or has no such input. Shrinks toward the smallest
    such input, positive."""
    recipe = get_recipe(recipe)
    if recipe.name not in scale_tie_recipes():
        raise ValueError(f"recipe {recipe.name} reads the scale as fp32: no scale tie decides its bytes")
    out = []
    for tensor, scale in (("k", k_scale), ("v", v_scale)):
        pool = scale_decisive_inputs(recipe.name, dtype, *scale_rounding_pair(scale, dtype))
        if not pool:
            raise ValueError(f"no {dtype} input tells the roundings of scale {scale!r} apart under {recipe.name}")
        event(f"scale tie: {'under 100' if len(pool) < 100 else 'over 100'} decisive {dtype} inputs")
        out += _signed_picks(draw, tensor, n, pool, "decisive", "scale-tie-decisive")
    return tuple(out)
