"""Exhaustive: every bf16 and every fp16 bit pattern, through the real kernel, bit-exact.

How the tensors are made (and why not through Overrides): a Case fixes everything but the values
(shape 16 tokens x 16 heads x 256 dims = 65,536 elements, the slots, the scales, the recipe), and
`build` makes its buffers, poisoned gaps and guard bands as for any Case. `fill_patterns` then
overwrites the logical K with the 65,536 patterns in order and V with the same patterns permuted
(index i holds pattern i * 40503 mod 2**16, a bijection), so each scale meets every pattern at a
different (token, head, dim). 65,536 Overrides would say the same thing in a megabyte of JSON;
the values are a pure function of the dtype, so the Case plus "all patterns" is the whole repro: a
failure saves the Case with `"fill": "all-patterns"` (conformance.artifacts.FILLS), and `python -m
tools.repro` fills it the same way. Reference and implementation each get a fresh build of the same
filled Case, and the caches are compared by conformance.bytediff, whose report names the token, head,
dim and input value.
"""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

import pytest
import torch

from conformance.bytediff import compare_caches
from conformance.harness import execute, fail, run_reference
from conformance.impls import Implementation
from strategies.build import Built, build
from strategies.case import Case, Scale
from strategies.fp import f32, tie_above
from strategies.ties import scale_tie_recipes

T, H, D, PAGE = 16, 16, 256, 16
PERMUTE = 40503  # odd, so i -> i * PERMUTE mod 2**16 is a bijection
FILL = "all-patterns"  # fill_patterns, as a failure file names it (conformance.artifacts.FILLS)
CUDA = torch.cuda.is_available()

# CPU CI: two calls per (dtype, recipe); k and v carry different scales (and scale kinds), so
# six scales meet every pattern: non-dyadic, dyadic, tiny (overflows after scaling), None, and the
# subnormal and huge scales that _divide brings into range by a power of two first.
CPU_SCALES = {
    "0.3/2^-5": (Scale("float", 0.30000001192092896), Scale("tensor0d", 2.0**-5)),
    "1e-30/none": (Scale("tensor1", 1e-30), Scale("none")),
    "1e-40/3e38": (Scale("float", 1e-40), Scale("tensor1", 3e38)),
}
# CUDA: the full product, every value under every scale kind, k and v alike.
# 2**-64 and 2**126 bound the scales that _divide (kernel/triton_kernel.py) takes as they are;
# 1e-40 (subnormal), 2**-100, 1e-30 and 3e38 are first scaled into that range by 2**±100.
CUDA_VALUES = tuple(f32(v) for v in (1.0, 2.0**-8, 2.0**-5, 0.5, 2.0, 16.0, 0.3, 0.7, 0.0123, 2.0**-64, 2.0**126,
                                     2.0**-100, 1e-30, 1e30, 1e-40, 3e38))
CUDA_SCALES = [Scale("none")] + [Scale(kind, v) for v in CUDA_VALUES for kind in ("float", "tensor0d", "tensor1")]
# Recipes that round the scale to the input dtype: k's scale lies exactly halfway between two values
# of that dtype whose lower one is even (RNE rounds it down), v's between an odd and an even one (RNE
# rounds it up). Only the tie rule of the scale's rounding tells these apart from their neighbours.
SCALE_TIES = {
    "bfloat16": (Scale("tensor0d", tie_above(0x3E9A, "bfloat16")), Scale("float", tie_above(0x3E99, "bfloat16"))),
    "float16": (Scale("tensor0d", tie_above(0x34CC, "float16")), Scale("float", tie_above(0x34CD, "float16"))),
}


def pattern_case(dtype: str, k_scale: Scale, v_scale: Scale, recipe: str) -> Case:
    """The Case around the patterns: tokens scattered over three pages, in a shuffled order."""
    slots = tuple((5 * t + 3) % (3 * PAGE) for t in range(T))
    return Case(num_tokens=T, num_heads=H, head_dim=D, page_size=PAGE, num_pages=3, cache_loc=slots,
                input_dtype=dtype, k_scale=k_scale, v_scale=v_scale, recipe=recipe)


def patterns(dtype: torch.dtype, permuted: bool) -> torch.Tensor:
    index = torch.arange(2**16, dtype=torch.int64)
    if permuted:
        index = index * PERMUTE % 2**16
    return index.to(torch.int32).to(torch.int16).view(dtype).reshape(T, H, D)


def fill_patterns(built: Built) -> Built:
    """Overwrite the logical K and V (and their views in the poisoned buffers) with all patterns."""
    dtype = built.k_logical.dtype
    for name, permuted in (("k", False), ("v", True)):
        values = patterns(dtype, permuted)
        view = getattr(built, name)
        view.copy_(values.to(view.device).reshape(view.shape))  # bit copy: same dtype
        setattr(built, f"{name}_logical", values)
    return built


def check_patterns(case: Case, impl: Implementation, device: torch.device) -> None:
    """All patterns through impl (in its convention, held to its recipe) against the reference."""
    case = impl.fit(case)
    expected = fill_patterns(build(case, device))
    run_reference(case, device, expected)
    actual = fill_patterns(build(case, device))
    execute(impl, actual, fill=FILL)
    report = compare_caches(expected, actual)
    if report:  # saves the Case (the classifier replays it) and prints the replay command
        fail(impl, f"differs from the reference over all {case.input_dtype} patterns (k in order, v permuted by "
                   f"{PERMUTE}), recipe {case.recipe}, k_scale {case.k_scale}, v_scale {case.v_scale}:",
             report, case, fill=FILL)


@pytest.mark.parametrize("scales", CPU_SCALES.values(), ids=CPU_SCALES.keys())
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_all_patterns(dtype: str, recipe: str, scales: tuple[Scale, Scale], impl, device):
    check_patterns(pattern_case(dtype, *scales, recipe), impl, device)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_all_patterns_at_scale_ties(dtype: str, recipe: str, impl, device):
    """Every pattern at a k and a v scale that are exact ties of the input dtype (SCALE_TIES)."""
    if recipe not in scale_tie_recipes():
        pytest.skip("the recipe reads the scale as fp32: a scale that is a tie of the input dtype is an ordinary one")
    check_patterns(pattern_case(dtype, *SCALE_TIES[dtype], recipe), impl, device)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_all_patterns_every_scale(dtype: str, recipe: str, impl, device):
    """The full product on CUDA; appends its timing to $OUT (or reports/)/exhaustive_cuda.csv."""
    if not CUDA or device.type != "cuda":
        pytest.skip("CUDA only: the full product is ~800 kernel calls, minutes under the interpreter; "
                    "no CUDA device here (test_all_patterns runs a subset)")
    start = time.perf_counter()
    for scale in CUDA_SCALES:
        check_patterns(pattern_case(dtype, scale, scale, recipe), impl, device)
    seconds = time.perf_counter() - start
    folder = Path(os.environ.get("OUT") or "reports")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "exhaustive_cuda.csv", "a", newline="") as f:
        csv.writer(f).writerow([impl.name, dtype, recipe, len(CUDA_SCALES), f"{seconds:.3f}",
                                torch.__version__, torch.cuda.get_device_name()])
    print(f"exhaustive {impl.name} {dtype} {recipe}: {len(CUDA_SCALES)} scales x 65,536 patterns "
          f"x k,v bit-exact in {seconds:.2f} s")
