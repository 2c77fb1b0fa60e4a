"""Scales: the kind (None, a float, a 0-d tensor, a 1-element tensor) and the fp32 value.

Values are always exactly fp32 and positive finite, stored as that fp32 value (a Python float),
so a float argument and a tensor argument of the same Case mean the same number. They come in
classes: powers of two (exact scaling), non-dyadic values (every product rounds), tiny and huge
values (1/s overflows, x/s underflows; rounding the scale to fp16 gives 0 or inf), and small values
that push ordinary data past 448. When the recipe rounds the scale to the input dtype
(scale_dtype == "input"), two more: fp32 values exactly halfway between two adjacent bf16/fp16
values ("input-tie", where only the tie rule decides the rounded scale) and their fp32 neighbours
one ulp either side ("input-tie-ulp", where the rounding must go to the nearer side).
"""

from __future__ import annotations

from functools import lru_cache

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from strategies._cache import ints, sampled
from strategies.case import SCALE_KINDS, Scale
from strategies.fp import FP32, f32, fp32_step, tie_above

VALUE_CLASSES = ("pow2", "non-dyadic", "tiny", "huge", "amplifying")
#: The value classes drawn only when the scale is rounded to a bf16/fp16 input dtype.
TIE_CLASSES = ("input-tie", "input-tie-ulp")
#: Input dtypes a scale can be rounded to with a tie (rounding to fp32 is the identity).
TIE_DTYPES = ("bfloat16", "float16")

_CLASS = {
    "pow2": ints(-12, 12).map(lambda e: 2.0**e),
    # 0.999 and 1.003: a scale that is nearly 1, which a "unit scale" fast path with a tolerance skips
    "non-dyadic": st.one_of(sampled((0.3, 0.7, 1 / 3, 0.1, 1.7, 3.0, 0.0123, 41.5, 0.999, 1.003)),
                            st.floats(2.0**-8, 2.0**8, width=32)).map(f32),
    # 2**-149 is the smallest fp32 subnormal; 1/s is inf for the smallest ones.
    "tiny": sampled((2.0**-149, 1e-40, 2.0**-126, 1e-30, 2.0**-100, 6e-8)).map(f32),
    "huge": sampled((FP32.max_finite, 1e38, 2.0**100, 1e30, 70000.0)).map(f32),
    # Small scales: data of ordinary magnitude lands past 448 after scaling.
    "amplifying": sampled((2.0**-10, 1e-3, 0.003, 2.0**-16, 1 / 448)).map(f32),
}
# Ordinary classes twice: they are what real scales look like.
_WEIGHTED = ("pow2", "non-dyadic", "pow2", "non-dyadic") + VALUE_CLASSES[2:]
# With a scale that every recipe of the draw rounds (conformance/test_bit_exact.py's unfused-tensor0d
# test), ties take 4 of 13 class draws and their neighbours 2: that rounding is the only thing that
# sets unfused-tensor0d apart from unfused-tensor1, and a wrong tie rule in it shows at no other scale
# (tools/mutant_catalogue.py: scale-bf16-ties-away and its kin). They sit among the first entries
# because Hypothesis's generation of a whole Case favours the first options of a choice (pow2 came out
# twice as often as its weight, the last classes half as often); pow2 stays first, the shrink target.
# meta_tests/test_tie_coverage.py measures the result. When only some recipes of the draw round the
# scale (every recipe at once: the other properties), 1 and 1 of 9, not to crowd out the other classes.
_WEIGHTED_TIES = {True: ("pow2", "input-tie", "non-dyadic", "input-tie-ulp", "pow2", "input-tie", "non-dyadic")
                        + VALUE_CLASSES[2:] + ("input-tie", "input-tie-ulp", "input-tie"),
                  False: _WEIGHTED + TIE_CLASSES}

#: Per dtype: the unbiased exponents of the normal lower neighbours drawn, mantissa bits, exponent bias.
_LAYOUT = {"bfloat16": (range(-16, 17), 7, 127), "float16": (range(-14, 16), 10, 15)}
_MAX_BITS = {"bfloat16": 0x7F7F, "float16": 0x7BFF}
# Where a tie sits: mostly among normal values; sometimes at the edges, where RNE's choice is
# between 0 and the smallest subnormal (it picks 0: the scale becomes 0), among subnormals, or
# between the largest finite value and inf (it picks inf: every quotient becomes 0).
_WHERE = ("normal", "normal", "zero-tie", "normal", "overflow-tie", "normal", "subnormal", "normal")


def _check_dtype(dtype: str) -> None:
    if dtype not in TIE_DTYPES:
        raise InvalidArgument(f"a scale can only be a tie of {TIE_DTYPES}, got {dtype!r}")


@st.composite
def _input_tie_values(draw: st.DrawFn, dtype: str) -> float:
    exponents, mbits, bias = _LAYOUT[dtype]
    where = draw(sampled(_WHERE), label="tie_where")
    if where == "zero-tie":
        lower = 0
    elif where == "overflow-tie":
        lower = _MAX_BITS[dtype]
    else:
        # The whole mantissa in one draw, its last bit the parity: a separate boolean came out even
        # far more often than odd in derandomized runs (Hypothesis favours the simplest choice).
        mantissa = draw(ints(0, 2**mbits - 1), label="tie_lower_mantissa")
        field = 0 if where == "subnormal" else draw(ints(exponents.start, exponents.stop - 1),
                                                    label="tie_exponent") + bias
        lower = (field << mbits) | mantissa
    event(f"scale tie: {dtype} {where}, lower neighbour {'odd' if lower & 1 else 'even'}")
    return tie_above(lower, dtype)


@lru_cache(maxsize=8)
def input_tie_values(dtype: str) -> st.SearchStrategy[float]:
    """fp32 values exactly halfway between two adjacent positive `dtype` (bf16/fp16) values.

    The lower neighbour's mantissa is drawn whole, so it is even or odd (RNE rounds the tie down or
    up) about equally often; its exponent is within 2**±16 (bf16) or fp16's normal range. About 1 draw
    in 8 each is a subnormal tie, the tie between 0 and the smallest subnormal, or the one between the
    largest finite value and inf.
    Shrinks toward a normal tie with an even lower neighbour 1.0, i.e. 1 + 2**-8 (bf16) or 1 + 2**-11.
    """
    _check_dtype(dtype)
    return _input_tie_values(dtype)


@st.composite
def _fp32_neighbours(draw: st.DrawFn, values: st.SearchStrategy[float]) -> float:
    value = draw(values, label="tie")
    step = draw(sampled((-1, 1)), label="ulp_step")
    return fp32_step(value, step)


@lru_cache(maxsize=8)
def fp32_neighbours(values: st.SearchStrategy[float]) -> st.SearchStrategy[float]:
    """The fp32 value one ulp below or above (equal odds) a positive finite fp32 value of `values`.
    Shrinks as `values` does, then to the one below."""
    if not isinstance(values, st.SearchStrategy):
        raise InvalidArgument(f"fp32_neighbours(values): a strategy of fp32 values, got {values!r}")
    return _fp32_neighbours(values)


@lru_cache(maxsize=8)
def input_tie_ulp_values(dtype: str) -> st.SearchStrategy[float]:
    """An fp32 neighbour (one ulp either side) of an input_tie_values(dtype) value."""
    return fp32_neighbours(input_tie_values(dtype))


def _tie_class(cls: str, dtype: str) -> st.SearchStrategy[float]:
    return input_tie_values(dtype) if cls == "input-tie" else input_tie_ulp_values(dtype)


@st.composite
def _scale_tie_values(draw: st.DrawFn, dtype: str) -> float:
    cls = draw(sampled(TIE_CLASSES[:1] * 3 + TIE_CLASSES[1:]), label="scale_class")
    event(f"scale value: {cls}")
    return draw(_tie_class(cls, dtype), label="scale_value")


@lru_cache(maxsize=8)
def scale_tie_values(dtype: str) -> st.SearchStrategy[float]:
    """A scale that is a `dtype` tie (3 draws in 4) or one fp32 ulp away from one: for properties that
    draw only ties (conformance/test_ties.py). Shrinks toward a tie, then as input_tie_values."""
    _check_dtype(dtype)
    return _scale_tie_values(dtype)


@st.composite
def _scale_values(draw: st.DrawFn, rounded_to: str | None, always_rounded: bool) -> float:
    cls = draw(sampled(_WEIGHTED if rounded_to is None else _WEIGHTED_TIES[always_rounded]), label="scale_class")
    event(f"scale value: {cls}")
    if cls in TIE_CLASSES:
        return draw(_tie_class(cls, rounded_to), label="scale_value")
    return draw(_CLASS[cls], label="scale_value")


@lru_cache(maxsize=16)
def scale_values(rounded_to: str | None = None, always_rounded: bool = False) -> st.SearchStrategy[float]:
    """A positive finite fp32 value from one of VALUE_CLASSES (ordinary ones more often).

    rounded_to: the input dtype ("bfloat16"/"float16") a recipe the scale may meet rounds it to, or
    None (no such recipe, or an fp32 input). With a dtype, the TIE_CLASSES of that dtype are drawn too:
    input_tie_values(rounded_to) and their fp32 neighbours, 6 class draws in 13 when always_rounded
    (every recipe it may meet rounds it), else 2 in 9. Shrinks toward the first class, powers of two.
    """
    if rounded_to is not None:
        _check_dtype(rounded_to)
    elif always_rounded:
        raise InvalidArgument("scale_values(always_rounded=True) needs the dtype: pass rounded_to")
    return _scale_values(rounded_to, always_rounded)


@st.composite
def _scales(draw: st.DrawFn, name: str, kinds: tuple[str, ...], rounded_to: str | None,
            always_rounded: bool) -> Scale:
    kind = draw(sampled(kinds), label=f"{name}_kind")
    event(f"scale: {name} {kind}")
    if kind == "none":
        return Scale("none", 1.0)  # build() scales the seeded data by value: None means 1.0
    return Scale(kind, draw(scale_values(rounded_to, always_rounded), label=f"{name}_value"))


@lru_cache(maxsize=64)
def scales(name: str = "k_scale", kinds: tuple[str, ...] | None = None, rounded_to: str | None = None,
           always_rounded: bool = False) -> st.SearchStrategy[Scale]:
    """A Scale: kind from `kinds` (default all of SCALE_KINDS), value as in
    scale_values(rounded_to, always_rounded).

    Cached: the arguments must be hashable (pass kinds as a tuple). Shrinks toward the first kind.
    """
    kinds = tuple(SCALE_KINDS if kinds is None else kinds)
    if not kinds or any(k not in SCALE_KINDS for k in kinds):
        raise ValueError(f"scale kinds must be a non-empty subset of {SCALE_KINDS}, got {kinds!r}")
    scale_values(rounded_to, always_rounded)  # checks them now, when the strategy is built
    return _scales(name, kinds, rounded_to, always_rounded)


@st.composite
def _per_head_values(draw: st.DrawFn, heads: int, rounded_to: str | None) -> tuple[float, ...]:
    first = draw(scale_values(rounded_to), label="head_0_scale")
    rest = [draw(st.one_of(st.just(first), scale_values(rounded_to), st.just(0.0)), label=f"head_{h}_scale")
            for h in range(1, heads)]
    event(f"per-head scales: {'a zero head' if 0.0 in rest else 'no zero head'}")
    return (first, *rest)


@lru_cache(maxsize=64)
def per_head_values(heads: int, rounded_to: str | None = None) -> st.SearchStrategy[tuple[float, ...]]:
    """One finite fp32 scale per head (a `[heads]` tensor's values), each as scale_values(rounded_to), the
    first head's value again, or (after the first) 0.0: heads that share a scale sit beside heads that do
    not, as in a checkpoint's per-head scales, where a head that calibration saw only as zeros gets
    amax / 448 = 0 (unchecked on the device; every recipe divides by it as IEEE fp32 does: ±inf, saturated,
    and 0 / 0 = NaN). Shrinks toward every head at the first head's value, a power of two.
    """
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 2:
        raise InvalidArgument(f"per_head_values(heads): an int >= 2 (one head is a per-tensor scale), got {heads!r}")
    scale_values(rounded_to)  # checks rounded_to now, when the strategy is built
    return _per_head_values(heads, rounded_to)
