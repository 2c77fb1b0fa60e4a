"""Tile sweep: how `kernel.fused.choose_tile`'s buckets were chosen, re-runnable on any CUDA GPU.

    python -m tools.tile_sweep [--tiles 2048x4,4096x4] [--shapes 8x128,8x80] [--encoders hardware]
                               [--decode-tiles 512x4,1024x4,2048x4] [--decode-shapes 8x128,32x128]

For each (tile elements x warps) it times the fused call through `kernel.fused.launch(tile=...)`,
graph-replayed like `make bench` (10 calls in one CUDA graph, do_bench median, bf16, scale 0.7;
prefill slots as `--locs` says, whole pages by default as in `make bench`; decode slots random), as %
of a device-to-device copy of the same bytes, and checks the bytes against the reference once per
configuration:
- prefill: T = 32768, each of --shapes (H x D), every recipe, each of --encoders;
- decode: T = 1, 8, 64 at each of --decode-shapes, recipe unfused, hardware encoder, beside two
  floors (an empty Triton kernel and a Triton copy of the same bytes, graph-replayed).
`--per-token-head` sweeps the per-(token, head) kernel instead (kernel.per_token_head_kernel, both scale
layouts, `--tiles` at T = 32768, each width cap (16, 8, 4, 1: bytes a cache store, elements an input load)
up to what its layout allows; the recipe is its own, checked against its spec). Writes tile_sweep.csv to
$OUT (else reports/). CUDA only. The H200 run that chose the current buckets is
docs/results/tile-sweep-2026-12-02-final.csv (docs/results/README.md has its command).
"""

from __future__ import annotations

import csv
import sys

from tools._cli import ENCODERS, comma_list, cuda_missing, parser
from tools.bench import PAGE_SIZE, add_locs_argument, buffer_sets, bytes_moved, graph_replay_us, output_dir, rotation


def _pairs(text: str) -> list[tuple[int, int]]:
    return [tuple(int(n) for n in item.split("x")) for item in comma_list()(text)]  # type: ignore[misc]


def main(argv: list[str] | None = None) -> int:
    p = parser("tile_sweep", __doc__)
    p.add_argument("--tiles", type=_pairs, default=_pairs("2048x4,4096x4,8192x4,8192x8,4096x8"),
                   help="prefill tiles as ELEMENTSxWARPS")
    p.add_argument("--shapes", type=_pairs, default=_pairs("8x128"), help="prefill shapes as HxD")
    p.add_argument("--encoders", type=comma_list(ENCODERS), default=",".join(ENCODERS))
    p.add_argument("--decode-tiles", type=_pairs, default=_pairs("512x4,1024x4,1024x2,2048x4,2048x8"))
    p.add_argument("--decode-shapes", type=_pairs, default=_pairs("8x128"), help="decode shapes as HxD")
    p.add_argument("--rep-ms", type=float, default=20.0)
    p.add_argument("--per-token-head", action="store_true", help="sweep the per-(token, head) kernel's tiles")
    add_locs_argument(p)
    args = p.parse_args(argv)

    if cuda_missing("tools.tile_sweep", "it times compiled tiles"):
        return 2
    import torch
    import triton
    import triton.language as tl

    import kernel
    from kernel.fused import launch
    from kernel.plan import make_plan

    dev = torch.device("cuda")

    def graph_us(fn, sets: int) -> float:
        return graph_replay_us(fn, sets, args.rep_ms)

    def plan(s: dict, recipe: str):
        return make_plan(s["k"], s["v"], s["k_cache"], s["v_cache"], s["cache_loc"], s["k_scale"], s["v_scale"],
                         PAGE_SIZE, recipe=recipe)

    def exact(s: dict, recipe: str, encoder: str, tile) -> bool:
        for name in ("k_cache", "v_cache"):
            s[name].view(torch.uint8).zero_()
        launch(plan(s, recipe), encoder, tile=tile)
        ref = {n: torch.zeros_like(s[n]) for n in ("k_cache", "v_cache")}
        kernel.naive_fp8_set_kv_buffer(s["k"], s["v"], ref["k_cache"], ref["v_cache"], s["cache_loc"], s["k_scale"],
                                       s["v_scale"], PAGE_SIZE, recipe=recipe)
        return all(torch.equal(ref[n].view(torch.uint8), s[n].view(torch.uint8)) for n in ref)

    copies: dict[int, float] = {}

    def copy_us(nbytes: int) -> float:
        if nbytes not in copies:
            n = rotation(nbytes)
            src = [torch.empty(nbytes // 2, dtype=torch.uint8, device=dev) for _ in range(n)]
            dst = [torch.empty_like(x) for x in src]
            copies[nbytes] = graph_us(lambda i: dst[i].copy_(src[i]), n)
        return copies[nbytes]

    rows: list[dict] = []

    def measure(phase: str, t: int, h: int, d: int, recipe: str, encoder: str, elements: int, warps: int,
                sets: list[dict]) -> None:
        tile = (elements, warps)
        plans = [plan(s, recipe) for s in sets]
        us = graph_us(lambda i: launch(plans[i], encoder, tile=tile), len(sets))
        ok = exact(sets[0], recipe, encoder, tile)
        c = copy_us(bytes_moved(t, h, d))
        rows.append(dict(phase=phase, T=t, H=h, D=d, recipe=recipe, encoder=encoder, tile_elements=elements,
                         warps=warps, us=f"{us:.3f}", copy_us=f"{c:.3f}", pct_roofline=f"{100 * c / us:.1f}",
                         bit_exact=ok))
        print(f"{phase:<8}{t:>6} {h}x{d:<4}{recipe:<17}{encoder[:4]:<5}{elements:>6}x{warps:<2}{us:9.2f} us "
              f"{100 * c / us:6.1f}%  exact={ok}", flush=True)

    print(f"tile sweep on {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    t = 32768
    if args.per_token_head:
        return _sweep_pth(args, graph_us, copy_us, rows)
    for h, d in args.shapes:
        sets = buffer_sets(t, h, d, rotation(bytes_moved(t, h, d)), locs=args.locs)
        for encoder in args.encoders:
            for elements, warps in args.tiles:
                for recipe in kernel.RECIPES:
                    measure("prefill", t, h, d, recipe, encoder, elements, warps, sets)
        del sets

    @triton.jit
    def _nop(x):
        pass

    @triton.jit
    def _copy(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    x = torch.zeros(16, device=dev)
    print(f"floor: an empty Triton kernel, graph-replayed: {graph_us(lambda i: _nop[(1,)](x), 1):.2f} us")
    for (h, d), t in ((shape, t) for shape in args.decode_shapes for t in (1, 8, 64)):
        n = bytes_moved(t, h, d) // 2
        src, dst = torch.empty(n, dtype=torch.uint8, device=dev), torch.empty(n, dtype=torch.uint8, device=dev)
        grid = (triton.cdiv(n, 2048),)
        triton_copy = graph_us(lambda i, n=n, src=src, dst=dst, grid=grid: _copy[grid](src, dst, n, BLOCK=2048), 1)
        print(f"floor: T={t} {h}x{d} a Triton copy of the same bytes {triton_copy:.2f} us, "
              f"torch copy_ {copy_us(2 * n):.2f} us")
        # a decode batch writes one token a sequence: its slots are random whatever --locs says
        sets = buffer_sets(t, h, d, 10, locs="random")
        for elements, warps in args.decode_tiles:
            measure("decode", t, h, d, "unfused", "hardware", elements, warps, sets)

    _write(rows)
    return 0 if all(r["bit_exact"] for r in rows) else 1


def _write(rows: list[dict]) -> None:
    path = output_dir() / "tile_sweep.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")


def _sweep_pth(args, graph_us, copy_us, rows: list[dict]) -> int:
    """The per-token-head kernel: each layout, encoder, tile and VEC at T = 32768, bit-exact once each."""
    import torch

    from kernel.per_token_head import make_pth_plan, write_per_token_head
    from kernel.per_token_head_kernel import launch_per_token_head

    def plan(s: dict, caches=None):
        k_cache, v_cache, ks, vs = caches or (s["k_cache"], s["v_cache"], s.get("k_scale_cache"),
                                              s.get("v_scale_cache"))
        return make_pth_plan(s["k"], s["v"], k_cache, v_cache, s["cache_loc"], None, None, PAGE_SIZE,
                             per_token_head=True, k_scale_cache=ks, v_scale_cache=vs)

    t = 32768
    for h, d in args.shapes:
        for layout in ("inline", "separate"):
            nbytes = bytes_moved(t, h, d) + t * h * 4 * 2
            sets = buffer_sets(t, h, d, rotation(nbytes), scale_kind="per-token-head", pth=layout,
                               locs=args.locs)
            expected = [torch.zeros_like(x) if x is not None else None
                        for x in (sets[0]["k_cache"], sets[0]["v_cache"], sets[0].get("k_scale_cache"),
                                  sets[0].get("v_scale_cache"))]
            write_per_token_head(plan(sets[0], expected))
            c = copy_us(nbytes)
            for encoder in args.encoders:
                for elements, warps in args.tiles:
                    for vec in (16, 8, 4, 1):
                        plans = [plan(s) for s in sets]

                        def run(i: int, plans=plans, encoder=encoder, tile=(elements, warps), vec=vec) -> None:
                            launch_per_token_head(plans[i], encoder, tile=tile, vec=vec)
                        us = graph_us(run, len(sets))
                        got = [x for x in (sets[0]["k_cache"], sets[0]["v_cache"], sets[0].get("k_scale_cache"),
                                           sets[0].get("v_scale_cache")) if x is not None]
                        ok = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                                 for a, b in zip(got, [x for x in expected if x is not None]))
                        name = f"pth-{layout}"
                        rows.append(dict(phase=name, T=t, H=h, D=d, recipe="per-token-head",
                                         encoder=encoder, tile_elements=elements, warps=warps, vec=vec,
                                         us=f"{us:.3f}", copy_us=f"{c:.3f}", pct_roofline=f"{100 * c / us:.1f}",
                                         bit_exact=ok))
                        print(f"{name:<17}{h}x{d:<4}{encoder[:4]:<5}{elements:>6}x{warps:<2} vec {vec} "
                              f"{us:9.2f} us {100 * c / us:6.1f}%  exact={ok}", flush=True)
            del sets
    _write(rows)
    return 0 if all(r["bit_exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
