"""Which per-(token, head) recipe a dynamic-scale write computes, by experiment.

The two recipes (kernel.recipe.PTH_RECIPES) give the same bytes wherever no floor applies; they part on
heads whose amax is small (vLLM's floor: amax / 448 < 1e-6) or tiny (FlashInfer's: amax < 1e-12), and on
zero heads' stored scales. So each probe Case holds such heads beside ordinary ones, and an
implementation is identified with the recipe whose reference bytes (caches and scale caches) it matches
on every probe Case.
"""

from __future__ import annotations

import torch

from conformance.impls import Implementation
from conformance.pth_bytediff import differing
from kernel.recipe import DEFAULT_PTH_RECIPE, PTH_RECIPES
from strategies.case import Case, Layout
from strategies.per_token_head import PTHCase, build_pth

#: (tensor, token, head, kind) of the probe Cases' special heads.
HEADS = (("k", 0, 0, "small"), ("v", 0, 1, "tiny"), ("k", 1, 1, "zero"), ("v", 2, 0, "small"), ("k", 3, 1, "tiny"))


def probe_cases(layouts: tuple[str, ...]) -> list[PTHCase]:
    """Small Cases (bf16 and fp16, each of `layouts`), with floor-deciding heads."""
    out = []
    for seed, dtype in ((1, "bfloat16"), (2, "float16")):
        case = Case(num_tokens=4, num_heads=2, head_dim=16, page_size=4, num_pages=2, cache_loc=(0, 3, 5, 6),
                    input_dtype=dtype, cache_dtype="float8_e4m3fn", seed=seed, recipe="single")
        for layout in layouts:
            scales = (Layout.contiguous(3), Layout.contiguous(3)) if layout == "separate" else (None, None)
            out.append(PTHCase(case, DEFAULT_PTH_RECIPE, layout, *scales, heads=HEADS))
    return out


def _differing(impl: Implementation, pc: PTHCase, device: torch.device) -> int | None:
    """How many elements impl's write differs from the recipe pc.mode in; None when impl raised."""
    import kernel
    expected, actual = build_pth(pc, device), build_pth(pc, device)
    kernel.naive_fp8_set_kv_buffer(**expected.call())
    try:
        impl.convention.invoke_per_token_head(impl.fn, actual.call(), impl.kwargs)
    except Exception:  # noqa: BLE001  (the properties report it; here it only fails to match)
        return None
    return sum(bad.numel() for bad, _, _ in differing(expected, actual).values())


def identify_per_token_head(impl: Implementation, device: torch.device,
                            layouts: tuple[str, ...] = ("separate",)) -> tuple[str, str]:
    """(recipe, note): the recipe impl matches on every probe Case, else the closest, said so."""
    cases = probe_cases(layouts)
    scores = {}
    for name in PTH_RECIPES:
        counts = [_differing(impl, PTHCase(pc.case, name, pc.layout, pc.k_scale_layout, pc.v_scale_layout,
                                           pc.heads), device) for pc in cases]
        if any(c is None for c in counts):
            return DEFAULT_PTH_RECIPE, f"identification failed: the implementation raised on a probe Case; " \
                                       f"held to {DEFAULT_PTH_RECIPE}"
        scores[name] = sum(counts)
    best = min(scores, key=lambda n: (scores[n], n != DEFAULT_PTH_RECIPE))
    if scores[best] == 0:
        return best, f"identified: matches {best} on {len(cases)} probe Cases with floor-deciding heads"
    others = ", ".join(f"{n} ({c} elements differ)" for n, c in sorted(scores.items()))
    return best, f"matches no per-token-head recipe; closest {best}: {others}"
