"""Replay a saved failure case: `python -m tools.repro failures/<file>.json` (or `make repro CASE=...`).

Rebuilds the Case's exact tensors here (CUDA if present, else the CPU under Triton's interpreter),
runs the recorded implementation and the reference, and prints the same byte-diff report the
suite printed. Exit status: 0 when the bytes match, 1 on a mismatch or an implementation error,
2 on a usage error.

A file whose "fill" names how the Case's values were overwritten after they were built (the exhaustive
property's every bit pattern, conformance.artifacts.FILLS) is filled the same way here.

A case recorded on the hardware e4m3 encoder replays here on the software encoder when this
machine has no hardware cast (the CPU, or a GPU below sm_89), and says so: a pass then means the
defect is specific to the hardware cast.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import kernel  # noqa: F401  (picks the Triton interpreter when there is no CUDA, before triton loads)
from conformance.artifacts import fill_function, load_case
from conformance.bytediff import FIRST_N, compare_caches
from conformance.conventions import CONVENTIONS, get_convention
from conformance.harness import run_impl, run_reference
from conformance.impls import FUSED_SPEC, Implementation, from_spec, test_device
from kernel.backend import describe, hardware_cast_available
from strategies.build import build
from strategies.case import Case
from tools._cli import ENCODERS, RECIPE_NAMES, parser

HW_NOTE = ("note: this case failed on the hardware e4m3 encoder ({where}); this machine has no hardware "
           "cast, so it replays on the software encoder.")


def _parser() -> argparse.ArgumentParser:
    p = parser("repro", __doc__)
    p.add_argument("case", help="a failure file written by the suite (or a bare Case JSON)")
    p.add_argument("--impl", help="module:function or path/to/file.py:function to run instead of the "
                                  "recorded implementation")
    p.add_argument("--encoder", choices=ENCODERS, help="the fused kernel's e4m3 encoder (default: as recorded, "
                                                       "or software where the hardware cast is missing)")
    p.add_argument("--recipe", choices=RECIPE_NAMES, help="hold the implementation to this recipe instead")
    p.add_argument("--convention", choices=sorted(CONVENTIONS),
                   help="how to call it (default: as recorded, else detected from its signature)")
    p.add_argument("-n", "--mismatches", dest="n", type=int, default=FIRST_N, metavar="N",
                   help=f"mismatches to show (default {FIRST_N})")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if present, else cpu")
    return p


def _load_recorded(impl: dict[str, Any], kwargs: dict[str, Any], convention: str | None) -> Implementation:
    """The recorded implementation: its absolute spec, else the spec as typed (run from the repo root)."""
    tried = []
    convention = convention or impl.get("convention")
    for spec in dict.fromkeys((impl.get("spec"), impl.get("name"))):
        if not spec:
            continue
        try:
            loaded = from_spec(spec, kwargs, get_convention(convention) if convention else None)
            return dataclasses.replace(loaded, name=impl.get("name") or loaded.name)
        except (ValueError, ImportError, OSError) as exc:
            tried.append(f"{spec}: {exc}")
    raise ValueError("cannot load the recorded implementation (pass --impl):\n  " + "\n  ".join(tried))


def choose_impl(record: dict[str, Any], args: argparse.Namespace, device) -> tuple[Implementation, list[str]]:
    """The implementation to replay with, and notes on how it differs from the recorded one."""
    recorded = record.get("impl") or {"name": "fused", "spec": FUSED_SPEC, "kwargs": {}}
    kwargs = dict(recorded.get("kwargs") or {})
    notes: list[str] = []
    if args.encoder:
        kwargs["encoder"] = args.encoder
    elif kwargs.get("encoder") == "hardware" and not hardware_cast_available(device):
        where = record.get("environment", {}).get("gpu", "a GPU")
        notes.append(HW_NOTE.format(where=where))
        kwargs["encoder"] = "software"
    if kwargs.get("encoder") == "hardware" and not hardware_cast_available(device):
        raise ValueError("--encoder hardware needs compiled CUDA on sm_89 or newer; this machine has none")
    if args.impl:
        convention = get_convention(args.convention) if args.convention else None
        return from_spec(args.impl, kwargs if args.encoder else {}, convention), notes
    return _load_recorded(recorded, kwargs, args.convention), notes


def summary(case: Case) -> str:
    def scale(s) -> str:
        return "None" if s.kind == "none" else f"{s.kind}({s.value!r})"
    return (f"T={case.num_tokens} H={case.num_heads} D={case.head_dim} page_size={case.page_size} "
            f"pages={case.num_pages} {case.input_dtype}->{case.cache_dtype} loc={case.loc_dtype} "
            f"ranks in/cache={case.input_rank}/{case.cache_rank} k_scale={scale(case.k_scale)} "
            f"v_scale={scale(case.v_scale)} seed={case.seed} overrides={len(case.overrides)} "
            f"recipe={case.recipe} checked={case.checked}")


def replay_per_token_head(record: dict[str, Any], impl: Implementation, device, out) -> int:
    """A per-token-head failure file: rebuild its PTHCase, write with the reference and the implementation,
    compare every whole buffer (caches and scale caches), located (conformance.pth_bytediff)."""
    from conformance.pth_bytediff import located_diff
    from strategies.per_token_head import PTHCase, build_pth
    pc = PTHCase.from_dict(record["pth_case"])
    print(f"pth      {pc.mode}, {pc.layout} scales, special heads {[list(h) for h in pc.heads]}", file=out)
    expected, actual = build_pth(pc, device), build_pth(pc, device)
    kernel.naive_fp8_set_kv_buffer(**expected.call())
    try:
        impl.convention.invoke_per_token_head(impl.fn, actual.call(), impl.kwargs)
        report = located_diff(expected, actual)
    except Exception as exc:  # noqa: BLE001  (the implementation's error is the finding)
        report = f"raised {type(exc).__name__}: {exc}"
    if report is None:
        print("PASS: every whole buffer (caches, scale caches) is identical to the reference.", file=out)
        return 0
    print(f"FAIL: {impl.name} differs from the reference ({pc.mode}):", file=out)
    print(report, file=out)
    return 1


def replay(path: str, args: argparse.Namespace, out=sys.stdout) -> int:
    case, record = load_case(path)
    fill = fill_function(record.get("fill"))
    if args.recipe:
        case = case.replace(recipe=args.recipe)
    device = test_device() if args.device is None else __import__("torch").device(args.device)
    impl, notes = choose_impl(record, args, device)
    env = record.get("environment", {})
    print(f"case     {path}" + (f"  (test {record['test']})" if record.get("test") else ""), file=out)
    if env:
        print(f"recorded {env.get('backend')}; torch {env.get('torch')}, triton {env.get('triton')}, "
              f"hypothesis {env.get('hypothesis')}, gpu {env.get('gpu')}", file=out)
    print(f"here     {describe()}; device {device}", file=out)
    print(f"impl     {impl.name} {impl.kwargs or ''}".rstrip() + f" ({impl.convention.name} convention)", file=out)
    print(f"case     {summary(case)}", file=out)
    if fill is not None:
        print(f"fill     {record['fill']}: the built values are overwritten after the build, as the test did", file=out)
    for note in notes:
        print(note, file=out)

    if "pth_case" in record:
        return replay_per_token_head(record, impl, device, out)
    reason = impl.convention.why_not(case)
    if reason:
        raise ValueError(f"{reason}: this case cannot be replayed with it")
    expected = run_reference(case, device, fill(build(case, device)) if fill else None)
    actual, error = run_impl(case, impl, device, fill(build(case, device)) if fill else None)
    report = error or compare_caches(expected, actual, args.n)
    swapped = bool(notes)
    if report is None:
        print("PASS: both whole cache buffers are byte-identical to the reference.", file=out)
        if swapped:
            print("The recorded failure does not reproduce on the software encoder: the defect is specific "
                  "to the hardware cast. Replay it on an sm_89+ GPU (--encoder hardware).", file=out)
        elif record.get("report"):
            print("The recorded failure does not reproduce here.", file=out)
        return 0
    print(f"FAIL: {impl.name} differs from the reference (recipe {case.recipe}):", file=out)
    print(report, file=out)
    recorded = record.get("report")
    if recorded and not args.recipe and args.n == FIRST_N:
        same = "the same as" if recorded == report else "DIFFERENT from"
        print(f"This report is {same} the recorded one.", file=out)
    if swapped:
        print("It fails on the software encoder too, so it is not specific to the hardware cast.", file=out)
    return 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not Path(args.case).is_file():
        print(f"tools.repro: no such file {args.case}", file=sys.stderr)
        return 2
    try:
        return replay(args.case, args)
    except ValueError as exc:  # a bad --impl, --encoder or file: a usage error, not a mismatch
        print(f"tools.repro: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
