"""tools.bench's CPU-safe pieces: argument parsing, the shape grid, byte accounting, targets, CSV."""

from __future__ import annotations

import csv
import dataclasses

import pytest

from kernel import RECIPES
from tools import bench


def test_grid_full_for_default_recipe_corner_for_others():
    args = bench.parse_args([])
    grid = bench.grid(args, list(RECIPES), "unfused")
    main = [g[1:] for g in grid if not g[0]]
    default = [g for g in main if g[0] == "unfused"]
    assert len(default) == len(bench.TOKENS) * len(bench.HEAD_SHAPES), default
    others = [g for g in main if g[0] != "unfused"]
    assert {g[1] for g in others} == set(bench.OTHER_TOKENS), others
    assert {g[3] for g in others} <= set(bench.OTHER_DIMS), others
    # A row per mode (issue 26), the default recipe's, at every mode token count and shape.
    modes = [g for g in grid if g[0]]
    assert len(modes) == len(bench.MODES) * len(bench.MODE_TOKENS) * len(bench.MODE_HEAD_SHAPES), modes
    assert {g[1] for g in modes} == {"unfused"}, modes
    quick = bench.parse_args(["--quick", "--no-modes"])
    assert {g[1] for g in bench.grid(quick, list(RECIPES), "unfused")} == {"unfused"}
    pth = bench.parse_args(["--scale-kind", "per-token-head", "--no-modes"])
    assert {g[1] for g in bench.grid(pth, list(RECIPES), "unfused")} == {"unfused"}


def test_byte_accounting_and_rotation():
    # K and V: 2 bytes read and 1 byte written per element each.
    assert bench.bytes_moved(3, 2, 5) == 3 * 2 * 5 * 3 * 2
    big = bench.bytes_moved(32768, 32, 128)
    assert bench.rotation(big) == 1, big
    assert bench.rotation(bench.bytes_moved(1, 8, 128)) == bench.CALLS_PER_GRAPH
    small = bench.bytes_moved(4096, 8, 128)
    assert bench.rotation(small) * small >= 3 * bench.L2_BYTES or bench.rotation(small) == bench.CALLS_PER_GRAPH


def test_targets_and_csv(tmp_path):
    row = bench.Row("unfused", "hardware", 16384, 8, 128, bench.bytes_moved(16384, 8, 128),
                    fused_graph_us=32.0, fused_eager_us=40.0, ref_compiled_us=30.0, copy_us=28.8)
    row.targets = bench.targets(row, "unfused")
    assert "graph>=95%roof:MISS" in row.targets and "eager<compiled-ref:MISS" in row.targets, row.targets
    decode = bench.Row("unfused", "software", 1, 8, 128, bench.bytes_moved(1, 8, 128),
                       fused_graph_us=2.6, copy_us=1.95)
    assert bench.targets(decode, "unfused") == "decode<=3us:PASS decode<=copy+0.6us:MISS"
    path = tmp_path / "bench.csv"
    bench.write_csv([row], path)
    rec = next(csv.DictReader(path.open()))
    assert float(rec["graph_pct_roofline"]) == 90.0, rec
    assert float(rec["graph_gbps"]) == float(f"{row.bytes / 32e3:.4g}"), rec
    assert rec["ref_eager_us"] == "nan", rec


def test_exits_cleanly_without_cuda(monkeypatch, capsys):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--quick"]) == 2
    assert "needs CUDA" in capsys.readouterr().err


def test_tile_sweep_parses_tiles_and_exits_cleanly_without_cuda(monkeypatch, capsys):
    import torch

    from tools import tile_sweep
    assert tile_sweep._pairs("2048x4,8192x8") == [(2048, 4), (8192, 8)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tile_sweep.main([]) == 2
    assert "needs CUDA" in capsys.readouterr().err


def test_compare_puts_another_runs_times_beside_each_row(tmp_path):
    old = bench.Row("unfused", "hardware", 16384, 8, 128, bench.bytes_moved(16384, 8, 128),
                    fused_graph_us=31.0, fused_eager_us=45.0, copy_us=28.0)
    path = tmp_path / "old.csv"
    bench.write_csv([old], path)
    baseline = bench.load_baseline(path)
    assert baseline == {("unfused", "hardware", "", 16384, 8, 128): (31.0, 45.0)}, baseline
    new = bench.Row("unfused", "hardware", 16384, 8, 128, old.bytes, fused_graph_us=29.0, copy_us=29.45)
    bench.attach_baseline(new, baseline, "unfused")
    # The old time is scored against this run's copy: 29.45 / 31.0 = 95.0% of the roofline.
    assert (new.prev_graph_us, new.prev_eager_us) == (31.0, 45.0)
    assert new.prev_targets == "graph>=95%roof:PASS", new.prev_targets
    unseen = bench.Row("single", "software", 1, 8, 128, bench.bytes_moved(1, 8, 128), copy_us=2.0)
    bench.attach_baseline(unseen, baseline, "unfused")
    assert unseen.prev_targets == "" and unseen.prev_graph_us != unseen.prev_graph_us  # nan: not in the old run


def test_variant_key_is_the_compiled_specialization():
    """tools.variants: a float and a tensor scale share a variant (scales reach the kernel as addresses:
    a typed placeholder pointer made them two); an int32 cache_loc is its own; the key carries the
    compiled tile, not the interpreter's."""
    from kernel.fused import tile_for
    from strategies.case import Case, Scale
    from tools.variants import variant_key

    base = dict(num_tokens=100, num_heads=2, head_dim=64, page_size=16, num_pages=8, cache_loc=tuple(range(100)))
    by_float = Case(**base, k_scale=Scale("float", 0.5))
    by_tensor = Case(**base, k_scale=Scale("tensor1", 0.5))
    assert variant_key(by_float, False) == variant_key(by_tensor, False)
    assert variant_key(by_float, False) != variant_key(dataclasses.replace(by_float, loc_dtype="int32"), False)
    constexprs = dict(variant_key(by_float, False)[0])
    assert (constexprs["BLOCK_T"], constexprs["BLOCK_D"]) == tile_for(2 * 64, 2048)[::2]


@pytest.mark.parametrize("locs", bench.LOCS)
def test_every_slot_order_gives_t_distinct_slots_of_the_cache(locs):
    import torch
    pages, t = 5, 70  # the last page partly used
    slots = bench.slot_order(locs, t, pages, torch.Generator().manual_seed(3))
    assert len(set(slots.tolist())) == t and 0 <= int(slots.min()) and int(slots.max()) < pages * bench.PAGE_SIZE
    if locs != "random":  # in slot order within each page
        assert bool((slots.view(-1, 2)[:, 1] - slots.view(-1, 2)[:, 0] == 1).all())
