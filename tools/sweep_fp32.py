"""Every fp32 bit pattern through the fused kernel, bit-exact against the reference quantize.

    python -m tools.sweep_fp32 [--scales 1.0,0.3] [--recipes all|a,b] [--encoders all|hardware,software]
                               [--chunk-log2 26] [--chunks N]

The 2**32 patterns go in chunks of 2**chunk_log2, each laid out as k [T, 8, 128] fp32 (v is the
next chunk, so one launch checks two), written to a 3-D uint8 cache with cache_loc = arange(T).
The reference (`kernel.reference.quantize`, float64 on the GPU) is computed once per chunk, recipe
and scale and compared with every encoder. Prints per-recipe, per-encoder times and mismatch
counts; writes sweep_fp32.csv under $OUT (else reports/). Exit status 1 on any mismatch, 2 without
CUDA unless --chunks N asks for the first N chunks (under Triton's interpreter: a smoke test).
Timings of the last H200 run, per scale, recipe and encoder: docs/results/sweep-fp32-2026-12-02.csv.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch

import kernel  # noqa: F401  (picks the interpreter without CUDA, before triton loads)
from kernel import RECIPES, fused_fp8_set_kv_buffer, get_recipe
from kernel.backend import hardware_cast_available
from kernel.plan import ScaleArg
from kernel.reference import quantize
from tools._cli import ENCODERS, RECIPE_NAMES, comma_list, cuda_missing, out_dir, parser

HEADS, DIM = 8, 128


def _out_dir() -> Path:
    return out_dir(Path(__file__).resolve().parent.parent / "reports")


def _fp32(value: float) -> float:
    return torch.tensor(value, dtype=torch.float32).item()


def chunk(index: int, log2: int, device: torch.device) -> torch.Tensor:
    """Patterns [index * 2**log2, (index + 1) * 2**log2) as fp32 [T, HEADS, DIM]."""
    n = 1 << log2
    start = index * n
    bits = torch.arange(start, start + n, dtype=torch.int64, device=device)
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    return bits.view(torch.float32).view(n // (HEADS * DIM), HEADS, DIM)


def main(argv: list[str] | None = None) -> int:
    p = parser("sweep_fp32", __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scales", type=comma_list(), default="1.0",
                   help="comma-separated positive scales (rounded to fp32)")
    p.add_argument("--recipes", type=comma_list(["all", *RECIPE_NAMES]), default="all")
    p.add_argument("--encoders", type=comma_list(["all", *ENCODERS]), default="all")
    p.add_argument("--chunk-log2", type=int, default=26, help="patterns per chunk = 2**N (N >= 10)")
    p.add_argument("--chunks", type=int, default=0, help="only the first N chunks (0: all of 2**32)")
    args = p.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.chunks:
        return cuda_missing("tools.sweep_fp32", "2**32 patterns under Triton's interpreter take days; "
                            "--chunks N sweeps the first N chunks here")
    recipes = list(RECIPES) if args.recipes == ("all",) else list(args.recipes)
    for r in recipes:
        get_recipe(r)
    encoders = list(ENCODERS) if hardware_cast_available(device) else ["software"]
    if args.encoders != ("all",):
        encoders = list(args.encoders)
    scales = [_fp32(float(s)) for s in args.scales]
    if args.chunk_log2 < 10 or args.chunk_log2 > 31:
        p.error("--chunk-log2 must be in [10, 31]")
    total_chunks = 1 << (32 - args.chunk_log2)
    n_chunks = min(args.chunks, total_chunks) if args.chunks else total_chunks
    t_tokens = (1 << args.chunk_log2) // (HEADS * DIM)
    print(f"fp32 sweep on {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu (interpreter)'}: "
          f"{n_chunks} chunks of 2**{args.chunk_log2}, recipes {recipes}, encoders {encoders}, scales {scales}",
          flush=True)

    loc = torch.arange(t_tokens, dtype=torch.int64, device=device)
    caches = [torch.empty((t_tokens, HEADS, DIM), dtype=torch.uint8, device=device) for _ in range(2)]
    rows = []
    failed = False
    for scale in scales:
        sarg = ScaleArg("float", scale, None)
        for recipe in recipes:
            stats = {e: {"mismatches": 0, "kernel_s": 0.0, "first": ""} for e in encoders}
            ref_s = 0.0
            for i in range(0, n_chunks, 2):
                k = chunk(i, args.chunk_log2, device)
                v = chunk(i + 1, args.chunk_log2, device) if i + 1 < n_chunks else k
                t0 = time.perf_counter()
                expected = [quantize(k, sarg, get_recipe(recipe)), quantize(v, sarg, get_recipe(recipe))]
                if device.type == "cuda":
                    torch.cuda.synchronize()
                ref_s += time.perf_counter() - t0
                for enc in encoders:
                    for c in caches:
                        c.fill_(0xA5)  # a wrong-but-plausible byte, so a skipped write shows
                    t0 = time.perf_counter()
                    fused_fp8_set_kv_buffer(k, v, caches[0], caches[1], loc, scale, scale, page_size=1,
                                            recipe=recipe, encoder=enc)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    stats[enc]["kernel_s"] += time.perf_counter() - t0
                    for j, (x, e, c) in enumerate(zip((k, v), expected, caches)):
                        if j == 1 and v is k:
                            continue
                        bad = e != c
                        n_bad = int(bad.sum())
                        if n_bad and not stats[enc]["first"]:
                            flat = int(bad.flatten().nonzero()[0])
                            bits = int(x.flatten()[flat].view(torch.int32)) & 0xFFFFFFFF
                            stats[enc]["first"] = (f"0x{bits:08X}: expected 0x{int(e.flatten()[flat]):02X} "
                                                   f"actual 0x{int(c.flatten()[flat]):02X}")
                        stats[enc]["mismatches"] += n_bad
            elements = n_chunks << args.chunk_log2
            for enc in encoders:
                s = stats[enc]
                failed |= s["mismatches"] > 0
                print(f"  scale {scale!r:>22} {recipe:17s} {enc:9s} mismatches {s['mismatches']:>12,} "
                      f"of {elements:,}  kernel {s['kernel_s']:7.2f} s  reference {ref_s:7.2f} s  {s['first']}",
                      flush=True)
                rows.append({"scale": repr(scale), "recipe": recipe, "encoder": enc, "elements": elements,
                             "mismatches": s["mismatches"], "kernel_s": f"{s['kernel_s']:.3f}",
                             "reference_s": f"{ref_s:.3f}", "first_mismatch": s["first"]})
    out = _out_dir()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sweep_fp32.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"{'FAIL' if failed else 'PASS'}: written to {out / 'sweep_fp32.csv'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
