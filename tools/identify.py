"""Which recipe does an implementation compute? `python -m tools.identify [IMPL]` (or `make identify IMPL=...`).

Sweeps every bf16 and fp16 bit pattern times a set of scales through the implementation, in its own
calling convention (conformance.diagnosis.identification says which scales and why), and compares its bytes
with the reference under every recipe. Prints the recipes it matches; when none matches, how and
where it deviates from the closest one. Exit status: 0 when a recipe matches (or the one given with
--expect), 1 otherwise, 2 on a usage error.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter

import torch

import kernel  # noqa: F401  (picks the Triton interpreter when there is no CUDA, before triton loads)
from conformance.bytediff import decode_e4m3
from conformance.conventions import CONVENTIONS, get_convention
from conformance.diagnosis.identification import DTYPES, KINDS, Result, identify, residual, sweep_points
from conformance.impls import FUSED_SPEC, Implementation, from_spec, test_device
from kernel import RECIPES
from kernel.backend import describe
from kernel.recipe import PTH_RECIPES
from tools._cli import ENCODERS, RECIPE_NAMES, comma_list, parser


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
    print(f"identify {impl.name} {impl.kwargs or ''} ({impl.convention.name} convention) on {device} "
          f"({describe()})", file=out)
    print(f"sweep: every {dtypes} bit pattern x {scales}: {res.swept_bytes:,} bytes (K and V)", file=out)
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
    print(f"residual: {residual(res, best)}", file=out)
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
            x = torch.tensor([i % 65536], dtype=torch.int32).to(torch.int16).view(DTYPES[p.dtype]).item()
            e, a = int(res.expected[best][p][i]), int(res.actual[p][i])
            print(f"    {p}: {'KV'[i // 65536]} input 0x{i % 65536:04X} ({x!r}) "
                  f"expected 0x{e:02X} ({decode_e4m3(e):g}) actual 0x{a:02X} ({decode_e4m3(a):g})", file=out)
            shown += 1


def main(argv: list[str] | None = None) -> int:
    p = parser("identify", __doc__)
    p.add_argument("impl", nargs="?", default=FUSED_SPEC,
                   help=f"module:function or path/to/file.py:function (default {FUSED_SPEC})")
    p.add_argument("--encoder", choices=ENCODERS, help="pass encoder=... (the fused kernel's e4m3 encoder)")
    p.add_argument("--impl-recipe", choices=RECIPE_NAMES, help="pass recipe=... to the implementation "
                                                                   "(kvfp8 convention)")
    p.add_argument("--convention", choices=sorted(CONVENTIONS),
                   help="how to call it (default: detected from its signature)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="scales None, 0.3, 0.9 and 2**-149, as floats "
                                                           "(the default on the CPU)")
    mode.add_argument("--full", action="store_true", help="the full scale set, every scale kind (default on CUDA)")
    p.add_argument("--dtypes", type=comma_list(DTYPES), default="bfloat16,float16",
                   help="comma-separated (default bfloat16,float16)")
    p.add_argument("--kinds", type=comma_list(KINDS),
                   help=f"with --full: comma-separated scale kinds among {','.join(KINDS)}")
    p.add_argument("--expect", choices=[*RECIPE_NAMES, *sorted(PTH_RECIPES)],
                   help="exit 0 only if this recipe matches")
    p.add_argument("--examples", type=int, default=8, help="deviating values to show (default 8)")
    p.add_argument("--device", choices=("cpu", "cuda"))
    args = p.parse_args(argv)

    device = torch.device(args.device) if args.device else test_device()
    full = args.full or (not args.quick and device.type == "cuda")
    dtypes = list(args.dtypes)
    kinds = args.kinds or KINDS
    kwargs = {"encoder": args.encoder} if args.encoder else {}
    try:
        convention = get_convention(args.convention) if args.convention else None
        impl = from_spec(args.impl, kwargs, convention)
    except (ValueError, ImportError, OSError) as exc:
        print(f"tools.identify: {exc}", file=sys.stderr)
        return 2
    if args.impl_recipe:
        impl = dataclasses.replace(impl, recipe=args.impl_recipe)
    if not impl.convention.static:  # a dynamic per-(token, head) write: its own recipes, its own probe
        from conformance.diagnosis.pth_identification import identify_per_token_head
        held, note = identify_per_token_head(impl, device)
        print(f"identify {impl.spec or impl.name}  ({impl.convention.name} convention) on {device}\n{held}: {note}")
        return 0 if note.startswith("identified") and (args.expect in (None, held)) else 1
    res = identify(impl, sweep_points(dtypes, full, kinds, impl.convention), device)
    report(res, impl, device, args.examples)
    matched = res.matches()
    return 0 if (args.expect in matched if args.expect else bool(matched)) else 1


if __name__ == "__main__":
    sys.exit(main())
