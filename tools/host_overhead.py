"""Host time per eager call: the fused write beside the launches it competes with, and a profile.

CUDA only. At a decode shape (default T = 1, 8x128, bf16, fp8 cache, page 16) it times back-to-back
eager calls, wall clock per call (median of 7 batches, synchronized before and after each batch),
for the anchors and for this kernel:
- anchors: `copy_` of the call's input bytes; an empty Triton kernel (one pointer argument);
  the unfused torch path (`k / s`, `.to(float8_e4m3fn)`, `index_put_`, for K and V);
- ours: the eager call with float / 0-d tensor / no scales; the slow path alone (`make_plan` and
  `fused.launch`, which a call takes the first time it sees a layout); the custom op;
- the fast path's overlap check alone (kernel.dispatch.reads_disjoint), per call.
`--profile` adds cProfile's top functions for the fast and the slow path. The table goes to stdout
and to host-overhead.md in $OUT (else reports/).
"""

from __future__ import annotations

import io
import statistics
import sys
import time
from collections.abc import Callable

from tools._cli import cprofile_markdown, cuda_missing, out_dir, parser

BATCHES = 7


def per_call_us(torch, fn: Callable[[], None], calls: int) -> float:
    """Median over BATCHES batches of `calls` back-to-back calls, wall clock per call."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(BATCHES):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def measure(tokens: int = 1, heads: int = 8, dim: int = 128, calls: int = 2000) -> list[tuple[str, float]]:
    """(what, µs per call) for the anchors and the fused call; see the module docstring."""
    import torch
    import triton
    import triton.language as tl

    import kernel
    from kernel import dispatch, fused, plan

    @triton.jit
    def empty(x_ptr):
        tl.program_id(0)

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    k = torch.randn(tokens, heads, dim, device=dev, generator=g).to(torch.bfloat16)
    v = torch.randn(tokens, heads, dim, device=dev, generator=g).to(torch.bfloat16)
    pages = 1024
    kc = torch.zeros(pages, 16, heads, dim, device=dev, dtype=torch.float8_e4m3fn)
    vc = torch.zeros_like(kc)
    loc = torch.randperm(pages * 16, device=dev, generator=g)[:tokens]
    s_tensor = torch.tensor(0.7, device=dev)
    src = k.reshape(-1).view(torch.uint8).clone()
    dst = torch.empty_like(src)

    def unfused() -> None:
        for x, cache in ((k, kc), (v, vc)):
            q = (x / s_tensor).to(torch.float8_e4m3fn)
            cache.view(-1, heads, dim).index_put_((loc,), q)

    def call(scale: object) -> Callable[[], None]:
        return lambda: kernel.fused_fp8_set_kv_buffer(k, v, kc, vc, loc, scale, scale, 16)

    def op(scale: object) -> Callable[[], None]:
        return lambda: kernel.fused_fp8_set_kv_buffer_op(k, v, kc, vc, loc, scale, scale, 16)

    p = plan.make_plan(k, v, kc, vc, loc, 0.7, 0.7, 16, recipe=kernel.DEFAULT_RECIPE)
    key = dispatch.call_key(k, v, kc, vc, loc, 0.7, 0.7, 16, kernel.DEFAULT_RECIPE, None)
    call(0.7)()
    entry = dispatch._ENTRIES[key]
    a = (kc.data_ptr(), vc.data_ptr(), k.data_ptr(), v.data_ptr(), loc.data_ptr())
    read = [(a[2], entry.extents[2]), (a[3], entry.extents[3]), (a[4], entry.extents[4])]
    rows = [
        ("anchor: torch copy_ (input bytes)", per_call_us(torch, lambda: dst.copy_(src), calls)),
        ("anchor: empty Triton kernel", per_call_us(torch, lambda: empty[(1,)](src), calls)),
        ("anchor: unfused torch (k / s, .to(fp8), index_put_)", per_call_us(torch, unfused, calls)),
        ("ours: fused_fp8_set_kv_buffer, float scales", per_call_us(torch, call(0.7), calls)),
        ("ours: fused_fp8_set_kv_buffer, 0-d tensor scales", per_call_us(torch, call(s_tensor), calls)),
        ("ours: fused_fp8_set_kv_buffer, no scales", per_call_us(torch, call(None), calls)),
        ("ours: custom op, float scales", per_call_us(torch, op(0.7), calls)),
        ("ours: custom op, 0-d tensor scales", per_call_us(torch, op(s_tensor), calls)),
        ("ours: overlap check of the fast path alone",
         per_call_us(torch, lambda: dispatch.reads_disjoint(a[0], a[1], entry, read), calls)),
        ("ours, slow path: make_plan alone",
         per_call_us(torch, lambda: plan.make_plan(k, v, kc, vc, loc, 0.7, 0.7, 16,
                                                   recipe=kernel.DEFAULT_RECIPE), calls)),
        ("ours, slow path: fused.launch(plan) alone (Triton's JIT launch)",
         per_call_us(torch, lambda: fused.launch(p), calls)),
    ]
    return rows


def profile(calls: int = 2000, top: int = 18) -> str:
    """cProfile's top functions (by own time) over `calls` fast-path calls and `calls` slow-path calls."""
    import torch

    import kernel
    from kernel import fused, plan

    dev = torch.device("cuda")
    k = torch.randn(1, 8, 128, device=dev).to(torch.bfloat16)
    kc = torch.zeros(64, 16, 8, 128, device=dev, dtype=torch.float8_e4m3fn)
    vc, loc = torch.zeros_like(kc), torch.arange(1, device=dev)
    out = io.StringIO()
    slow = lambda: fused.launch(plan.make_plan(k, k, kc, vc, loc, 0.7, 0.7, 16, recipe=kernel.DEFAULT_RECIPE))
    for name, fn in (("fast path (a layout seen before)", lambda: kernel.fused_fp8_set_kv_buffer(
            k, k, kc, vc, loc, 0.7, 0.7, 16)), ("slow path (make_plan + Triton's JIT launch)", slow)):
        fn()
        torch.cuda.synchronize()
        def repeat(fn=fn) -> None:
            for _ in range(calls):
                fn()

        out.write(cprofile_markdown(f"{name}, {calls} calls", repeat, top))
        torch.cuda.synchronize()
    return out.getvalue()


def markdown(rows: list[tuple[str, float]], tokens: int, heads: int, dim: int) -> str:
    import torch
    import triton

    lines = [f"Host time per eager call, T = {tokens}, {heads}x{dim}, bf16 ({torch.cuda.get_device_name()}, "
             f"torch {torch.__version__}, triton {triton.__version__}):", "",
             "| call | µs per call |", "|---|---|"] + [f"| {name} | {us:.1f} |" for name, us in rows]
    from kernel import dispatch
    lines += ["", f"The fast path was {'used' if dispatch._enabled else 'DISABLED (its launcher call failed)'}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = parser("host_overhead", __doc__)
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--calls", type=int, default=2000, help="calls a batch")
    p.add_argument("--profile", action="store_true", help="add cProfile's top functions")
    args = p.parse_args(argv)
    if cuda_missing("tools.host_overhead", "it times compiled launches"):
        return 2
    text = markdown(measure(args.tokens, args.heads, args.dim, args.calls), args.tokens, args.heads, args.dim)
    if args.profile:
        text += profile(args.calls)
    print(text)
    (out_dir() / "host-overhead.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
