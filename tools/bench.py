"""`make bench`: the fused write against the copy roofline, the reference and the compiled reference.

CUDA only. For each recipe, encoder and shape (bf16 input, fp8 cache, a float scale by default) it times:
- fused, graph: N calls captured in one CUDA graph, replayed with triton.testing.do_bench (median), / N;
- fused, eager: back-to-back eager calls, wall clock per call (host work included: an eager call
  is host-bound at small T, and do_bench's GPU events would hide that behind its L2 flush);
- reference, eager and under torch.compile (dynamic shapes), the same wall-clock way (default recipe);
- copy: a device-to-device copy_ moving the same bytes (read + written), graph-replayed like the fused call.
Bytes of one call: T*H*D*(2 input bytes + 1 cache byte)*2 (K and V). Several buffer sets are rotated
when one call's data would fit in L2, so small shapes are not measured cache-hot.
Writes bench.csv and bench.png into $OUT if set, else reports/. Targets are reported, not asserted.
`--compare OLD.csv` puts another run's fused times (say, an earlier kernel's, run just before on the
same machine) beside each row, and scores them against this run's copy times.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from tools import _cli, host_overhead
from tools._cli import comma_list, out_dir, parser

if TYPE_CHECKING:
    import torch

TOKENS = (1, 8, 64, 512, 4096, 16384, 32768)
HEAD_SHAPES = ((8, 128), (32, 128), (8, 64), (4, 256), (8, 80))
QUICK_TOKENS = (1, 64, 4096, 32768)
QUICK_HEAD_SHAPES = ((8, 128), (4, 256))
OTHER_TOKENS = (16384, 32768)  # recipes other than the default: enough to check the roofline target
OTHER_DIMS = (64, 80, 128, 256)
L2_BYTES = 60 * 2**20  # H200; rotate buffers until the rotation set is several times this
PAGE_SIZE = 16
CALLS_PER_GRAPH = 10
DECODE_SLACK_US = {"hardware": 0.4, "software": 0.6}  # decode target: the copy's time plus this
# The modes beside the main grid's (issue 26): mode -> (scale kind, cache format, per-token-head scales' place).
MODES = {
    "per-head": ("per-head", "fp8_e4m3", None),
    "e5m2": ("float", "fp8_e5m2", None),
    "fnuz": ("float", "fp8_e4m3fnuz", None),
    "per-token-head-inline": ("per-token-head", "fp8_e4m3", "inline"),
    "per-token-head-separate": ("per-token-head", "fp8_e4m3", "separate"),
}
MODE_TOKENS = (1, 16384, 32768)
MODE_HEAD_SHAPES = ((8, 128), (4, 256))


@dataclass
class Row:
    """One measured configuration; times in microseconds per call (nan: not measured)."""

    recipe: str
    encoder: str
    T: int
    H: int
    D: int
    bytes: int
    mode: str = ""  # "" for the main grid (its scale kind and format are in the run's header), else a MODES key
    fused_graph_us: float = math.nan
    fused_eager_us: float = math.nan
    ref_eager_us: float = math.nan
    ref_compiled_us: float = math.nan
    copy_us: float = math.nan
    bit_exact: str = ""
    targets: str = ""
    prev_graph_us: float = math.nan
    prev_eager_us: float = math.nan
    prev_targets: str = ""

    @property
    def graph_gbps(self) -> float:
        return self.bytes / (self.fused_graph_us * 1e3)

    @property
    def graph_pct(self) -> float:
        return 100.0 * self.copy_us / self.fused_graph_us

    @property
    def eager_pct(self) -> float:
        return 100.0 * self.copy_us / self.fused_eager_us


def bytes_moved(tokens: int, heads: int, dim: int, in_bytes: int = 2, cache_bytes: int = 1) -> int:
    """Bytes one call reads and writes: each K and V element is read once and written once."""
    return tokens * heads * dim * (in_bytes + cache_bytes) * 2


def rotation(bytes_per_call: int, l2_bytes: int = L2_BYTES, most: int = CALLS_PER_GRAPH) -> int:
    """How many buffer sets to rotate so that a set is out of L2 by the time it is used again."""
    return max(1, min(most, math.ceil(3 * l2_bytes / max(bytes_per_call, 1))))


def targets(row: Row, default_recipe: str) -> str:
    """The issue's targets that apply to this row, each PASS or MISS (not asserted)."""
    out = []
    if row.encoder == "hardware" and row.T >= 16384 and row.D in OTHER_DIMS:
        out.append(("graph>=95%roof", row.graph_pct >= 95.0))
    if row.encoder == "software" and row.T >= 16384:
        out.append(("sw>=75%roof", row.graph_pct >= 75.0))
    if row.T <= 64:
        out.append(("decode<=3us", row.fused_graph_us <= 3.0))
        slack = DECODE_SLACK_US[row.encoder]
        out.append((f"decode<=copy+{slack}us", row.fused_graph_us <= row.copy_us + slack))
    if row.recipe == default_recipe and not math.isnan(row.ref_compiled_us):
        out.append(("eager<compiled-ref", row.fused_eager_us < row.ref_compiled_us))
    return " ".join(f"{name}:{'PASS' if ok else 'MISS'}" for name, ok in out)


def load_baseline(path: Path) -> dict[tuple[str, str, str, int, int, int], tuple[float, float]]:
    """(recipe, encoder, mode, T, H, D) -> (fused graph us, fused eager us) from another run's bench.csv."""
    with Path(path).open(newline="") as f:
        return {(r["recipe"], r["encoder"], r.get("mode", ""), int(r["T"]), int(r["H"]), int(r["D"])):
                (float(r["fused_graph_us"]), float(r["fused_eager_us"])) for r in csv.DictReader(f)}


def attach_baseline(row: Row, baseline: dict, default_recipe: str) -> None:
    """Put the baseline's times for this row beside it, with the targets they would meet here."""
    graph, eager = baseline.get((row.recipe, row.encoder, row.mode, row.T, row.H, row.D), (math.nan, math.nan))
    row.prev_graph_us, row.prev_eager_us = graph, eager
    if not math.isnan(graph):
        as_prev = Row(row.recipe, row.encoder, row.T, row.H, row.D, row.bytes, row.mode, fused_graph_us=graph,
                      fused_eager_us=eager, copy_us=row.copy_us)
        row.prev_targets = targets(as_prev, default_recipe)


def csv_fields() -> list[str]:
    names = [f.name for f in fields(Row)]
    return names + ["graph_gbps", "graph_pct_roofline", "eager_pct_roofline", "speedup_vs_ref",
                    "speedup_vs_compiled_ref"]


def csv_record(row: Row) -> dict:
    rec = asdict(row)
    rec.update(graph_gbps=row.graph_gbps, graph_pct_roofline=row.graph_pct, eager_pct_roofline=row.eager_pct,
               speedup_vs_ref=row.ref_eager_us / row.fused_eager_us,
               speedup_vs_compiled_ref=row.ref_compiled_us / row.fused_eager_us)
    return {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in rec.items()}


def write_csv(rows: list[Row], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=csv_fields())
        w.writeheader()
        for row in rows:
            w.writerow(csv_record(row))


def output_dir() -> Path:
    return out_dir("reports")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser("bench", __doc__)
    ints = lambda s: tuple(int(x) for x in comma_list()(s))
    shapes = lambda s: tuple(tuple(int(n) for n in hd.split("x")) for hd in comma_list()(s))
    p.add_argument("--quick", action="store_true", help=f"T in {QUICK_TOKENS}, (H, D) in {QUICK_HEAD_SHAPES}, "
                   "default recipe only, fewer reps")
    p.add_argument("--tokens", type=ints, default=None, help=f"comma-separated T values (default: {TOKENS})")
    p.add_argument("--heads-dims", type=shapes, default=None, help="e.g. 8x128,4x256 (default: the issue's five)")
    p.add_argument("--recipes", type=comma_list(_cli.RECIPE_NAMES), default=None,
                   help="comma-separated recipes (default: all; the default recipe gets the full grid)")
    p.add_argument("--other-tokens", type=ints, default=OTHER_TOKENS, help="T values for non-default recipes")
    p.add_argument("--encoders", type=comma_list(_cli.ENCODERS), default=_cli.ENCODERS)
    p.add_argument("--scale-kind", choices=("float", "tensor1", "tensor0d", "none", "per-head", "per-token-head"),
                   default="float", help="the scales' kind (per-head: a [H] tensor, one scale a head; per-token-head: "
                   "per_token_head=True, caches widened to D + 4 for the inline fp32 scales, default recipe only)")
    p.add_argument("--scale", type=float, default=0.7)
    p.add_argument("--cache-dtype", choices=("fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz"), default="fp8_e4m3",
                   help="the caches' format: float8_e4m3fn, float8_e5m2 or float8_e4m3fnuz caches (docs/e5m2.md; "
                   "fnuz always takes the software encoder)")
    add_locs_argument(p)
    p.add_argument("--no-reference", action="store_true", help="skip the reference and the compiled reference")
    p.add_argument("--rep-ms", type=float, default=None, help="do_bench rep time per measurement (ms)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--no-host", action="store_true", help="skip the host-time table (tools.host_overhead)")
    p.add_argument("--modes", type=comma_list(tuple(MODES)), default=tuple(MODES),
                   help=f"the modes' rows beside the main grid (T in {MODE_TOKENS}, (H, D) in {MODE_HEAD_SHAPES}, "
                   "default recipe; default: all)")
    p.add_argument("--no-modes", action="store_true", help="the main grid only")
    p.add_argument("--compare", type=Path, default=None, metavar="OLD.csv",
                   help="another run's bench.csv: its fused times beside each row, scored against this run's copy")
    args = p.parse_args(argv)
    if args.quick:
        args.tokens = args.tokens or QUICK_TOKENS
        args.heads_dims = args.heads_dims or QUICK_HEAD_SHAPES
        args.recipes = args.recipes or ("unfused",)
        args.rep_ms = args.rep_ms or 10.0
    args.tokens = args.tokens or TOKENS
    args.heads_dims = args.heads_dims or HEAD_SHAPES
    args.rep_ms = args.rep_ms or 25.0
    return args


def grid(args: argparse.Namespace, all_recipes: list[str],
         default_recipe: str) -> list[tuple[str, str, int, int, int]]:
    """(mode, recipe, T, H, D): the full grid for the default recipe, the roofline corner for the others
    (mode ""; per-token-head has one recipe of its own, the default's grid stands for it), then each mode's
    rows (default recipe)."""
    recipes = args.recipes or tuple(all_recipes)
    if args.scale_kind == "per-token-head":
        recipes = (default_recipe,)
    out = []
    for recipe in recipes:
        if recipe == default_recipe:
            out += [("", recipe, t, h, d) for h, d in args.heads_dims for t in args.tokens]
        else:
            out += [("", recipe, t, h, d) for h, d in args.heads_dims if d in OTHER_DIMS for t in args.other_tokens]
    if not args.no_modes:
        out += [(mode, default_recipe, t, h, d) for mode in args.modes for h, d in MODE_HEAD_SHAPES
                for t in MODE_TOKENS]
    return out


# ----------------------------------------------------------------------------------------------- CUDA
def graph_replay_us(fn: Callable[[int], None], sets: int, rep_ms: float) -> float:
    """Microseconds per call: CALLS_PER_GRAPH calls (rotating `sets` buffer sets) captured in one CUDA
    graph after a warm-up on a side stream, replayed under triton.testing.do_bench (median)."""
    import torch
    import triton.testing

    from conformance.capture import graph_capture

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(sets):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with graph_capture(graph):
        for i in range(CALLS_PER_GRAPH):
            fn(i % sets)
    ms = triton.testing.do_bench(graph.replay, warmup=5, rep=rep_ms, return_mode="median")
    return ms * 1e3 / CALLS_PER_GRAPH


def zeros_fp8(shape: tuple[int, ...], cache_dtype: str = "fp8_e4m3"):
    """A zeroed float8_e4m3fn CUDA tensor (float8_e5m2 / float8_e4m3fnuz for cache_dtype "fp8_e5m2" /
    "fp8_e4m3fnuz": docs/e5m2.md)."""
    import torch
    dtype = {"fp8_e5m2": torch.float8_e5m2, "fp8_e4m3fnuz": torch.float8_e4m3fnuz}.get(cache_dtype,
                                                                                     torch.float8_e4m3fn)
    return torch.zeros(shape, device="cuda", dtype=torch.uint8).view(dtype)


LOCS = ("random", "contiguous", "pages")
# A call of T >= 16K tokens is a prefill, and a prefill fills each page in slot order; docs/bench.md
# gives the numbers for random slots too.
DEFAULT_LOCS = "pages"


def add_locs_argument(p: argparse.ArgumentParser) -> None:
    """The --locs option every timing tool shares, so that they all measure the same slot order."""
    p.add_argument("--locs", choices=LOCS, default=DEFAULT_LOCS,
                   help="cache_loc: pages (default): the pages in a random order, each filled in slot order, as a "
                   "prefill's sequences fill vLLM's and SGLang's pages; random: a random permutation of the "
                   "cache's slots (the worst case for sectors shared between slots); contiguous: 0..T-1")


def slot_order(locs: str, t: int, pages: int, g: torch.Generator) -> torch.Tensor:
    """cache_loc for T tokens in a cache of `pages` pages (one of LOCS), on the generator's device."""
    import torch
    dev = g.device
    if locs == "random":
        return torch.randperm(pages * PAGE_SIZE, device=dev, generator=g)[:t]
    if locs == "pages":
        first = torch.randperm(pages, device=dev, generator=g) * PAGE_SIZE
        return (first[:, None] + torch.arange(PAGE_SIZE, device=dev)).flatten()[:t]
    return torch.arange(t, device=dev)


def buffer_sets(t: int, h: int, d: int, sets: int, *, scale_kind: str = "float", scale: float = 0.7,
                locs: str = DEFAULT_LOCS, cache_dtype: str = "fp8_e4m3", pth: str | None = "inline") -> list[dict]:
    """`sets` independent call arguments on CUDA (bf16 k, v from a seeded generator; zeroed fp8 paged
    caches; slots as `slot_order` draws them), keyed like the call's arguments.
    Per-token-head scales go inline (caches widened by 4 bytes a head) or, pth="separate", to
    [pages, page_size, H] float32 scale caches."""
    import torch
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1234 + t + 7 * h + 13 * d)
    pages = -(-t // PAGE_SIZE)
    dynamic = scale_kind == "per-token-head"
    width = d + 4 if dynamic and pth == "inline" else d
    separate = dynamic and pth == "separate"
    out = []
    for _ in range(sets):
        slots = slot_order(locs, t, pages, g)
        s = {"none": None, "per-token-head": None, "float": scale, "tensor1": torch.full((1,), scale, device=dev),
             "tensor0d": torch.full((), scale, device=dev),
             # one scale a head, each its own: scale * (1 + h/H)
             "per-head": scale * (1 + torch.arange(h, device=dev, dtype=torch.float32) / h)}[scale_kind]
        out.append(dict(
            k=torch.randn(t, h, d, device=dev, generator=g, dtype=torch.float32).to(torch.bfloat16),
            v=torch.randn(t, h, d, device=dev, generator=g, dtype=torch.float32).to(torch.bfloat16),
            k_cache=zeros_fp8((pages, PAGE_SIZE, h, width), cache_dtype),
            v_cache=zeros_fp8((pages, PAGE_SIZE, h, width), cache_dtype),
            cache_loc=slots.to(torch.int64), k_scale=s, v_scale=s, **({"per_token_head": True} if dynamic else {}),
            **({"k_scale_cache": torch.zeros((pages, PAGE_SIZE, h), device=dev),
                "v_scale_cache": torch.zeros((pages, PAGE_SIZE, h), device=dev)} if separate else {})))
    return out


def _run(args: argparse.Namespace) -> int:
    import torch
    import triton.testing

    import kernel
    from kernel.triton_kernel import fp8_kv_write

    dev = torch.device("cuda")
    default = kernel.DEFAULT_RECIPE.name
    started = time.time()

    def wall_us(fn: Callable[[int], None], sets: int) -> float:
        """Median over 5 batches of back-to-back calls (rotating buffer sets), wall clock per call."""
        fn(0)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(1 % sets)
        torch.cuda.synchronize()
        one = max(time.perf_counter() - t0, 1e-6)
        n = max(3, min(2000, int(args.rep_ms / 5 * 1e-3 / one)))
        samples = []
        for _ in range(5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(n):
                fn(i % sets)
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) / n * 1e6)
        return statistics.median(samples)

    def graph_us(fn: Callable[[int], None], sets: int) -> float:
        return graph_replay_us(fn, sets, args.rep_ms)

    def make_sets(mode: str, t: int, h: int, d: int, sets: int) -> list[dict]:
        kind, cache_dtype, pth = MODES[mode] if mode else (args.scale_kind, args.cache_dtype, "inline")
        return buffer_sets(t, h, d, sets, scale_kind=kind, scale=args.scale, locs=args.locs,
                           cache_dtype=cache_dtype, pth=pth)

    def call(fn, s: dict, **kw) -> None:
        for name in ("per_token_head", "k_scale_cache", "v_scale_cache"):
            if name in s:
                kw[name] = s[name]
        fn(s["k"], s["v"], s["k_cache"], s["v_cache"], s["cache_loc"], s["k_scale"], s["v_scale"], PAGE_SIZE, **kw)

    compiled_ref = torch.compile(kernel.naive_fp8_set_kv_buffer, dynamic=True)
    copy_cache: dict[int, float] = {}
    rows: list[Row] = []
    launches: dict[str, object] = {}
    recipes_all = list(kernel.RECIPES)
    todo = grid(args, recipes_all, default)
    baseline = load_baseline(args.compare) if args.compare else {}
    print(f"kvfp8 bench: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}; {len(todo)} shapes x encoders {args.encoders}; "
          f"scale {args.scale_kind} {args.scale}; locs {args.locs}; caches {args.cache_dtype}", flush=True)

    def bench_shape(mode: str, recipe: str, t: int, h: int, d: int) -> None:
        dynamic = (MODES[mode][0] if mode else args.scale_kind) == "per-token-head"
        nbytes = bytes_moved(t, h, d) + (t * h * 4 * 2 if dynamic else 0)  # the fp32 scales K's and V's
        sets_n = rotation(nbytes)
        sets = make_sets(mode, t, h, d, sets_n)
        if nbytes not in copy_cache:
            src = [torch.empty(nbytes // 2, dtype=torch.uint8, device=dev) for _ in range(sets_n)]
            dst = [torch.empty_like(x) for x in src]
            copy_cache[nbytes] = graph_us(lambda i: dst[i].copy_(src[i]), sets_n)
        ref = reference(recipe, sets, sets_n) if recipe == default and not mode and not args.no_reference else None
        # e4m3fnuz takes the software encoder whatever is asked (docs/e5m2.md): one row, not a copy of it
        encoders = ("software",) if mode == "fnuz" and "software" in args.encoders else args.encoders
        for enc in encoders:
            row = Row(recipe, enc, t, h, d, nbytes, mode, copy_us=copy_cache[nbytes])
            run = lambda i, enc=enc: call(kernel.fused_fp8_set_kv_buffer, sets[i], recipe=recipe, encoder=enc)
            try:
                row.fused_graph_us = graph_us(run, sets_n)
                row.fused_eager_us = wall_us(run, sets_n)
            except Exception as exc:
                print(f"  fused {enc} failed at {recipe} T={t} H={h} D={d}: {type(exc).__name__}: {exc}"[:300])
            if ref is not None:
                row.ref_eager_us, row.ref_compiled_us, expected = ref
                s0 = sets[0]
                same = all(torch.equal(s0[name].view(torch.uint8), exp.view(torch.uint8))
                           for name, exp in zip(("k_cache", "v_cache"), expected))
                row.bit_exact = "yes" if same else "NO"
            row.targets = targets(row, default)
            if baseline:
                attach_baseline(row, baseline, default)
            if (mode or "main", enc) not in launches:
                launches[mode or "main", enc] = count_launches(torch, lambda run=run: run(0))
            rows.append(row)
            print_row(row, header=len(rows) == 1)
            write_csv(rows, output_dir() / "bench.csv")  # after every row: a cut-off run keeps its rows

    def reference(recipe: str, sets: list[dict], sets_n: int) -> tuple[float, float, list]:
        """(eager us, compiled us, expected caches of set 0)."""
        ref_eager = wall_us(lambda i: call(kernel.naive_fp8_set_kv_buffer, sets[i], recipe=recipe), sets_n)
        try:
            t0 = time.time()
            call(compiled_ref, sets[0], recipe=recipe)
            torch.cuda.synchronize()
            if time.time() - t0 > 5:
                print(f"  (torch.compile of the reference took {time.time() - t0:.0f} s)", flush=True)
            ref_compiled = wall_us(lambda i: call(compiled_ref, sets[i], recipe=recipe), sets_n)
        except Exception as exc:  # report and go on: the compiled reference is a baseline, not the subject
            print(f"  compiled reference failed: {type(exc).__name__}: {exc}"[:300])
            ref_compiled = math.nan
        expected = [zeros_fp8(sets[0]["k_cache"].shape), zeros_fp8(sets[0]["v_cache"].shape)]
        call(kernel.naive_fp8_set_kv_buffer, dict(sets[0], k_cache=expected[0], v_cache=expected[1]), recipe=recipe)
        return ref_eager, ref_compiled, expected

    for mode, recipe, t, h, d in todo:
        bench_shape(mode, recipe, t, h, d)
        torch.cuda.empty_cache()

    folder = output_dir()
    write_csv(rows, folder / "bench.csv")
    print(f"\nkernel launches per fused call (torch.profiler): {launches}")
    print(f"Triton compilations of fp8_kv_write: {compilations(fp8_kv_write)}")
    summarize(rows)
    if baseline:
        summarize(rows, "prev_targets", f"the --compare run ({args.compare})")
    if not args.no_plot:
        plot(rows, folder / "bench.png", default)
    if not args.no_host:
        host = host_overhead.measure()
        print("\nhost time per eager call, T = 1, 8x128, bf16 (tools.host_overhead):")
        for name, us in host:
            print(f"  {us:8.1f} us  {name}")
        (folder / "host-overhead.md").write_text(host_overhead.markdown(host, 1, 8, 128))
    print(f"wrote {folder / 'bench.csv'}; total {time.time() - started:.0f} s")
    return 0


def print_row(row: Row, header: bool) -> None:
    if header:
        print(f"{'recipe / mode':<32}{'enc':<5}{'T':>6}{'HxD':>7} {'graph us':>9}{'GB/s':>7}{'%roof':>6} "
              f"{'eager us':>9}{'ref us':>9}{'cref us':>9}{'copy us':>8}{'xref':>6}{'xcref':>6}"
              f"{'prev gr':>8}{'prev %':>7}{'prev eg':>8} exact  targets")
    f = lambda x, w, p=1: f"{x:>{w}.{p}f}" if not math.isnan(x) else f"{'-':>{w}}"
    label = f"{row.recipe} / {row.mode}" if row.mode else row.recipe
    print(f"{label:<32}{row.encoder[:4]:<5}{row.T:>6}{f'{row.H}x{row.D}':>7} {f(row.fused_graph_us, 9, 2)}"
          f"{f(row.graph_gbps, 7, 0)}{f(row.graph_pct, 6)} {f(row.fused_eager_us, 9)}{f(row.ref_eager_us, 9)}"
          f"{f(row.ref_compiled_us, 9)}{f(row.copy_us, 8, 2)}{f(row.ref_eager_us / row.fused_eager_us, 6)}"
          f"{f(row.ref_compiled_us / row.fused_eager_us, 6)}{f(row.prev_graph_us, 8, 2)}"
          f"{f(100 * row.copy_us / row.prev_graph_us, 7)}{f(row.prev_eager_us, 8)} {row.bit_exact or '-':<6} "
          f"{row.targets}", flush=True)


def summarize(rows: list[Row], field: str = "targets", who: str = "") -> None:
    counts: dict[str, list[int]] = {}
    for row in rows:
        for item in getattr(row, field).split():
            name, verdict = item.split(":")
            counts.setdefault(name, [0, 0])[verdict == "MISS"] += 1
    print(f"targets{' of ' + who if who else ''}: "
          + ", ".join(f"{n}: {p} pass / {m} miss" for n, (p, m) in counts.items()))
    if field != "targets":
        return
    not_exact = [r for r in rows if r.bit_exact == "NO"]
    if not_exact:
        print(f"NOT BIT-EXACT against the reference: {[(r.encoder, r.T, r.H, r.D) for r in not_exact]}")
    modes = [r for r in rows if r.mode and r.T == max(MODE_TOKENS)]
    if modes:
        print(f"modes at T = {max(MODE_TOKENS)}, graph-replayed, % of a copy of the same bytes: "
              + ", ".join(f"{r.mode} {r.encoder} {r.H}x{r.D} {r.graph_pct:.1f}%" for r in modes))


def count_launches(torch, fn: Callable[[], None]) -> object:
    """CUDA kernels one eager call launches, by torch.profiler; 'unknown' if the profiler is unavailable."""
    try:
        from torch.profiler import ProfilerActivity, profile
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        return len(kernels)
    except Exception as exc:  # the count is informative only
        return f"unknown ({type(exc).__name__})"


def compilations(jit_fn) -> object:
    """Compiled variants of a Triton JITFunction, from its per-device caches (layout differs by version)."""
    caches = getattr(jit_fn, "device_caches", None)
    if caches:
        return sum(len(v[0]) if isinstance(v, tuple) else len(v) for v in caches.values())
    cache = getattr(jit_fn, "cache", None)
    if isinstance(cache, dict):
        return sum(len(v) for v in cache.values())
    return "unknown"


def plot(rows: list[Row], path: Path, default: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    shapes = sorted({(r.H, r.D) for r in rows if r.recipe == default and not r.mode})
    if not shapes:
        return
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.8), squeeze=False, sharey=True)
    for ax, (h, d) in zip(axes[0], shapes):
        sel = [r for r in rows if r.recipe == default and not r.mode and (r.H, r.D) == (h, d)]
        series: dict[str, list[tuple[int, float]]] = {}
        for r in sel:
            series.setdefault(f"fused {r.encoder}, graph", []).append((r.T, r.graph_pct))
            series.setdefault(f"fused {r.encoder}, eager", []).append((r.T, r.eager_pct))
            if r.encoder == sel[0].encoder:
                series.setdefault("reference, eager", []).append((r.T, 100 * r.copy_us / r.ref_eager_us))
                series.setdefault("reference, compiled", []).append((r.T, 100 * r.copy_us / r.ref_compiled_us))
        for name, pts in series.items():
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.axhline(95, color="gray", ls=":", lw=1)
        ax.set_title(f"{default}, H={h} D={d}")
        ax.set_xlabel("tokens T")
    axes[0][0].set_ylabel("% of copy roofline")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if _cli.cuda_missing("tools.bench", "it times compiled kernels and CUDA graphs"):
        return 2
    import kernel.backend
    if kernel.backend.interpreted():
        print("tools.bench: TRITON_INTERPRET is set; unset it to time the compiled kernel.", file=sys.stderr)
        return 2
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
