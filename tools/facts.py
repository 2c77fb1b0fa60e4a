"""Measure the facts the specification rests on (docs/facts.md), on this machine.

    python -m tools.facts [--out FILE] [--only div,cast,nan,triton,e5m2,fnuz] [--device cpu|cuda]
                          [--scale 0.3] [--values N]

Every row is measured here: the torch or Triton operation is run and compared with explicit IEEE
formulas, rounded by `kernel.reference`'s exact round-to-nearest-even (float64 arithmetic on
representable values, `torch.round`). Nothing is compared with a remembered answer. Counts of
differing values treat any two NaNs as equal; bytes and bit patterns are printed as they came out.
- div: `x.div_(s)` with s a Python float, a 0-d and a 1-element fp32 tensor (and, on CUDA, a 0-d
  CPU tensor), over all 65,536 bf16 and fp16 patterns: which formula it matches, and how many
  results differ from each of x_f32 * (1/s), x_f32 / s and x_f32 / fp32(in(s)).
- cast: `.to(torch.float8_e4m3fn)` of fp32 values at and past e4m3's range, ±inf and ±NaN (bytes).
- nan: the fp32 -> bf16 cast of NaNs (bits), and a bf16 -NaN cast to e4m3 (byte).
- e5m2: `.to(torch.float8_e5m2)` of fp32 values at e5m2's edges (57344, the 61440 tie, ±inf, ±NaN,
  subnormals and the tie below 2**-16), and of every bf16 and fp16 pattern (widened to fp32, and
  directly) against the reference's RNE onto e5m2 with the non-saturating rule (overflow to ±inf).
- fnuz: `.to(torch.float8_e4m3fnuz)` of fp32 values at e4m3fnuz's edges (240, the 248 tie, 256, ±inf,
  ±NaN, -0, subnormals 2**-10 and the ties below and between them), and of every bf16 and fp16 pattern
  (widened to fp32, and directly) and every fp32 midpoint of neighbouring bf16 patterns against the
  reference's RNE onto e4m3fnuz with the non-saturating rule (NaN, 0x80, from 248), byte for byte.
- triton: only under Triton's interpreter (no CUDA, or TRITON_INTERPRET=1): its fp32 -> e4m3,
  bf16 and fp16 casts against RNE over fixed value sets, the documented example values, and
  whether tl.fma rounds once.
Markdown goes to stdout, and to --out when given. Device: CUDA when present, else the CPU.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Callable

import torch

import kernel  # noqa: F401  (picks the Triton interpreter when there is no CUDA, before triton loads)
from kernel.backend import interpreted
from kernel.recipe import get_recipe
from kernel.reference import (
    BF16,
    E4M3,
    E4M3FNUZ,
    E5M2,
    FP16,
    encode_e4m3,
    encode_fp8,
    round_to_grid,
    round_to_input_dtype,
)
from tools._cli import comma_list, parser

GROUPS = ("div", "cast", "nan", "triton", "e5m2", "fnuz")
DTYPES = {"bfloat16": (torch.bfloat16, BF16), "float16": (torch.float16, FP16)}
CAST_VALUES = ("448", "464", "465", "480", "500", "inf", "-inf", "nan", "-nan")
FP32_BITS = {"nan": 0x7FC00000, "-nan": 0xFFC00000, "nan(payload 1)": 0x7F800001, "-nan(payload 1)": 0xFF800001}
#: e5m2's edges: its largest finite value, between it and the 61440 tie, the tie, past it, the
#: smallest subnormal 2**-16, the tie 2**-17 below it, 3 * 2**-17 (a tie between two subnormals), -0.
E5M2_CAST_VALUES = ("57344", "59392", "61439", "61440", "65536", "inf", "-inf", "nan", "-nan",
                    "1.52587890625e-05", "7.62939453125e-06", "2.288818359375e-05", "-0.0")
#: e4m3fnuz's edges: its largest finite value 240, between it and the 248 tie, the tie, 256, the
#: infinities and NaNs, -0, the smallest subnormal 2**-10 and its negative, the tie 2**-11 below it (and
#: its negative, which rounds to a zero that has no sign here), 3 * 2**-11 (a tie between subnormals).
FNUZ_CAST_VALUES = ("240", "244", "247", "248", "256", "inf", "-inf", "nan", "-nan", "-0.0",
                    "0.0009765625", "-0.0009765625", "0.00048828125", "-0.00048828125", "0.00146484375")
E4M3_EXAMPLES = (1.953125, -0.4921875, 0.78125)
BF16_EXAMPLES = (1 + 2**-8 + 2**-20,)
HASH = 0x9E3779B1  # the fp32->bf16/fp16 value set: bits i * HASH mod 2**32 (non-finite dropped)

Row = tuple[str, str, str]  # (id, what, measured)


# ---- pure helpers (no device) -------------------------------------------------------------------

def fp32_from_bits(bits: list[int] | torch.Tensor) -> torch.Tensor:
    """fp32 values with the given 32-bit patterns (on the CPU)."""
    b = torch.as_tensor(bits, dtype=torch.int64)
    return (b - ((b >> 31) << 32)).to(torch.int32).view(torch.float32)  # unsigned -> two's complement


def fp32_value(text: str) -> torch.Tensor:
    """A one-element fp32 tensor: a number, or one of FP32_BITS's NaNs by its bits."""
    if text in FP32_BITS:
        return fp32_from_bits([FP32_BITS[text]])
    return torch.tensor([float(text)], dtype=torch.float32)


def bits(x: torch.Tensor) -> list[int]:
    """The unsigned bit patterns of a bf16/fp16/fp32/e4m3 tensor."""
    width = x.element_size() * 8
    ints = {8: torch.uint8, 16: torch.int16, 32: torch.int32}[width]
    return [v & ((1 << width) - 1) for v in x.cpu().reshape(-1).view(ints).to(torch.int64).tolist()]


def count_differences(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many elements differ in value or in the sign of zero; any two NaNs count as equal."""
    a, b = a.cpu().to(torch.float32), b.cpu().to(torch.float32)
    same = (a == b) & (torch.signbit(a) == torch.signbit(b)) | (torch.isnan(a) & torch.isnan(b))
    return int((~same).sum())


def all_patterns(dtype: torch.dtype) -> torch.Tensor:
    """Every 16-bit pattern as a tensor of `dtype` (bf16 or fp16), on the CPU."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)


def div_formulas(x: torch.Tensor, s: float, fmt) -> dict[str, torch.Tensor]:
    """The candidate meanings of x.div_(s), each rounded to x's format by the reference's RNE."""
    x32 = x.cpu().to(torch.float32)
    s32 = torch.tensor(s, dtype=torch.float32)
    return {
        "x*(1/s)": round_to_input_dtype(x32 * (1 / s32), fmt),
        "x/s": round_to_input_dtype(x32 / s32, fmt),
        "x/in(s)": round_to_input_dtype(x32 / round_to_input_dtype(s32, fmt), fmt),
    }


def hashed_fp32(n: int) -> torch.Tensor:
    """n fp32 values with bits i * HASH mod 2**32, i < n, non-finite ones dropped (CPU)."""
    x = fp32_from_bits((torch.arange(n, dtype=torch.int64) * HASH) % 2**32)
    return x[torch.isfinite(x)]


def e4m3_set() -> torch.Tensor:
    """Every finite bf16 pattern of magnitude <= 448, widened to fp32: in range, ties included."""
    x = all_patterns(torch.bfloat16).to(torch.float32)
    return x[torch.isfinite(x) & (x.abs() <= E4M3.max_finite)]


def rne_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Reference bytes: RNE onto e4m3, saturating (what a correct saturating cast gives)."""
    return encode_e4m3(x.cpu(), get_recipe("single"))


def rne_value(x: torch.Tensor, fmt) -> torch.Tensor:
    """Reference RNE of fp32 values onto fmt's grid (bf16/fp16), as fp32."""
    return round_to_input_dtype(x.cpu(), fmt)


# ---- the measurements -----------------------------------------------------------------------------

def measure_div(device: torch.device, scale: float) -> list[Row]:
    kinds: dict[str, Callable[[], float | torch.Tensor]] = {
        "Python float": lambda: scale,
        "0-d fp32 tensor": lambda: torch.tensor(scale, dtype=torch.float32, device=device),
        "1-element fp32 tensor": lambda: torch.tensor([scale], dtype=torch.float32, device=device),
    }
    if device.type != "cpu":
        kinds["0-d fp32 CPU tensor"] = lambda: torch.tensor(scale, dtype=torch.float32)
    rows = []
    for dname, (dtype, fmt) in DTYPES.items():
        x = all_patterns(dtype)
        formulas = div_formulas(x, scale, fmt)
        for kind, make in kinds.items():
            got = x.to(device, copy=True).div_(make())  # a copy: div_ writes in place
            diffs = {name: count_differences(got, want) for name, want in formulas.items()}
            matches = [name for name, d in diffs.items() if d == 0] or ["none"]
            detail = ", ".join(f"{name}: {d:,}" for name, d in diffs.items())
            rows.append((f"div/{dname}/{kind}",
                         f"`x.div_(s)`, x = all 65,536 {dname} patterns, s = {scale} as a {kind}",
                         f"matches {' = '.join(matches)}; values differing from {detail}"))
    return rows


def cast_bits(x: torch.Tensor, dtype: torch.dtype) -> str:
    """The bits `x.to(dtype)` gives for a one-element x, as a 0-d tensor and as 1,024 copies.

    They are measured apart because torch's CPU casts take a scalar path for the first and a
    vectorized one for the second, which need not agree."""
    digits = torch.empty((), dtype=dtype).element_size() * 2
    out = []
    for shape, xs in (("0-d", x.reshape(())), ("1-D x1024", x.reshape(1).expand(1024).contiguous())):
        got = ", ".join(f"0x{b:0{digits}X}" for b in sorted(set(bits(xs.to(dtype).reshape(-1)))))
        out.append(f"{shape}: {got}")
    return "; ".join(out)


def _cast_rows(prefix: str, values: tuple[str, ...], dtype: torch.dtype, device: torch.device) -> list[Row]:
    """One row a named fp32 value: its bits, and the bits of its cast to `dtype`."""
    rows = []
    for text in values:
        x = fp32_value(text).to(device)
        rows.append((f"{prefix}/{text}", f"fp32 {text} (0x{bits(x)[0]:08X}) `.to(torch.{str(dtype).split('.')[-1]})`",
                     cast_bits(x, dtype)))
    return rows


def measure_cast(device: torch.device) -> list[Row]:
    return _cast_rows("cast", CAST_VALUES, torch.float8_e4m3fn, device)


def measure_nan(device: torch.device) -> list[Row]:
    rows = _cast_rows("nan/bf16", FP32_BITS, torch.bfloat16, device)
    neg = torch.tensor([-0x40], dtype=torch.int16).view(torch.bfloat16).to(device)  # 0xFFC0
    rows.append(("nan/e4m3/bf16 -nan", f"bf16 -nan (0x{bits(neg)[0]:04X}) `.to(torch.float8_e4m3fn)`",
                 cast_bits(neg, torch.float8_e4m3fn)))
    return rows


def measure_e5m2(device: torch.device) -> list[Row]:
    rows = _cast_rows("e5m2", E5M2_CAST_VALUES, torch.float8_e5m2, device)
    for dname, (dtype, _) in DTYPES.items():
        x = all_patterns(dtype)
        ref = encode_fp8(x.to(torch.float32), get_recipe("unfused-nan"), E5M2).view(torch.float8_e5m2)
        widened = x.to(device).to(torch.float32).to(torch.float8_e5m2)
        direct = x.to(device).to(torch.float8_e5m2)
        neg_nan = int(((direct.cpu().view(torch.uint8) & 0x80) != 0)[torch.isnan(x)].sum())
        rows.append((f"e5m2/{dname}/all", f"all 65,536 {dname} patterns `.to(torch.float8_e5m2)`, via fp32 / "
                     f"directly, against RNE onto e5m2 with overflow to ±inf",
                     f"{count_differences(widened, ref):,} / {count_differences(direct, ref):,} differ "
                     f"(NaNs equal); {neg_nan:,} of {int(torch.isnan(x).sum()):,} NaNs give a negative NaN byte"))
    return rows


def measure_fnuz(device: torch.device) -> list[Row]:
    rows = _cast_rows("fnuz", FNUZ_CAST_VALUES, torch.float8_e4m3fnuz, device)
    rule = get_recipe("unfused-nan")
    for dname, (dtype, _) in DTYPES.items():
        x = all_patterns(dtype)
        x32 = x.to(torch.float32)
        mid = ((x32[:-1].double() + x32[1:].double()) / 2).float()  # exact in fp32: ties at every binade
        ref, ref_mid = encode_fp8(x32, rule, E4M3FNUZ), encode_fp8(mid, rule, E4M3FNUZ)
        widened = x.to(device).to(torch.float32).to(torch.float8_e4m3fnuz).view(torch.uint8).cpu()
        direct = x.to(device).to(torch.float8_e4m3fnuz).view(torch.uint8).cpu()
        mids = mid.to(device).to(torch.float8_e4m3fnuz).view(torch.uint8).cpu()
        nan = torch.isnan(x32)
        nan_bytes = sorted(set(direct[nan].tolist()))
        rows.append((f"fnuz/{dname}/all", f"all 65,536 {dname} patterns `.to(torch.float8_e4m3fnuz)`, via fp32 / "
                     f"directly, and the 65,535 fp32 midpoints of neighbours, against RNE onto e4m3fnuz with "
                     f"NaN (0x80) from 248, byte for byte",
                     f"{int((widened != ref).sum()):,} / {int((direct != ref).sum()):,} / "
                     f"{int((mids != ref_mid).sum()):,} bytes differ; the {int(nan.sum()):,} NaNs give "
                     f"{', '.join(f'0x{b:02X}' for b in nan_bytes)}"))
    return rows


def measure_triton(values: int) -> list[Row]:
    if not interpreted():
        return [("triton", "Triton interpreter casts", "not measured: Triton is compiled here "
                 "(run with TRITON_INTERPRET=1 to measure the interpreter)")]
    from conformance.interpreter_casts import interpreter_as_shipped
    from tools import _facts_triton as kt

    with interpreter_as_shipped():  # the suite gives a tested kernel faithful casts; the fact is Triton's own
        return _interpreter_rows(kt, values)


def _interpreter_rows(kt, values: int) -> list[Row]:
    rows = []
    x = e4m3_set()
    wrong = count_differences(kt.to_e4m3(x), rne_e4m3(x))
    rows.append(("triton/e4m3/count", f"interpreter fp32 -> e4m3 (`.to(tl.float8e4nv)`), the {x.numel():,} "
                 "finite bf16 patterns of magnitude <= 448, as fp32", f"{wrong:,} bytes differ from RNE"))
    ex = torch.tensor(E4M3_EXAMPLES, dtype=torch.float32)
    for v, got, want in zip(E4M3_EXAMPLES, kt.to_e4m3(ex).tolist(), rne_e4m3(ex).tolist()):
        rows.append((f"triton/e4m3/{v!r}", f"interpreter fp32 {v!r} -> e4m3",
                     f"0x{got:02X} ({_e4m3(got)!r}); RNE gives 0x{want:02X} ({_e4m3(want)!r})"))
    for name, fmt, cast in (("bf16", BF16, kt.to_bf16), ("fp16", FP16, kt.to_fp16)):
        xs = hashed_fp32(values)
        xs = xs[round_to_grid(xs, fmt).abs() <= fmt.max_finite]  # overflow is not the question here
        wrong = count_differences(cast(xs), rne_value(xs, fmt))
        rows.append((f"triton/{name}/count", f"interpreter fp32 -> {name}, {xs.numel():,} fp32 values "
                     f"(bits i * 0x{HASH:08X} mod 2**32, i < {values:,}; finite, in {name}'s range)",
                     f"{wrong:,} differ from RNE"))
    ex = torch.tensor(BF16_EXAMPLES, dtype=torch.float32)
    for v, got, want in zip(BF16_EXAMPLES, kt.to_bf16(ex).tolist(), rne_value(ex, BF16).tolist()):
        rows.append((f"triton/bf16/{v!r}", f"interpreter fp32 {v!r} -> bf16", f"{got!r}; RNE gives {want!r}"))
    once = torch.tensor((1 + 2.0**-12) ** 2 - 1, dtype=torch.float32).item()  # exact in float64, one rounding
    got = kt.fma_probe()
    rows.append(("triton/fma", "interpreter `tl.fma(1 + 2**-12, 1 + 2**-12, -1)`",
                 f"{got!r}; rounded once: {once!r} ({'once' if got == once else 'not once'})"))
    return rows


def _e4m3(byte: int) -> float:
    return torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item()


# ---- output ---------------------------------------------------------------------------------------

def header(device: torch.device) -> list[str]:
    import triton

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    triton_mode = "interpreter (TRITON_INTERPRET=1)" if interpreted() else "compiled"
    return [f"- date: {datetime.date.today().isoformat()}",
            f"- torch {torch.__version__}, triton {triton.__version__}, Python {sys.version.split()[0]}",
            f"- torch device: {device} ({name}); Triton: {triton_mode}"]


def render(device: torch.device, rows: list[Row]) -> str:
    lines = ["# Facts measured by `python -m tools.facts`", "", *header(device), "",
             "| id | what | measured |", "|---|---|---|"]
    lines += [f"| {i} | {what} | {measured} |" for i, what, measured in rows]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser("facts", __doc__)
    p.add_argument("--out", help="also write the markdown to this file")
    p.add_argument("--only", type=comma_list(GROUPS), default=GROUPS, help=f"comma-separated groups of {GROUPS}")
    p.add_argument("--device", help="torch device for div/cast/nan (default: cuda if present, else cpu)")
    p.add_argument("--scale", type=float, default=0.3, help="the div_ scale (default 0.3)")
    p.add_argument("--values", type=int, default=2**20,
                   help="hashed fp32 values for the interpreter's bf16/fp16 casts (default 2**20)")
    args = p.parse_args(argv)
    args.only = list(args.only)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows: list[Row] = []
    if "div" in args.only:
        rows += measure_div(device, args.scale)
    if "cast" in args.only:
        rows += measure_cast(device)
    if "nan" in args.only:
        rows += measure_nan(device)
    if "triton" in args.only:
        rows += measure_triton(args.values)
    if "e5m2" in args.only:
        rows += measure_e5m2(device)
    if "fnuz" in args.only:
        rows += measure_fnuz(device)
    text = render(device, rows)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
