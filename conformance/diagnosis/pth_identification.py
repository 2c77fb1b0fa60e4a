"""Which per-(token, head) recipe a dynamic-scale write computes, by experiment.

The two recipes (kernel.recipe.PTH_RECIPES) give the same bytes wherever no floor applies; they part on
heads whose amax is small (vLLM's floor: amax / 448 < 1e-6) or tiny (FlashInfer's: amax < 1e-12), and on
zero heads' stored scales. So each probe Case holds such heads beside ordinary ones, and an
implementation is identified with the recipe whose reference bytes (caches and scale caches) it matches
on every probe Case. Where none matches, it is held to a recipe whose bytes it gives on every probe Case with
one of its scale rules changed (conformance/diagnosis/pth_causes.py), before the closest by count: a kernel
of vLLM's arithmetic that floors the amax differs from FlashInfer's recipe in fewer bytes, but from vLLM's
by one rule, and a report held to FlashInfer's would name two defects for it.
"""

from __future__ import annotations

import dataclasses

import torch

from conformance.impls import Implementation
from conformance.pth_bytediff import differing
from kernel.recipe import DEFAULT_PTH_RECIPE, PTH_RECIPES
from strategies.case import Case, Layout
from strategies.per_token_head import PTHCase, build_pth

#: (tensor, token, head, kind) of the probe Cases' special heads.
HEADS = (("k", 0, 0, "small"), ("v", 0, 1, "tiny"), ("k", 1, 1, "zero"), ("v", 2, 0, "small"), ("k", 3, 1, "tiny"))


def probe_cases(layouts: tuple[str, ...]) -> list[PTHCase]:
    """Small Cases (bf16 and fp16, each of `layouts`), with floor-deciding heads; and one of 8,192 ordinary
    values, where multiplying by the reciprocal and dividing round apart (on about one value in 500)."""
    out = []
    wide = Case(num_tokens=16, num_heads=4, head_dim=128, page_size=16, num_pages=1, cache_loc=tuple(range(16)),
                input_dtype="bfloat16", cache_dtype="float8_e4m3fn", seed=3, recipe="single")
    for seed, dtype in ((1, "bfloat16"), (2, "float16")):
        case = Case(num_tokens=4, num_heads=2, head_dim=16, page_size=4, num_pages=2, cache_loc=(0, 3, 5, 6),
                    input_dtype=dtype, cache_dtype="float8_e4m3fn", seed=seed, recipe="single")
        out += [PTHCase(case, DEFAULT_PTH_RECIPE, layout, *_scale_layouts(layout), heads=HEADS) for layout in layouts]
    return out + [PTHCase(wide, DEFAULT_PTH_RECIPE, layout, *_scale_layouts(layout)) for layout in layouts]


def _scale_layouts(layout: str) -> tuple[Layout | None, Layout | None]:
    return (Layout.contiguous(3), Layout.contiguous(3)) if layout == "separate" else (None, None)


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


def _one_rule_off(impl: Implementation, differing: dict[PTHCase, int], device: torch.device) -> str | None:
    """The key of the one scale rule of the Cases' recipe under which the reference gives every byte impl
    writes on each Case it does not match (`differing`: each Case's count of differing elements); None where
    there is no such rule, or several."""
    from conformance.diagnosis.pth_causes import pth_cause
    keys = set()
    for pc in (pc for pc, n in differing.items() if n):
        found = pth_cause(pc, impl, device, held_only=True)
        if found is None:
            return None
        keys.add(found.key)
    return keys.pop() if len(keys) == 1 else None


def identify_per_token_head(impl: Implementation, device: torch.device,
                            layouts: tuple[str, ...] = ("separate",)) -> tuple[str, str]:
    """(recipe, note): the recipe impl matches on every probe Case, else the closest, said so."""
    cases = probe_cases(layouts)
    differing = {}  # recipe -> {its probe Case: elements differing}
    for name in PTH_RECIPES:
        differing[name] = {pc: _differing(impl, pc, device) for pc in (dataclasses.replace(c, mode=name)
                                                                         for c in cases)}
        if None in differing[name].values():
            return DEFAULT_PTH_RECIPE, f"identification failed: the implementation raised on a probe Case; " \
                                       f"held to {DEFAULT_PTH_RECIPE}"
    scores = {name: sum(counts.values()) for name, counts in differing.items()}
    order = sorted(scores, key=lambda n: (scores[n], n != DEFAULT_PTH_RECIPE))
    best = order[0]
    if scores[best] == 0:
        return best, f"identified: matches {best} on {len(cases)} probe Cases with floor-deciding heads"
    others = ", ".join(f"{n} ({c} elements differ)" for n, c in sorted(scores.items()))
    for name in order:
        rule = _one_rule_off(impl, differing[name], device)
        if rule is not None:
            return name, f"matches no per-token-head recipe; held to {name}, whose bytes it gives with one scale " \
                         f"rule changed ({rule}): {others}"
    return best, f"matches no per-token-head recipe; closest {best}: {others}"
