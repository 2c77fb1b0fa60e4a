"""A fused call to profile: `ncu --kernel-name fp8_kv_write --launch-skip 1 python -m tools.ncu_target ...`.

    python -m tools.ncu_target [--recipe unfused] [--encoder hardware] [--tokens 32768] [--heads-dims 8x128]
                               [--mode per-token-head-inline]

Builds one buffer set like `make bench` (bf16 input, scale 0.7, slots as `--locs` says; `--mode` one of the bench's
modes) and calls the fused write twice: the first call compiles, the second is the one to profile. The
per-token-head modes' kernel is `per_token_head_write`. CUDA only.
"""

from __future__ import annotations

import sys

from tools import _cli
from tools.bench import add_locs_argument


def main(argv: list[str] | None = None) -> int:
    p = _cli.parser("ncu_target", __doc__)
    p.add_argument("--recipe", default="unfused", choices=_cli.RECIPE_NAMES)
    p.add_argument("--encoder", default="hardware", choices=_cli.ENCODERS)
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--heads-dims", default="8x128")
    p.add_argument("--mode", default=None, help="a `make bench` mode (tools/bench.py MODES); default per-tensor")
    add_locs_argument(p)
    args = p.parse_args(argv)

    if _cli.cuda_missing("tools.ncu_target", "ncu profiles a compiled launch"):
        return 2
    import torch

    import kernel
    from tools.bench import MODES, PAGE_SIZE, buffer_sets

    if args.mode is not None and args.mode not in MODES:
        p.error(f"--mode: one of {', '.join(MODES)}, got {args.mode!r}")
    kind, cache_dtype, pth = MODES[args.mode] if args.mode else ("float", "fp8_e4m3", None)
    h, d = (int(n) for n in args.heads_dims.split("x"))
    s = buffer_sets(args.tokens, h, d, 1, scale_kind=kind, cache_dtype=cache_dtype, pth=pth, locs=args.locs)[0]
    extra = {n: s[n] for n in ("per_token_head", "k_scale_cache", "v_scale_cache") if n in s}
    for _ in range(2):
        kernel.fused_fp8_set_kv_buffer(s["k"], s["v"], s["k_cache"], s["v_cache"], s["cache_loc"], s["k_scale"],
                                       s["v_scale"], PAGE_SIZE, recipe=args.recipe, encoder=args.encoder, **extra)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
