"""Compile the Triton kernels for a Hopper GPU (sm_90) without one, and count their SASS instructions.

    TRITON_INTERPRET=0 python -m tools.compile_sm90 [--only NAME,...] [--sass DIR]

The CPU suite runs the kernels under Triton's interpreter, which accepts code the compiler refuses (a global
that is not a `tl.constexpr`, say). This compiles each kernel, without running it, with `triton.compile` and
the ptxas that Triton bundles, in the constexpr combinations the wrappers launch (bf16 inputs, T = 32768-like
tiles), and prints each one's registers and SASS instruction counts (all, global loads and stores, shared
memory, barriers, calls): a GPU-free proxy for changes that add or remove work. `--sass DIR` writes each
disassembly there. Needs TRITON_INTERPRET=0 (the kernels must import as compiled functions) and Triton's
NVIDIA backend; meta_tests/test_compile_sm90.py runs it on the CPU.
"""

from __future__ import annotations

import collections
import inspect
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tools._cli import comma_list, parser

_PTH_CONSTS = dict(SOFTWARE=False, EXACT_FMA=True, VEC=8, X_ALIGN=16, WORDS=0, BLOCK_T=2, BLOCK_H=8,
                   BLOCK_D=128)
_PT_CONSTS = dict(MUL_RECIPROCAL=False, SCALE_IN_INPUT=False, INTERMEDIATE=False, SATURATE=True, EXACT_FMA=True,
                  BLOCK_T=4, BLOCK_H=1, BLOCK_D=512)
#: name -> (kernel, constexprs beyond the defaults above)
VARIANTS: dict[str, tuple[str, dict]] = {
    "per-tensor": ("per-tensor", dict(SOFTWARE=False, VEC=True, PER_HEAD=False, E5M2=False, FNUZ=False)),
    "per-tensor-software-strided": ("per-tensor", dict(SOFTWARE=True, VEC=False, PER_HEAD=False, E5M2=False,
                                                       FNUZ=False)),
    "per-head": ("per-tensor", dict(SOFTWARE=False, VEC=True, PER_HEAD=True, E5M2=False, FNUZ=False)),
    "per-head-software": ("per-tensor", dict(SOFTWARE=True, VEC=True, PER_HEAD=True, E5M2=False, FNUZ=False)),
    "e5m2": ("per-tensor", dict(SOFTWARE=False, VEC=True, PER_HEAD=False, E5M2=True, FNUZ=False)),
    "fnuz": ("per-tensor", dict(SOFTWARE=True, VEC=True, PER_HEAD=False, E5M2=False, FNUZ=True)),
    "pth-inline-vllm": ("per-token-head", dict(VLLM=True, INLINE=True, C_ALIGN=4)),
    "pth-inline-vllm-4x256-words": ("per-token-head", dict(VLLM=True, INLINE=True, C_ALIGN=4, WORDS=32, BLOCK_H=4,
                                                          BLOCK_D=256)),
    "pth-inline-vllm-software-words": ("per-token-head", dict(VLLM=True, INLINE=True, C_ALIGN=4, WORDS=16,
                                                             SOFTWARE=True)),
    "pth-separate-vllm": ("per-token-head", dict(VLLM=True, INLINE=False, C_ALIGN=16)),
    "pth-inline-flashinfer": ("per-token-head", dict(VLLM=False, INLINE=True, C_ALIGN=4)),
    "pth-separate-flashinfer": ("per-token-head", dict(VLLM=False, INLINE=False, C_ALIGN=16)),
}
COUNTED = ("LDG", "STG", "STS", "LDS", "BAR", "SHFL", "CALL")


def _kernel(kind: str, extra: dict) -> tuple[object, dict, dict]:
    """(jit function, constexprs, pointer types) of one variant."""
    from kernel import per_token_head_kernel as pth
    from kernel import triton_kernel as tk
    from kernel.per_token_head import FLOOR_FLASHINFER, FLOOR_VLLM, NAN_SCALE_BITS, fp32_bits
    pointers = {"k_ptr": "*bf16", "v_ptr": "*bf16", "kc_ptr": "*u8", "vc_ptr": "*u8", "loc_ptr": "*i64"}
    if kind == "per-tensor":
        return tk.fp8_kv_write, {**_PT_CONSTS, **extra}, pointers
    scales = "*i64" if extra["INLINE"] else "*fp32"  # inline: cache_loc stands in for the unused scale caches
    consts = dict(_PTH_CONSTS, FLOOR_V=fp32_bits(FLOOR_VLLM), FLOOR_F=fp32_bits(FLOOR_FLASHINFER),
                  NAN_BITS=NAN_SCALE_BITS, **extra)
    return pth.per_token_head_write, consts, {**pointers, "ks_ptr": scales, "vs_ptr": scales}


def compile_variant(name: str) -> object:
    """Triton's compiled kernel of VARIANTS[name] for sm_90 (4 warps, 32-bit integer arguments)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    fn, consts, pointers = _kernel(*VARIANTS[name])
    names = list(inspect.signature(fn.fn).parameters)
    signature = {n: pointers.get(n) or ("constexpr" if n in consts else "fp32" if n.endswith("_value") else "i32")
                 for n in names}
    return triton.compile(ASTSource(fn, signature, consts), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4})


def cuobjdump(compiled: object, option: str) -> str:
    """`cuobjdump OPTION` of a compiled kernel's cubin, by the cuobjdump that Triton bundles."""
    import triton
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([str(tool), option, f.name], capture_output=True, text=True, check=True).stdout


def registers(compiled: object) -> int:
    """Registers a thread (ptxas's count, from the cubin's resource usage)."""
    m = re.search(r"REG:(\d+)", cuobjdump(compiled, "--dump-resource-usage"))
    return int(m.group(1)) if m else -1


def opcode_counts(text: str) -> collections.Counter:
    """SASS opcode (before its first '.') -> instructions, predicated ones included."""
    counts: collections.Counter = collections.Counter()
    for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", text):
        counts[m.group(1)] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    p = parser("compile_sm90", __doc__)
    p.add_argument("--only", type=comma_list(VARIANTS), default=",".join(VARIANTS))
    p.add_argument("--sass", type=Path, default=None, help="write each variant's disassembly to DIR/NAME.sass")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("python -m tools.compile_sm90: run with TRITON_INTERPRET=0 (the interpreter's kernels do not "
              "compile)", file=sys.stderr)
        return 2
    print(f"{'variant':<30}{'regs':>5}{'SASS':>6}" + "".join(f"{c:>6}" for c in COUNTED))
    for name in args.only:
        compiled = compile_variant(name)
        text = cuobjdump(compiled, "-sass")
        if args.sass:
            args.sass.mkdir(parents=True, exist_ok=True)
            (args.sass / f"{name}.sass").write_text(text)
        ops = opcode_counts(text)
        print(f"{name:<30}{registers(compiled):>5}{sum(ops.values()):>6}"
              + "".join(f"{ops[c]:>6}" for c in COUNTED), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
