"""Strategies for replayed calls (CUDA graphs): Cases that write something, and new contents for the
same captured buffers."""

from __future__ import annotations

from hypothesis import assume
from hypothesis import strategies as st

from strategies.case import Case, Scale
from strategies.locations import cache_locs
from strategies.scales import scale_values


def _writes_something(case: Case) -> bool:
    """At least one token has an in-range slot, so replaying a graph must change the caches."""
    return any(0 <= s < case.num_slots for s in case.cache_loc)


@st.composite
def writing_cases(draw: st.DrawFn, base: st.SearchStrategy[Case]) -> Case:
    """A Case of `base` with at least one in-range slot (others are rejected). Shrinks as `base` does."""
    case = draw(base, label="case")
    assume(_writes_something(case))
    return case


@st.composite
def new_contents(draw: st.DrawFn, case: Case) -> Case:
    """The same shapes, layouts, dtypes and scale kinds; new data, slots and tensor-scale values.

    A float scale keeps its value: a graph holds it as a constant. A None scale stays None. Shrinks
    toward seed 0, the first slots and the simplest scale values.
    """
    def rescale(scale: Scale, name: str) -> Scale:
        if scale.kind in ("tensor0d", "tensor1"):
            return Scale(scale.kind, draw(scale_values(), label=f"new_{name}_value"))
        return scale

    return case.replace(
        seed=draw(st.integers(0, 2**32 - 1), label="new_seed"),
        cache_loc=draw(cache_locs(case.num_tokens, case.num_slots, case.page_size, case.loc_dtype,
                                  allow_out_of_range=True), label="new_cache_loc"),
        k_scale=rescale(case.k_scale, "k_scale"), v_scale=rescale(case.v_scale, "v_scale"),
    )
