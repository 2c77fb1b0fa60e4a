"""Values: special inputs put at drawn positions on top of the seeded contents.

`build` fills K and V from Case.seed; each `Override` drawn here replaces one element with an
exact bit pattern, labelled with what it is, so a failure shrinks to the one value that matters:
±0, ±inf, NaN of both signs (quiet and signalling payloads), input-dtype subnormals, the largest
finite input, and values chosen through the scale: x such that the recipe's scaled value x/s lands
on an e4m3 grid point, exactly between two e4m3 neighbours (a tie), around 448 / 464 / 480, or in
the e4m3 subnormal range. The input bits are computed at draw time in pure Python (strategies.fp),
with the recipe's own fp32 arithmetic; a target that no input value reaches exactly is labelled
with a trailing "~" (the nearest input is used).
For an e5m2 cache the targets are e5m2's: its grid, its ties, around 57344 (its largest finite value)
and 61440 (the tie with 65536, where the non-saturating rule reaches inf), and its subnormals down to
2**-16 and the tie below it (E5M2_LABELS); the bit labels are the same. For an e4m3fnuz cache
(FNUZ_LABELS): its grid, ties, around 240 (its largest finite value) and 248 (the tie with 256, where the
non-saturating rule reaches NaN), and its subnormals down to 2**-10 and the tie below it.
"""

from __future__ import annotations

import math
from functools import cache, lru_cache

from hypothesis import event
from hypothesis import strategies as st

from kernel.recipe import Recipe, get_recipe
from strategies._cache import ints, sampled
from strategies.case import Override, Scale
from strategies.fp import FORMATS, e4m3_value, e5m2_value, f32, fnuz_value, from_bits, ieee_div, round_to, to_bits

#: Every label an Override can carry (a target that was not hit exactly adds "~").
BIT_LABELS = ("+0", "-0", "+inf", "-inf", "+nan", "-nan", "subnormal", "max-finite")
TARGET_LABELS = ("e4m3-grid", "e4m3-tie", "around-448", "around-464", "around-480", "e4m3-subnormal")
LABELS = BIT_LABELS + TARGET_LABELS
E5M2_TARGET_LABELS = ("e5m2-grid", "e5m2-tie", "around-57344", "around-61440", "e5m2-subnormal")
E5M2_LABELS = BIT_LABELS + E5M2_TARGET_LABELS
FNUZ_TARGET_LABELS = ("fnuz-grid", "fnuz-tie", "around-240", "around-248", "fnuz-subnormal")
FNUZ_LABELS = BIT_LABELS + FNUZ_TARGET_LABELS
_FORMAT_LABELS = {"fp8_e5m2": E5M2_LABELS, "fp8_e4m3fnuz": FNUZ_LABELS}

_SIGN = {"float32": 1 << 31, "float16": 1 << 15, "bfloat16": 1 << 15}
_INF = {"float32": 0x7F800000, "float16": 0x7C00, "bfloat16": 0x7F80}
_QUIET = {"float32": 0x00400000, "float16": 0x0200, "bfloat16": 0x0040}  # the quiet-NaN bit


def scaled_value(x: float, scale: Scale, recipe: Recipe, dtype: str) -> float:
    """What `recipe` hands to the e4m3 rounding for input x: the same steps as the reference."""
    fmt = FORMATS[dtype]
    s = 1.0 if scale.kind == "none" else f32(scale.value)
    if recipe.scale_dtype == "input":
        s = round_to(s, fmt)
    if recipe.scale_op == "mul_reciprocal":
        y = f32(x * f32(ieee_div(1.0, s)))  # 0 * inf is NaN, as in fp32
    else:
        y = f32(ieee_div(x, s))
    return round_to(y, fmt) if recipe.intermediate == "input" else y


def _neighbour(x: float, k: int, dtype: str) -> float:
    """The value k representable steps away from x in dtype, away from zero for k > 0 (±inf caps)."""
    bits = to_bits(abs(x), dtype) + k
    return math.copysign(from_bits(min(max(bits, 0), _INF[dtype]), dtype), x)


def input_for(target: float, scale: Scale, recipe: Recipe, dtype: str) -> tuple[float, bool]:
    """An input x (exact in dtype) whose scaled value is target; (nearest x, False) if none is."""
    s = 1.0 if scale.kind == "none" else scale.value
    approx = round_to(target * s, FORMATS[dtype])
    if math.isinf(approx) or approx == 0.0:
        return approx, False
    for k in (0, 1, -1, 2, -2):
        x = _neighbour(approx, k, dtype)
        if scaled_value(x, scale, recipe, dtype) == target:
            return x, True
    return approx, False


@cache
def _targets(label: str) -> st.SearchStrategy[float]:
    """Magnitudes of scaled values for each target label."""
    if label == "e4m3-grid":
        return ints(0x01, 0x7E).map(e4m3_value)
    if label == "e4m3-tie":  # halfway between byte b and b + 1; 0x7D/0x7E's neighbour 480 is "around"
        return ints(0x00, 0x7D).map(lambda b: (e4m3_value(b) + e4m3_value(b + 1)) / 2)
    if label == "e4m3-subnormal":  # grid points, ties and anything in between, below 2**-6
        return st.one_of(ints(1, 15).map(lambda m: m * 2.0**-10), st.floats(2.0**-12, 2.0**-6))
    if label == "e5m2-grid":
        return ints(0x01, 0x7B).map(e5m2_value)
    if label == "e5m2-tie":  # halfway between byte b and b + 1; 0x7B's neighbour 61440 is "around"
        return ints(0x00, 0x7A).map(lambda b: (e5m2_value(b) + e5m2_value(b + 1)) / 2)
    if label == "e5m2-subnormal":  # grid points (m * 2**-16), ties (2**-17 among them) and between
        return st.one_of(ints(1, 7).map(lambda m: m * 2.0**-17), st.floats(2.0**-19, 2.0**-14))
    if label == "fnuz-grid":
        return ints(0x01, 0x7F).map(fnuz_value)
    if label == "fnuz-tie":  # halfway between byte b and b + 1; 0x7F's neighbour 248 is "around"
        return ints(0x00, 0x7E).map(lambda b: (fnuz_value(b) + fnuz_value(b + 1)) / 2)
    if label == "fnuz-subnormal":  # grid points (m * 2**-10), ties (2**-11 among them) and between
        return st.one_of(ints(1, 15).map(lambda m: m * 2.0**-11), st.floats(2.0**-13, 2.0**-7))
    return st.just(float(label.split("-")[1]))


@lru_cache(maxsize=4096)
@st.composite
def special_values(draw: st.DrawFn, dtype: str, scale: Scale, recipe: Recipe | str,
                   cache_format: str = "fp8_e4m3") -> tuple[int, str]:
    """(bits, label) of one special input value of dtype, for data quantized with scale and recipe
    into a cache of cache_format."""
    recipe = get_recipe(recipe)
    label = draw(sampled(_FORMAT_LABELS.get(cache_format, LABELS)), label="value_kind")
    sign = _SIGN[dtype]
    if label in ("+0", "-0"):
        return (sign if label == "-0" else 0), label
    if label in ("+inf", "-inf"):
        return _INF[dtype] | (sign if label == "-inf" else 0), label
    if label in ("+nan", "-nan"):
        payload = draw(sampled(("quiet", "signalling", "all-ones")), label="nan_payload")
        man = {"quiet": _QUIET[dtype], "signalling": 1, "all-ones": _QUIET[dtype] * 2 - 1}[payload]
        return _INF[dtype] | man | (sign if label == "-nan" else 0), label
    negative = draw(st.booleans(), label="negative")
    if label == "subnormal":
        man = draw(ints(1, _QUIET[dtype] * 2 - 1), label="subnormal_mantissa")
        return man | (sign if negative else 0), label
    if label == "max-finite":
        return (_INF[dtype] - 1) | (sign if negative else 0), label
    target = draw(_targets(label), label="target")
    x, exact = input_for(-target if negative else target, scale, recipe, dtype)
    if label.startswith("around-"):
        x = _neighbour(x, draw(ints(-2, 2), label="ulps_away"), dtype)
        exact = True  # "around" is a neighbourhood: any of these inputs is what was asked for
    return to_bits(x, dtype), label if exact else label + "~"


@lru_cache(maxsize=4096)
def _positions(n: int, max_size: int) -> st.SearchStrategy[list[tuple[str, int]]]:
    return st.lists(st.tuples(sampled(("k", "v")), ints(0, n - 1)), max_size=max_size, unique=True)


@lru_cache(maxsize=4096)
@st.composite
def overrides(draw: st.DrawFn, num_tokens: int, num_heads: int, head_dim: int, dtype: str,
              k_scale: Scale, v_scale: Scale, recipe: Recipe | str,
              max_overrides: int = 6, cache_format: str = "fp8_e4m3") -> tuple[Override, ...]:
    """Up to max_overrides special values of K and V at distinct drawn [T, H, D] flat positions."""
    n = num_tokens * num_heads * head_dim
    if n == 0 or max_overrides <= 0:
        return ()
    positions = draw(_positions(n, min(max_overrides, 2 * n)), label="override_positions")
    out = []
    for tensor, index in positions:
        bits, label = draw(special_values(dtype, k_scale if tensor == "k" else v_scale, recipe, cache_format),
                           label=f"{tensor}[{index}]")
        event(f"override: {label}")
        out.append(Override(tensor, index, bits, label))
    return tuple(out)
