"""The composite strategy: a whole Case, every dimension drawn with its dependencies."""

from __future__ import annotations

from hypothesis import strategies as st

from strategies.case import CACHE_DTYPES, INPUT_DTYPES, LOC_DTYPES, Case, Layout, Scale

HEAD_DIMS = (64, 80, 96, 128, 192, 256)


@st.composite
def cases(draw: st.DrawFn, *, max_tokens: int = 12, recipes: tuple[str, ...] | None = None) -> Case:
    """A valid Case (a placeholder until the per-dimension strategies land)."""
    from kernel import RECIPES
    t = draw(st.integers(0, max_tokens), label="num_tokens")
    h = draw(st.integers(1, 5), label="num_heads")
    d = draw(st.sampled_from(HEAD_DIMS) | st.integers(1, 40), label="head_dim")
    ps = draw(st.sampled_from((1, 3, 16)), label="page_size")
    pages = -(-max(t, 1) // ps) + draw(st.integers(0, 2), label="spare_pages")
    slots = draw(st.lists(st.integers(0, pages * ps - 1), min_size=t, max_size=t, unique=True),
                 label="slots")
    scale = st.builds(Scale, st.sampled_from(("none", "float", "tensor0d", "tensor1")),
                      st.sampled_from((1.0, 0.5, 0.30000001192092896, 2.0**-6)))
    return Case(
        num_tokens=t, num_heads=h, head_dim=d, page_size=ps, num_pages=pages, cache_loc=tuple(slots),
        input_dtype=draw(st.sampled_from(INPUT_DTYPES), label="input_dtype"),
        cache_dtype=draw(st.sampled_from(CACHE_DTYPES), label="cache_dtype"),
        loc_dtype=draw(st.sampled_from(LOC_DTYPES), label="loc_dtype"),
        k_layout=Layout.contiguous(3), v_layout=Layout.contiguous(3),
        k_scale=draw(scale, label="k_scale"), v_scale=draw(scale, label="v_scale"),
        seed=draw(st.integers(0, 2**32 - 1), label="seed"),
        recipe=draw(st.sampled_from(recipes or tuple(RECIPES)), label="recipe"),
    )
