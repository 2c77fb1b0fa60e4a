"""Suite throughput on the core property: bit-exact examples per second, after warm-up.

Draws N Cases from the same strategy the bit-exact property uses (derandomized), runs each through
check_case twice: the first pass compiles every kernel variant the Cases need, the second is timed.
Prints examples/s for both passes and the number of kernel variants compiled.

    python -m tools.throughput [-n 300] [--encoder hardware|software] [--size large|small] [--profile]

`--profile` times a third pass under torch.profiler (host ops, and device kernels on CUDA) and
cProfile, and prints where an example's time goes: the top ops by own host time, the device's busy
time against the wall clock, check_case's phases (build, copy, reference, implementation, compare:
host time, launches, copies and syncs of each), and the top Python functions.
"""

from __future__ import annotations

import io
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from hypothesis import HealthCheck, given, settings
from torch.profiler import ProfilerActivity, record_function
from torch.profiler import profile as torch_profile

from conformance import harness
from conformance.harness import check_case
from conformance.impls import Implementation, test_device
from conformance.stats import compiled_variants
from kernel import RECIPES, fused_fp8_set_kv_buffer
from strategies import Case, cases
from strategies.build import Built
from tools._cli import ENCODERS, cprofile_markdown, parser


def draw_cases(n: int, size: str, recipes: tuple[str, ...] = tuple(RECIPES)) -> list[Case]:
    """n Cases of the bit-exact property's strategy, the same every run (derandomized), spread over
    `recipes` (default: every recipe)."""
    drawn: list[Case] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(cases(recipes=recipes, size=size, allow_out_of_range=True))
    def collect(case: Case) -> None:
        drawn.append(case)

    collect()
    return drawn[:n]


def run_pass(drawn: list[Case], impl: Implementation, device: torch.device) -> float:
    started = time.perf_counter()
    for case in drawn:
        check_case(case, impl, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def profile_pass(drawn: list[Case], impl: Implementation, device: torch.device, top: int = 20) -> str:
    """Where a warm pass's time goes: torch.profiler's top ops and device time, check_case's phases,
    then cProfile's top."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof, phases_labelled():
        wall = run_pass(drawn, impl, device)
    n = len(drawn)
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    host_ops = sorted((e for e in events if e.key.startswith(("aten::", "cuda", "triton"))),
                      key=lambda e: e.self_cpu_time_total, reverse=True)
    out = io.StringIO()
    out.write(f"\n### torch.profiler, {n} examples ({wall / n * 1e3:.2f} ms an example under the profiler)\n\n"
              f"device busy {device_us / n:.0f} us an example; aten ops "
              f"{sum(e.count for e in events if e.key.startswith('aten::')) / n:.0f} an example\n\n"
              "| op | calls an example | own host us an example | device us an example |\n|---|---|---|---|\n")
    for e in host_ops[:top]:
        out.write(f"| {e.key} | {e.count / n:.1f} | {e.self_cpu_time_total / n:.1f} | "
                  f"{e.device_time_total / n:.1f} |\n")
    out.write(phase_table(prof.events(), n))
    out.write(cprofile_markdown(f"cProfile, {n} examples", lambda: run_pass(drawn, impl, device), top))
    return out.getvalue()


#: check_case's phases: the harness function or Built method each one is, and its profiler label
PHASES = {"build": (harness, "build"), "copy": (Built, "copy"), "reference": (harness, "run_reference"),
          "implementation": (harness, "run_impl"), "compare": (harness, "compare_caches")}


def _labelled(fn: Callable, label: str) -> Callable:
    def labelled(*args: object, **kwargs: object) -> object:
        with record_function(label):
            return fn(*args, **kwargs)
    return labelled


@contextmanager
def phases_labelled() -> Iterator[None]:
    """Label check_case's phases for torch.profiler, for the profiled pass only (a label costs
    microseconds, so the suite's own check_case carries none)."""
    saved = {phase: getattr(owner, name) for phase, (owner, name) in PHASES.items()}
    try:
        for phase, (owner, name) in PHASES.items():
            setattr(owner, name, _labelled(saved[phase], f"check_case: {phase}"))
        yield
    finally:
        for phase, (owner, name) in PHASES.items():
            setattr(owner, name, saved[phase])


def phase_table(events: list, n: int) -> str:
    """check_case's phases (PHASES) per example: host time, kernel launches, copies, syncs."""
    labels = [f"check_case: {phase}" for phase in PHASES]
    host: dict[str, float] = dict.fromkeys(labels, 0.0)
    counts: dict[str, Counter] = {label: Counter() for label in labels}
    for e in events:
        phase = e
        while phase is not None and phase.name not in host:
            phase = phase.cpu_parent
        if phase is None:
            continue
        if e is phase:
            host[phase.name] += e.cpu_time_total
        for kind, prefixes in (("launches", ("cudaLaunchKernel", "cuLaunchKernel")),
                               ("copies", ("cudaMemcpy",)), ("syncs", ("cudaStreamSynchronize",))):
            counts[phase.name][kind] += e.name.startswith(prefixes)
    rows = "".join(f"| {p.split(': ')[1]} | {host[p] / n:.0f} | {counts[p]['launches'] / n:.1f} | "
                   f"{counts[p]['copies'] / n:.1f} | {counts[p]['syncs'] / n:.1f} |\n" for p in labels)
    return (f"\n### check_case's phases, {n} examples (under torch.profiler)\n\n"
            "| phase | host us an example | launches | copies | syncs |\n|---|---|---|---|---|\n" + rows)


def main(argv: list[str] | None = None) -> int:
    p = parser("throughput", __doc__)
    p.add_argument("--examples", "-n", dest="examples", type=int, default=300,
                   help="cases to draw (default 300; -n is a deprecated alias)")
    p.add_argument("--encoder", default=None, choices=ENCODERS)
    p.add_argument("--size", default=None, choices=("small", "large"))
    p.add_argument("--profile", action="store_true", help="then profile a third pass (torch.profiler, cProfile)")
    args = p.parse_args(argv)
    device = test_device()
    size = args.size or ("large" if device.type == "cuda" else "small")
    drawn = draw_cases(args.examples, size)
    impl = Implementation(f"fused-{args.encoder or 'auto'}", fused_fp8_set_kv_buffer,
                          {"encoder": args.encoder} if args.encoder else {})
    cold = run_pass(drawn, impl, device)
    warm = run_pass(drawn, impl, device)
    print(f"bit-exact throughput on {device} ({impl.name}, size={size}): {len(drawn)} cases; "
          f"first pass {len(drawn) / cold:.1f} examples/s (compiling), "
          f"after warm-up {len(drawn) / warm:.1f} examples/s; kernel variants: {compiled_variants()}")
    if args.profile:
        print(profile_pass(drawn, impl, device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
