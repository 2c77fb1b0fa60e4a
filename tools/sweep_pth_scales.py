"""Every fp32 amax through the per-token-head kernel, bit-exact against the reference write.

    python -m tools.sweep_pth_scales [--recipes all|a,b] [--chunk-log2 24] [--chunks N | --sample N]

Each of the 2**31 non-negative fp32 patterns (+0 to +inf, then the NaNs) is one head's amax: the head is
[a, 0, -0, -a/2] in an fp32 input [T, 8, 4], so its scale, its reciprocal (vLLM) and the bytes of a, -a/2 and
both zeros come from that one value. Chunks of 2**chunk_log2 heads go through the fused kernel (K a chunk, V
the next) into 3-D caches with separate [slots, 8] scale caches and cache_loc = arange(T), and through the
reference write (`use_triton=False`) on copies; the caches and scale caches are compared as bytes. Prints each
recipe's mismatch count and first mismatching amax; exit status 1 on any mismatch, 2 without CUDA unless
--chunks N asks for the first N chunks or --sample N for N chunks spread evenly over the whole range (under
Triton's interpreter: a smoke test; meta_tests/test_sweep_pth_scales.py).
"""

from __future__ import annotations

import sys
import time

import torch

import kernel  # noqa: F401  (picks the interpreter without CUDA, before triton loads)
from kernel import fused_fp8_set_kv_buffer
from kernel.recipe import PTH_RECIPES
from tools._cli import comma_list, cuda_missing, parser

HEADS, DIM = 8, 4
PATTERNS = 2**31  # the non-negative fp32 bit patterns


def heads(index: int, log2: int, device: torch.device) -> torch.Tensor:
    """fp32 [2**log2 / HEADS, HEADS, DIM]: head i of chunk `index` is [a, 0, -0, -a/2], a's bits the pattern
    index * 2**log2 + i."""
    n = 1 << log2
    bits = torch.arange(index * n, (index + 1) * n, dtype=torch.int64, device=device).to(torch.int32)
    a = bits.view(torch.float32)
    x = torch.stack([a, torch.zeros_like(a), torch.full_like(a, -0.0), a * -0.5], dim=-1)
    return x.view(n // HEADS, HEADS, DIM)


def _buffers(t: int, device: torch.device) -> dict[str, torch.Tensor]:
    return {"k_cache": torch.zeros(t, HEADS, DIM, dtype=torch.uint8, device=device),
            "v_cache": torch.zeros(t, HEADS, DIM, dtype=torch.uint8, device=device),
            "k_scale_cache": torch.zeros(t, HEADS, dtype=torch.float32, device=device),
            "v_scale_cache": torch.zeros(t, HEADS, dtype=torch.float32, device=device)}


def first_mismatch(k: torch.Tensor, v: torch.Tensor, recipe: str) -> str | None:
    """None when the kernel writes the reference's bytes for these inputs, else the first differing head."""
    t, device = k.shape[0], k.device
    loc = torch.arange(t, dtype=torch.int64, device=device)
    out = {}
    for use_triton in (True, False):
        b = _buffers(t, device)
        fused_fp8_set_kv_buffer(k, v, b["k_cache"], b["v_cache"], loc, page_size=1, use_triton=use_triton,
                                per_token_head=recipe, k_scale_cache=b["k_scale_cache"],
                                v_scale_cache=b["v_scale_cache"])
        out[use_triton] = b
    for name, x in (("k", k), ("v", v)):
        for part in ("cache", "scale_cache"):
            got, want = (out[u][f"{name}_{part}"].view(torch.uint8).view(t, HEADS, -1) for u in (True, False))
            bad = (got != want).any(-1).nonzero()
            if bad.numel():
                tok, head = bad[0].tolist()
                a = x[tok, head, 0]
                return (f"{name}_{part}, amax bits {a.view(torch.int32).item() & 0xFFFFFFFF:#010x} ({a.item()!r}): "
                        f"{bytes(got[tok, head].tolist()).hex()} != reference {bytes(want[tok, head].tolist()).hex()}"
                        f" ({bad.shape[0]} heads differ in this chunk)")
    return None


def main(argv: list[str] | None = None) -> int:
    p = parser("sweep_pth_scales", __doc__)
    p.add_argument("--recipes", type=comma_list(["all", *PTH_RECIPES]), default="all")
    p.add_argument("--chunk-log2", type=int, default=24, help="heads per chunk = 2**N (6 <= N <= 31)")
    p.add_argument("--chunks", type=int, default=0, help="only the first N chunks (0: all 2**31 patterns)")
    p.add_argument("--sample", type=int, default=0, help="N chunks spread evenly over the range instead")
    args = p.parse_args(argv)
    if not 6 <= args.chunk_log2 <= 31:
        p.error(f"--chunk-log2 must be in [6, 31], got {args.chunk_log2}")
    if args.chunks and args.sample:
        p.error("--chunks and --sample: give one of them")
    if not (args.chunks or args.sample) and cuda_missing(
            "tools.sweep_pth_scales", "all 2**31 amax patterns need a GPU; --chunks or --sample N runs anywhere"):
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    recipes = list(PTH_RECIPES) if "all" in args.recipes else list(args.recipes)
    total = PATTERNS >> args.chunk_log2
    if args.sample:
        chunks = sorted({min(j * total // args.sample, total - 1) for j in range(min(args.sample, total))})
    else:
        chunks = list(range(min(args.chunks, total) if args.chunks else total))
    failed = 0
    for recipe in recipes:
        started, bad, first = time.time(), 0, None
        for pair in range(0, len(chunks), 2):  # K one chunk, V the next
            k = heads(chunks[pair], args.chunk_log2, device)
            v = heads(chunks[min(pair + 1, len(chunks) - 1)], args.chunk_log2, device)
            found = first_mismatch(k, v, recipe)
            if found:
                bad += 1
                first = first or found
        print(f"{recipe}: {len(chunks) << args.chunk_log2} amax patterns, {bad} chunk pairs differ "
              f"({time.time() - started:.1f} s)" + (f"; first: {first}" if first else ""), flush=True)
        failed += bad
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
