"""How many compiled kernel variants the bit-exact property's Cases need on a GPU, counted anywhere.

Draws N Cases (derandomized, `tools.throughput.draw_cases`) from `test_bit_exact`'s strategy for
each recipe, builds each on the CPU, and computes the key Triton specializes the kernel on: the
constexprs (recipe switches, encoder, alignment, tile), the pointer dtypes and the warps, with the
tiles a compiled launch would use. Prints the distinct keys per (encoder, recipe) test and over all
of them, and how many values each dimension takes. (Scale tensors reach the kernel as integer
addresses, so a float scale and a tensor scale share a variant.)

    python -m tools.variants [--examples 150]

Each compile from scratch took about 0.34 s on the H200 (docs/results/h200-2026-12-03-e.md).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from kernel import RECIPES, fused
from kernel.plan import make_plan
from strategies import Case
from strategies.build import build
from tools._cli import parser
from tools.throughput import draw_cases


def variant_key(case: Case, software: bool) -> tuple | None:
    """The specialization key of the compiled launch for this Case (None: no launch, T = 0)."""
    b = build(case, "cpu")
    plan = make_plan(b.k, b.v, b.k_cache, b.v_cache, b.cache_loc, b.k_scale, b.v_scale, case.page_size,
                     recipe=case.recipe)
    if plan.num_tokens == 0:
        return None
    interpreted = fused.interpreted
    fused.interpreted = lambda: False  # the compiled tiles, whatever this machine runs
    try:
        _, args, constexprs, warps = fused.kernel_args(plan, software)
    finally:
        fused.interpreted = interpreted
    pointers = [str(a.dtype) for a in args[:5]]  # k, v, both caches, cache_loc (the scales are addresses)
    return tuple(sorted(constexprs.items())), tuple(pointers), warps


def main(argv: list[str] | None = None) -> int:
    p = parser("variants", __doc__)
    p.add_argument("--examples", type=int, default=150, help="Cases a test (default 150, the gpu profile's)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    every: set[tuple] = set()
    dims: dict[str, set] = defaultdict(set)
    for software in (False, True):
        for recipe in RECIPES:
            drawn = draw_cases(args.examples, "large", (recipe,))
            keys = {k for k in (variant_key(c, software) for c in drawn) if k}
            every |= keys
            for constexprs, pointers, _ in keys:
                c = dict(constexprs)
                dims["tiles"].add((c["BLOCK_T"], c["BLOCK_H"], c["BLOCK_D"]))
                dims["pointer dtypes"].add(pointers)
                dims["alignment (VEC)"].add(c["VEC"])
            print(f"{'software' if software else 'hardware'} {recipe}: {len(drawn)} Cases, {len(keys)} variants",
                  flush=True)
    print(f"all {2 * len(RECIPES)} tests: {len(every)} distinct variants; "
          + ", ".join(f"{name} {len(values)}" for name, values in dims.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
