"""The compiled tile rule (kernel.fused.tile_for) keeps the invariants the kernel relies on."""

from __future__ import annotations

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
