"""Which recipe does an implementation compute? `python -m tools.identify [IMPL]` (or `make identify IMPL=...`).

Sweeps every bf16 and fp16 bit pattern (65,536 each) times a set of scales through the
implementation, and compares its bytes with the reference under every recipe. Prints the recipes it
matches; when none matches, how and where it deviates from the closest one. Exit status: 0 when a
recipe matches (or the one given with --expect), 1 otherwise, 2 on a usage error.

The scale set is chosen so that every pair of recipes differs somewhere in it: a non-dyadic scale
(0.3) separates the roundings, and the smallest fp32 subnormal (2**-149, whose reciprocal is inf)
separates multiply-by-reciprocal from division. The quick set (the default on the CPU, where a
65,536-element interpreted call costs about a second) keeps those; the full set (the default on
CUDA) adds powers of two, more non-dyadic, tiny and huge scales, and passes each as a Python float,
a 0-d tensor and a 1-element tensor (implementations built on `div_` differ between those).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections import Counter
from dataclasses import dataclass, field

import torch

import kernel  # noqa: F401  (picks the Triton interpreter when there is no CUDA, before triton loads)
from conformance.bytediff import decode_e4m3
from conformance.impls import ENCODERS, FUSED_SPEC, Implementation, from_spec, test_device
from kernel import RECIPES, naive_fp8_set_kv_buffer
from kernel.backend import describe

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
KINDS = ("float", "tensor0d", "tensor1")
# (kind, value): None for the overflow rules, 0.3 and 0.9 for the roundings (0.9 separates `single`
# from `divide` on 30 patterns a dtype, 0.3 on 2), 2**-149 for reciprocal versus division (only the
# zeros differ there: 0 * inf is NaN, 0 / 2**-149 is 0).
QUICK = (("none", 1.0), ("float", 0.3), ("float", 0.9), ("float", 2.0**-149))
FULL_SCALES = (1.0, 0.5, 2.0, 2.0**-6, 2.0**10,  # powers of two
               0.3, 0.9, 0.7, 1.7, 0.1,  # non-dyadic
               1e-30, 1e-38, 2.0**-149,  # tiny (1e-38 and 2**-149 are fp32 subnormals)
               1e30, 3e38)  # huge
SHAPE = (128, 4, 128)  # 65,536 elements: one bit pattern each; 8 interpreted programs per call


@dataclass(frozen=True)
class Point:
    """One sweep point: all 65,536 patterns of `dtype` with one scale argument."""

    dtype: str
    kind: str  # "none" or one of KINDS
    value: float

    def __str__(self) -> str:
        return f"{self.dtype} scale=None" if self.kind == "none" else \
            f"{self.dtype} scale={self.value!r} ({self.kind})"

    def arg(self, device: torch.device) -> float | torch.Tensor | None:
        if self.kind == "none":
            return None
        if self.kind == "float":
            return self.value
        return torch.full(() if self.kind == "tensor0d" else (1,), self.value, dtype=torch.float32,
                          device=device)


@dataclass
class Result:
    points: list[Point]
    diffs: dict[str, dict[Point, torch.Tensor]] = field(default_factory=dict)  # recipe -> point -> bad patterns
    actual: dict[Point, torch.Tensor] = field(default_factory=dict)
    expected: dict[str, dict[Point, torch.Tensor]] = field(default_factory=dict)
    errors: dict[Point, str] = field(default_factory=dict)

    def count(self, recipe: str, kind: str | None = None) -> int:
        return sum(v.numel() for p, v in self.diffs[recipe].items() if kind is None or p.kind in (kind, "none"))

    def matches(self, kind: str | None = None) -> list[str]:
        if self.errors:
            return []
        return [r for r in self.diffs if self.count(r, kind) == 0]

    def closest(self) -> str:
        return min(self.diffs, key=self.count)


def sweep_points(dtypes: list[str], full: bool, kinds: tuple[str, ...] = KINDS) -> list[Point]:
    """The quick set, or None plus every full scale in every kind, for each dtype."""
    if not full:
        return [Point(d, k, s) for d in dtypes for k, s in QUICK]
    return [p for d in dtypes
            for p in [Point(d, "none", 1.0)] + [Point(d, k, s) for s in FULL_SCALES for k in kinds]]


def _patterns(dtype: str, device: torch.device) -> torch.Tensor:
    bits = torch.arange(65536, dtype=torch.int32).to(torch.int16)  # wraps: 0x8000.. are the negatives
    return bits.view(DTYPES[dtype]).reshape(SHAPE).to(device)


def _call(fn, x: torch.Tensor, ks, vs, device: torch.device, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """One write of x as K (scale ks) and V (scale vs) to slot t = token t; returns both caches' bytes."""
    caches = [torch.zeros(SHAPE, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn) for _ in "kv"]
    loc = torch.arange(SHAPE[0], device=device)
    fn(x, x, caches[0], caches[1], loc, ks, vs, **kwargs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return tuple(c.view(torch.uint8).reshape(-1) for c in caches)


def _calls(points: list[Point]):
    """Pairs of points of one dtype: one call writes the first with K's scale, the second with V's."""
    for dtype in dict.fromkeys(p.dtype for p in points):
        group = [p for p in points if p.dtype == dtype]
        for i in range(0, len(group), 2):
            yield group[i], group[min(i + 1, len(group) - 1)]  # an odd point out is used twice


def identify(impl: Implementation, points: list[Point], device: torch.device) -> Result:
    """Run the sweep through impl and through the reference under every recipe."""
    res = Result(points, {r: {} for r in RECIPES}, {}, {r: {} for r in RECIPES})
    for pk, pv in _calls(points):
        x = _patterns(pk.dtype, device)
        ks, vs = pk.arg(device), pv.arg(device)
        try:
            got = _call(impl, x, ks, vs, device)
        except Exception as exc:  # an implementation's crash is a result of the sweep, not an abort
            res.errors[pk] = res.errors[pv] = f"{type(exc).__name__}: {exc}"
            continue
        res.actual[pk], res.actual[pv] = got[0].cpu(), got[1].cpu()
        for name in RECIPES:
            exp = _reference(pk, pv, name, str(device))
            for p, e, g in ((pk, exp[0], res.actual[pk]), (pv, exp[1], res.actual[pv])):
                res.expected[name][p] = e
                res.diffs[name][p] = (e != g).nonzero().flatten()
    return res


@functools.lru_cache(maxsize=256)
def _reference(pk: Point, pv: Point, recipe: str, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's bytes for one call (the same for every implementation: computed once)."""
    dev = torch.device(device)
    k, v = _call(naive_fp8_set_kv_buffer, _patterns(pk.dtype, dev), pk.arg(dev), pv.arg(dev), dev, recipe=recipe)
    return k.cpu(), v.cpu()


def _how(expected: int, actual: int) -> str:
    """A short name for the kind of a byte deviation."""
    nan_e, nan_a = expected & 0x7F == 0x7F, actual & 0x7F == 0x7F
    if nan_e or nan_a:
        return "NaN sign" if nan_e and nan_a else ("NaN expected" if nan_e else "NaN produced")
    if expected ^ actual == 0x80:
        return "sign"
    if expected & 0x80 == actual & 0x80 and abs((expected & 0x7F) - (actual & 0x7F)) == 1:
        return "one e4m3 step (rounding)"
    return "other value"


def report(res: Result, impl: Implementation, device: torch.device, examples: int, out=sys.stdout) -> None:
    kinds = sorted({p.kind for p in res.points} - {"none"}, key=KINDS.index)
    values = {k: frozenset(p.value for p in res.points if p.kind == k) for k in kinds}
    if len(set(values.values())) != 1:  # the quick set: one column, kinds are not comparable
        kinds = kinds[:1]
    dtypes = "/".join(dict.fromkeys(p.dtype for p in res.points))
    scales = ", ".join(dict.fromkeys(str(p).split(" ", 1)[1] for p in res.points))
    print(f"identify {impl.name} {impl.kwargs or ''} on {device} ({describe()})", file=out)
    print(f"sweep: every {dtypes} bit pattern x {scales}: {65536 * len(res.points):,} bytes", file=out)
    for p, err in res.errors.items():
        print(f"  the implementation raised on {p}: {err}", file=out)
    head = "".join(f"{k:>12}" for k in kinds) if len(kinds) > 1 else ""
    print(f"  {'recipe':<18}{'differing bytes':>16}{head}", file=out)
    for r in RECIPES:
        cols = "".join(f"{res.count(r, k):>12,}" for k in kinds) if len(kinds) > 1 else ""
        print(f"  {r:<18}{res.count(r):>16,}{cols}", file=out)
    matched = res.matches()
    if matched:
        print(f"RESULT: matches {', '.join(matched)}" +
              (" (indistinguishable on this sweep)" if len(matched) > 1 else ""), file=out)
        return
    per_kind = {k: res.matches(k) for k in kinds} if len(kinds) > 1 else {}
    for k, m in per_kind.items():
        if m:
            print(f"RESULT: with {k} scales (and None) it matches {', '.join(m)}", file=out)
    if res.errors:
        print("RESULT: the implementation raised; see above", file=out)
        return
    best = res.closest()
    bad = {p: v for p, v in res.diffs[best].items() if v.numel()}
    print(f"RESULT: matches no recipe; closest is {best} ({res.count(best):,} differing bytes)", file=out)
    hows: Counter[str] = Counter()
    for p, idx in bad.items():
        for i in idx.tolist():
            hows[_how(int(res.expected[best][p][i]), int(res.actual[p][i]))] += 1
    print("  how: " + ", ".join(f"{n:,} {h}" for h, n in hows.most_common()), file=out)
    print("  where: " + ", ".join(f"{p}: {v.numel():,}" for p, v in list(bad.items())[:8]) +
          (f", ... ({len(bad)} points)" if len(bad) > 8 else ""), file=out)
    shown = 0
    for p, idx in bad.items():
        for i in idx[:max(0, examples - shown)].tolist():
            x = torch.tensor([i], dtype=torch.int32).to(torch.int16).view(DTYPES[p.dtype]).item()
            e, a = int(res.expected[best][p][i]), int(res.actual[p][i])
            print(f"    {p}: input 0x{i:04X} ({x!r}) expected 0x{e:02X} ({decode_e4m3(e):g}) "
                  f"actual 0x{a:02X} ({decode_e4m3(a):g})", file=out)
            shown += 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.identify", description=__doc__.split("\n\n")[0])
    p.add_argument("impl", nargs="?", default=FUSED_SPEC,
                   help=f"module:function or path/to/file.py:function (default {FUSED_SPEC})")
    p.add_argument("--encoder", choices=ENCODERS, help="pass encoder=... (the fused kernel's e4m3 encoder)")
    p.add_argument("--impl-recipe", choices=sorted(RECIPES), help="pass recipe=... to the implementation")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="scales None, 0.3, 0.9 and 2**-149, as floats "
                                                           "(the default on the CPU)")
    mode.add_argument("--full", action="store_true", help="the full scale set, every scale kind (default on CUDA)")
    p.add_argument("--dtypes", default="bfloat16,float16", help="comma-separated (default bfloat16,float16)")
    p.add_argument("--kinds", help=f"with --full: comma-separated scale kinds among {','.join(KINDS)}")
    p.add_argument("--expect", choices=sorted(RECIPES), help="exit 0 only if this recipe matches")
    p.add_argument("--examples", type=int, default=8, help="deviating values to show (default 8)")
    p.add_argument("--device", choices=("cpu", "cuda"))
    args = p.parse_args(argv)

    device = torch.device(args.device) if args.device else test_device()
    full = args.full or (not args.quick and device.type == "cuda")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    kinds = tuple(k.strip() for k in args.kinds.split(",")) if args.kinds else KINDS
    bad = [x for x in dtypes if x not in DTYPES] + [k for k in kinds if k not in KINDS]
    if bad:
        p.error(f"unknown dtype or scale kind: {bad}")
    kwargs = {k: v for k, v in (("encoder", args.encoder), ("recipe", args.impl_recipe)) if v}
    try:
        impl = from_spec(args.impl, kwargs)
    except (ValueError, ImportError, OSError) as exc:
        print(f"tools.identify: {exc}", file=sys.stderr)
        return 2
    res = identify(impl, sweep_points(dtypes, full, kinds), device)
    report(res, impl, device, args.examples)
    matched = res.matches()
    return 0 if (args.expect in matched if args.expect else bool(matched)) else 1


if __name__ == "__main__":
    sys.exit(main())
