"""Scales: the kind (None, a float, a 0-d tensor, a 1-element tensor) and the fp32 value.

Values are always exactly fp32 and positive finite, stored as that fp32 value (a Python float),
so a float argument and a tensor argument of the same Case mean the same number. They come in
classes: powers of two (exact scaling), non-dyadic values (every product rounds), tiny and huge
values (1/s overflows, x/s underflows; rounding the scale to fp16 gives 0 or inf), and small values
that push ordinary data past 448.
"""

from __future__ import annotations

from functools import lru_cache

from hypothesis import event
from hypothesis import strategies as st

from strategies._cache import ints, sampled
from strategies.case import SCALE_KINDS, Scale
from strategies.fp import FP32, f32

VALUE_CLASSES = ("pow2", "non-dyadic", "tiny", "huge", "amplifying")

_CLASS = {
    "pow2": ints(-12, 12).map(lambda e: 2.0**e),
    "non-dyadic": st.one_of(sampled((0.3, 0.7, 1 / 3, 0.1, 1.7, 3.0, 0.0123, 41.5)),
                            st.floats(2.0**-8, 2.0**8, width=32)).map(f32),
    # 2**-149 is the smallest fp32 subnormal; 1/s is inf for the smallest ones.
    "tiny": sampled((2.0**-149, 1e-40, 2.0**-126, 1e-30, 2.0**-100, 6e-8)).map(f32),
    "huge": sampled((FP32.max_finite, 1e38, 2.0**100, 1e30, 70000.0)).map(f32),
    # Small scales: data of ordinary magnitude lands past 448 after scaling.
    "amplifying": sampled((2.0**-10, 1e-3, 0.003, 2.0**-16, 1 / 448)).map(f32),
}


@st.composite
def scale_values(draw: st.DrawFn) -> float:
    """A positive finite fp32 value from one of VALUE_CLASSES (ordinary ones more often)."""
    cls = draw(sampled(("pow2", "non-dyadic", "pow2", "non-dyadic") + VALUE_CLASSES[2:]),
               label="scale_class")
    event(f"scale value: {cls}")
    return draw(_CLASS[cls], label="scale_value")


@lru_cache(maxsize=64)
@st.composite
def scales(draw: st.DrawFn, name: str = "k_scale", kinds: tuple[str, ...] | None = None) -> Scale:
    """A Scale: kind from `kinds` (default all of SCALE_KINDS), value as in scale_values().

    Cached: the arguments must be hashable (pass kinds as a tuple).
    """
    kinds = tuple(SCALE_KINDS if kinds is None else kinds)
    if not kinds or any(k not in SCALE_KINDS for k in kinds):
        raise ValueError(f"scale kinds must be a non-empty subset of {SCALE_KINDS}, got {kinds!r}")
    kind = draw(sampled(kinds), label=f"{name}_kind")
    event(f"scale: {name} {kind}")
    if kind == "none":
        return Scale("none", 1.0)  # build() scales the seeded data by value: None means 1.0
    return Scale(kind, draw(scale_values(), label=f"{name}_value"))
