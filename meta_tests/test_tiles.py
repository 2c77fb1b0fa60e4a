"""The compiled tile rule (kernel.fused.tile_for) keeps the invariants the kernel relies on."""

from __future__ import annotations

from unittest.mock import patch

from hypothesis import given
from hypothesis import strategies as st

from kernel.fused import tile_for


@given(dim=st.integers(1, 4096), elements=st.sampled_from([512, 1024, 2048, 4096, 8192]),
       warps=st.sampled_from([2, 4, 8]))
def test_compiled_tiles_are_powers_of_two_spanning_two_rows(dim: int, elements: int, warps: int):
    block_t, block_h, block_d, w = tile_for(dim, elements, warps)
    tile = (block_t, block_h, block_d)
    assert all(n & (n - 1) == 0 for n in tile), f"tile {tile} for D={dim}: not powers of two"
    # Triton 3.6 cannot compile a [1, 1, N] tile with the alignment hint (see tile_for).
    assert block_t * block_h >= 2, f"tile {tile} for D={dim}, {elements} elements spans one row"
    assert 16 <= block_d <= 512 and block_h * block_d <= 1024 and w == warps, f"tile {tile} for D={dim}"
    whole = dim & -dim
    if whole >= 64:  # no masked dims where a power of two of at least 64 divides D
        assert dim % block_d == 0, f"tile {tile} masks dims of D={dim}"


def test_few_tiles_serve_every_head_dim():
    """Each tile is a compiled variant (per dtype, recipe, encoder, VEC), and compiling them was most
    of `make test`'s time on the H200: the rule keeps to a handful per bucket whatever D is."""
    for elements in (512, 1024, 2048, 4096):
        tiles = {tile_for(dim, elements) for dim in range(1, 8193)}
        assert len(tiles) <= 4, f"{len(tiles)} tiles for {elements}-element programs: {sorted(tiles)}"


@given(heads=st.integers(1, 64), dim=st.integers(1, 1024), elements=st.sampled_from([512, 1024, 2048, 4096]),
       c_align=st.sampled_from([1, 4, 8, 16]), x_vec=st.sampled_from([1, 4, 8]), software=st.booleans())
def test_word_stores_only_where_a_warps_lanes_hold_whole_runs_of_the_row(heads, dim, elements, c_align, x_vec,
                                                                          software):
    """`_store_words` swaps words between the lanes of a run by warp shuffles and stores by each lane's own
    mask, so it must run only where every lane holds 8 consecutive bytes of a row, RUN lanes cover a run that
    lies inside D, and no lane is left without elements (kernel/per_token_head_kernel.py, `_words`)."""
    from kernel import per_token_head_kernel as pth

    block_t, block_h, block_d, warps = pth.pth_tile_for(heads, dim, elements)
    args = (c_align, x_vec, dim, block_d, block_t * block_h * block_d, warps, software)
    with patch.object(pth, "interpreted", return_value=False):
        run = pth._words(*args)
    with patch.object(pth, "interpreted", return_value=True):
        assert pth._words(*args) == 0, "the interpreter has no inline PTX"
    if run:
        assert run in (8, 16, 32) and c_align == 4 and x_vec == 8, (run, args)
        assert dim == block_d and dim % (8 * run) == 0, f"a run of {run} lanes leaves D = {dim}"
        assert block_t * block_h * block_d >= 8 * 32 * warps, f"a lane without 8 elements: {args}"
        assert software or dim == 256, f"the hardware encoder at D = {dim} measured faster with Triton's stores"
    elif (c_align, x_vec) == (4, 8) and (dim in (64, 128, 256) if software else dim == 256) and elements >= 1024:
        raise AssertionError(f"4-byte aligned rows where word stores measured faster get Triton's: {args}")
