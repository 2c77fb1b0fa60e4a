"""Reference fidelity: each recipe equals the torch (or Triton) op sequence it models, on the device
where it models it, over all 65,536 bf16 and fp16 bit patterns at several scales.

These compare the reference's `quantize` with torch itself (not with the fused kernel), so they
are cheap. The one exception to byte equality is documented in the README: every recipe maps
NaN to 0x7F whatever its sign, while torch's casts keep the sign (a -NaN can give 0xFF); a NaN
result must still be a NaN byte. Where torch's behaviour depends on its version the test probes
it and names the version in its skip reason.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from hypothesis import given

from conformance.bytediff import diff_buffers
from conformance.harness import run_reference
from kernel.plan import ScaleArg
from kernel.recipe import RECIPES, Recipe
from kernel.reference import E4M3FNUZ, E5M2, INPUT_FORMATS, encode_fp8, quantize, round_to_input_dtype
from strategies import Case, cases
from strategies.build import build

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
SCALES = (1.0, 0.3, 0.7, 2.0**-5, 17.3)
FP8 = torch.float8_e4m3fn
TORCH = torch.__version__
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="CUDA only: the recipe models a CUDA op sequence; "
                                "no CUDA device here")


def all_patterns(dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """Every 16-bit pattern, in order, as a tensor of `dtype`."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).to(device)


def fp32(value: float) -> float:
    return torch.tensor(value, dtype=torch.float32).item()


def _bytes(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8).cpu()


def assert_bytes_match(x: torch.Tensor, expected: torch.Tensor, actual: torch.Tensor, what: str) -> None:
    """Bytes equal, except that a NaN may keep its sign in torch (both must be NaN bytes then)."""
    expected, actual = expected.cpu(), actual.cpu()
    both_nan = ((expected & 0x7F) == 0x7F) & ((actual & 0x7F) == 0x7F)
    bad = ((expected != actual) & ~both_nan).nonzero().flatten()
    if bad.numel():
        bits = x.cpu().view(torch.int16).to(torch.int32) & 0xFFFF
        first = [f"0x{int(bits[i]):04X} ({x[i].item()!r}): reference 0x{int(expected[i]):02X}, "
                 f"torch 0x{int(actual[i]):02X}" for i in bad[:6].tolist()]
        raise AssertionError(f"{what}: {bad.numel()} of {x.numel()} patterns differ (torch {TORCH}):\n  "
                             + "\n  ".join(first))


def probe_cast(device: str) -> dict[str, int]:
    """What .to(float8_e4m3fn) gives from fp32 just past the range, on this torch and device."""
    x = torch.tensor([464.0, 465.0, float("inf"), -float("inf")], device=device)
    b = _bytes(x.to(FP8)).tolist()
    return {"464": b[0], "465": b[1], "+inf": b[2], "-inf": b[3]}


def cast_saturates(device: str) -> bool:
    return list(probe_cast(device).values()) == [0x7E, 0x7E, 0x7E, 0xFE]


def cast_nan_past_464(device: str) -> bool:
    p = probe_cast(device)
    return p["464"] == 0x7E and p["465"] == 0x7F


def reference(x: torch.Tensor, scale: ScaleArg, recipe: str) -> torch.Tensor:
    return quantize(x, scale, RECIPES[recipe])


def clamp_cast(y: torch.Tensor) -> torch.Tensor:
    return _bytes(y.clamp(-448, 448).to(FP8))


# ---- CPU (runs in CI) -----------------------------------------------------------------------

@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_input_rounding_equals_torch_to(dtype: str, scale: float):
    """round_to_input_dtype == y.to(dtype): on each quotient x*(1/s), x/s, and on the midpoints."""
    dt = DTYPES[dtype]
    x = all_patterns(dt)
    x32, s = x.float(), torch.tensor(fp32(scale))
    fmt = INPUT_FORMATS[dt]
    _, e = torch.frexp(x32.double().abs())  # the binade of x, floored at the subnormal one
    half_ulp = torch.ldexp(torch.ones_like(x32, dtype=torch.float64),
                           torch.clamp(e - 1, min=fmt.min_normal_exp) - fmt.mantissa_bits - 1)
    cases = {"x * (1/s)": x32 * (1 / s), "x / s": x32 / s,
             "midpoint above x": (x32.double() + half_ulp).float(),  # ties: even decides
             "just past midpoint": (x32.double() + half_ulp * (1 + 2.0**-12)).float()}
    for what, y in cases.items():
        ours = round_to_input_dtype(y, fmt)
        theirs = y.to(dt).float()
        nan = torch.isnan(y)
        bad = ((ours.view(torch.int32) != theirs.view(torch.int32)) & ~nan).nonzero().flatten()
        assert bad.numel() == 0, (
            f"{dtype} rounding of {what} at scale {scale}: {bad.numel()} differ; first y="
            f"{[y[i].item() for i in bad[:4].tolist()]} ours={[ours[i].item() for i in bad[:4].tolist()]} "
            f"torch={[theirs[i].item() for i in bad[:4].tolist()]} (torch {TORCH})")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_unfused_tensor1_equals_div_clamp_cast(dtype: str):
    """unfused-tensor1 == x.div_(float) on the CPU, clamped to ±448, then .to(float8_e4m3fn)."""
    x = all_patterns(DTYPES[dtype])
    for scale in SCALES:
        torch_bytes = clamp_cast(x.clone().div_(scale))
        ours = reference(x, ScaleArg("float", fp32(scale), None), "unfused-tensor1")
        assert_bytes_match(x, ours, torch_bytes, f"{dtype} CPU div_({scale}) + clamp + cast")


@pytest.mark.skipif(not cast_saturates("cpu"), reason=f"torch {TORCH}'s CPU cast does not saturate past 448 "
                    f"({probe_cast('cpu')}); torch 2.13 CPU does")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_unfused_tensor1_equals_div_cast(dtype: str):
    """Without the clamp, on a torch whose CPU cast saturates (measured: 2.13)."""
    x = all_patterns(DTYPES[dtype])
    for scale in SCALES:
        torch_bytes = _bytes(x.clone().div_(scale).to(FP8))
        ours = reference(x, ScaleArg("float", fp32(scale), None), "unfused-tensor1")
        assert_bytes_match(x, ours, torch_bytes, f"{dtype} CPU div_({scale}) + cast")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_single_and_divide_equal_fp32_ops(dtype: str):
    """`single` and `divide` as fp32 torch ops on the CPU: (x*(1/s)) and x/s, clamp, cast."""
    x = all_patterns(DTYPES[dtype])
    for scale in SCALES:
        s = torch.tensor(fp32(scale))
        arg = ScaleArg("float", fp32(scale), None)
        assert_bytes_match(x, reference(x, arg, "single"), clamp_cast(x.float() * (1 / s)),
                           f"{dtype} single at {scale}")
        assert_bytes_match(x, reference(x, arg, "divide"), clamp_cast(x.float() / s),
                           f"{dtype} divide at {scale}")


# ---- CUDA: the devices the recipes model ------------------------------------------------------

def _unfused_on_cuda(x: torch.Tensor, divisor: float | torch.Tensor, clamp: bool) -> torch.Tensor:
    y = x.clone().div_(divisor)
    return clamp_cast(y) if clamp else _bytes(y.to(FP8))


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_unfused_equals_div_float_clamp_cast(dtype: str):
    x = all_patterns(DTYPES[dtype], "cuda")
    for scale in SCALES:
        ours = reference(x, ScaleArg("float", fp32(scale), None), "unfused")
        assert_bytes_match(x, ours, _unfused_on_cuda(x, scale, clamp=True), f"{dtype} CUDA div_({scale}) + clamp")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_unfused_equals_div_float_cast_where_it_saturates(dtype: str):
    if not CUDA:
        pytest.skip("CUDA only: models the CUDA unfused write; no CUDA device here")
    if not cast_saturates("cuda"):
        pytest.skip(f"torch {TORCH}'s CUDA cast is not saturating ({probe_cast('cuda')}); "
                    f"measured NaN past 464 on torch 2.11 (that is unfused-nan)")
    x = all_patterns(DTYPES[dtype], "cuda")
    for scale in SCALES:
        ours = reference(x, ScaleArg("float", fp32(scale), None), "unfused")
        assert_bytes_match(x, ours, _unfused_on_cuda(x, scale, clamp=False), f"{dtype} CUDA div_({scale})")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_unfused_nan_equals_div_float_cast(dtype: str):
    if not CUDA:
        pytest.skip("CUDA only: models the CUDA cast of torch <= 2.11; no CUDA device here")
    if not cast_nan_past_464("cuda"):
        pytest.skip(f"torch {TORCH}'s CUDA cast gives {probe_cast('cuda')}, not NaN past 464 "
                    f"(measured on torch 2.11); unfused-nan models torch <= 2.11")
    x = all_patterns(DTYPES[dtype], "cuda")
    for scale in SCALES:
        ours = reference(x, ScaleArg("float", fp32(scale), None), "unfused-nan")
        assert_bytes_match(x, ours, _unfused_on_cuda(x, scale, clamp=False), f"{dtype} CUDA div_({scale}) + cast")


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("shape,recipe", [((), "unfused-tensor0d"), ((1,), "unfused-tensor1")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_unfused_tensor_scale_equals_div_tensor_clamp_cast(dtype: str, shape: tuple, recipe: str):
    x = all_patterns(DTYPES[dtype], "cuda")
    for scale in SCALES:
        t = torch.full(shape, scale, dtype=torch.float32, device="cuda")
        ours = reference(x, ScaleArg("tensor", float("nan"), t), recipe)
        assert_bytes_match(x, ours, _unfused_on_cuda(x, t, clamp=True),
                           f"{dtype} CUDA div_(fp32 tensor of shape {list(shape)} = {scale}) + clamp")


@triton.jit
def _single_kernel(x_ptr, out_ptr, s, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0.0)
    y = x.to(tl.float32) * tl.math.div_rn(1.0, s)
    tl.store(out_ptr + i, y.to(tl.float8e4nv), mask=i < n)


@triton.jit
def _divide_kernel(x_ptr, out_ptr, s, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0.0).to(tl.float32)
    y = tl.math.div_rn(x, s + tl.zeros_like(x))
    tl.store(out_ptr + i, y.to(tl.float8e4nv), mask=i < n)


@pytest.mark.cuda
@pytest.mark.parametrize("recipe,jit", [("single", _single_kernel), ("divide", _divide_kernel)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_triton_recipes_equal_tiny_kernels(dtype: str, recipe: str, jit):
    if not CUDA:
        pytest.skip("CUDA only: models Triton's compiled fp8 cast (the interpreter rounds it wrongly, "
                    "triton-lang/triton#8322); no CUDA device here")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip(f"Triton's fp8e4nv cast needs sm_89+, this is sm_{torch.cuda.get_device_capability()}")
    x = all_patterns(DTYPES[dtype], "cuda")
    for scale in SCALES:
        out = torch.empty(x.shape, dtype=FP8, device="cuda")
        jit[(triton.cdiv(x.numel(), 1024),)](x, out, fp32(scale), x.numel(), BLOCK=1024)
        ours = reference(x, ScaleArg("float", fp32(scale), None), recipe)
        assert_bytes_match(x, ours, _bytes(out), f"{dtype} Triton {recipe} kernel at {scale}")


@pytest.mark.skipif(not CUDA, reason="CUDA only: compares the reference on the CPU with the reference on "
                    "CUDA; no CUDA device here")
@pytest.mark.cuda
@given(case=cases(recipes=tuple(RECIPES), size="large", allow_out_of_range=True))
def test_the_reference_gives_the_same_bytes_on_cpu_and_cuda(case: Case):
    """The builder and the reference claim the same bytes on every device: a Case built and written on
    the CPU and on CUDA gives the same buffers, bit for bit (inputs with their NaN poison included)."""
    on_cpu, on_cuda = build(case, "cpu"), build(case, "cuda")
    for name in on_cuda.buffers:
        cpu_bits, cuda_bits = (buf.cpu().reshape(-1).view(torch.uint8) for buf in (on_cpu.buffers[name],
                                                                                  on_cuda.buffers[name]))
        assert torch.equal(cpu_bits, cuda_bits), f"the builder's {name} depends on the device"
    run_reference(case, torch.device("cpu"), on_cpu)
    run_reference(case, torch.device("cuda"), on_cuda)
    for name in ("k_cache", "v_cache"):
        report = diff_buffers(on_cpu, name, on_cpu.buffers[name], on_cuda.buffers[name].cpu())
        assert report is None, f"the reference's bytes depend on the device (CPU expected, CUDA actual):\n{report}"


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_per_head_scales_are_the_per_tensor_write_head_by_head(recipe):
    """vLLM's per-head write (vllm#30141) indexes scale[head] in the per-tensor kernel's arithmetic: so the
    spec's [H] scale must give, head by head, the bytes of the per-tensor write with that head's scale."""
    heads = torch.tensor([0.3, 2.0**-5, 17.3, 1e-40, 3e38], dtype=torch.float32)  # non-dyadic, tiny, huge
    for dtype in DTYPES.values():
        x = all_patterns(dtype)[:65535].reshape(-1, len(heads), 1)  # every pattern but the last, 0x7FFF (NaN)
        ours = quantize(x, heads.reshape(1, -1, 1), RECIPES[recipe])
        for h, s in enumerate(heads.tolist()):
            one = quantize(x[:, h], ScaleArg("float", s, None), RECIPES[recipe])
            assert torch.equal(ours[:, h], one), (recipe, dtype, h, s)


# ---- e5m2 caches: the reference against torch's own e5m2 cast (CPU) --------------------------

#: torch's CPU unfused write, k.div_(s).to(float8_e5m2): a true division stored in k's dtype, then a
#: cast that never saturates (docs/facts.md, fact 5). No named recipe computes that combination on
#: e4m3 (the CPU's e4m3 cast saturates), so it is spelled out here.
CPU_UNFUSED_E5M2 = Recipe("cpu-unfused-e5m2", "divide", "fp32", "input", "nan", "k.div_(s).to(float8_e5m2), CPU")
NON_SATURATING = RECIPES["unfused-nan"]  # its overflow rule; the arithmetic is not used below
SATURATING = RECIPES["divide"]


def _e5m2(y: torch.Tensor) -> torch.Tensor:
    return y.to(torch.float8_e5m2).view(torch.uint8)


def _match(y: torch.Tensor, ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    """Bytes equal, except that torch's cast keeps a NaN's sign (both must be e5m2 NaN bytes then)."""
    nan_byte = lambda b: ((b & 0x7F) > 0x7C)  # noqa: E731 (e5m2's NaNs: 0x7D..0x7F, either sign)
    bad = ((ours != theirs) & ~(nan_byte(ours) & nan_byte(theirs))).nonzero().flatten()
    first = ", ".join(f"{y[i].item()!r}: reference 0x{int(ours[i]):02X}, torch 0x{int(theirs[i]):02X}"
                      for i in bad[:6].tolist())
    assert bad.numel() == 0, (f"{what}: {bad.numel()} of {y.numel()} values differ from torch "
                              f"{torch.__version__}'s e5m2 cast; first: {first}")


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_e5m2_rounding_equals_torch_cast(dtype: str, scale: float):
    """encode_fp8 onto e5m2 == torch's .to(float8_e5m2) of fp32 values: every pattern, each divided
    by the scale (fp32 quotients that are not bf16/fp16 values), and each pattern's midpoint with its
    upper neighbour (ties at every e5m2 binade, 61440 among them). The non-saturating rule is
    torch's; the saturating rule is torch's cast after a clamp to ±57344 (cvt.rn.satfinite)."""
    x = all_patterns(DTYPES[dtype]).float()
    values = {"x": x, f"x / {scale}": x / fp32(scale),
              "between neighbours": ((x[:-1].double() + x[1:].double()) / 2).float()}  # exact in fp32
    for what, y in values.items():
        _match(y, encode_fp8(y, NON_SATURATING, E5M2), _e5m2(y), f"{dtype} {what}: non-saturating")
        _match(y, encode_fp8(y, SATURATING, E5M2), _e5m2(y.clamp(-57344.0, 57344.0)), f"{dtype} {what}: saturating")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_unfused_e5m2_write_equals_div_cast(dtype: str):
    """The reference with the CPU's unfused arithmetic onto e5m2 == x.div_(s).to(float8_e5m2) on the CPU."""
    x = all_patterns(DTYPES[dtype])
    for scale in SCALES:
        ours = quantize(x, ScaleArg("float", fp32(scale), None), CPU_UNFUSED_E5M2, "fp8_e5m2")
        _match(x.float(), ours, _e5m2(x.clone().div_(scale)), f"{dtype} CPU div_({scale}) + e5m2 cast")



@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_unfused_nan_e5m2_equals_div_float_cast(dtype: str):
    """unfused-nan onto e5m2 == x.div_(float).to(float8_e5m2) on CUDA (a reciprocal multiply, fact 1, then
    torch's e5m2 cast, which the spec takes to overflow to inf there as on the CPU: fact 5)."""
    if not CUDA:
        pytest.skip("CUDA only: models the CUDA unfused e5m2 write; no CUDA device here")
    x = all_patterns(DTYPES[dtype], "cuda")
    for scale in SCALES:
        ours = quantize(x, ScaleArg("float", fp32(scale), None), RECIPES["unfused-nan"], "fp8_e5m2").cpu()
        theirs = _e5m2(x.clone().div_(scale)).cpu()
        _match(x.float().cpu(), ours, theirs, f"{dtype} CUDA div_({scale}) + e5m2 cast")


@triton.jit
def _e5m2_kernel(x_ptr, out_ptr, s, n, DIVIDE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n, other=0.0).to(tl.float32)
    if DIVIDE:
        y = tl.math.div_rn(x, s + tl.zeros_like(x))
    else:
        y = x * tl.math.div_rn(1.0, s)
    tl.store(out_ptr + i, y.to(tl.float8e5), mask=i < n)


@pytest.mark.cuda
@pytest.mark.parametrize("recipe", ["single", "divide"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_triton_e5m2_recipes_equal_tiny_kernels(dtype: str, recipe: str):
    """single / divide onto e5m2 == Triton's compiled (x * (1/s)) / (x / s) .to(tl.float8e5), no clamp:
    cvt.rn.satfinite.e5m2x2.f32 on sm_89+ saturates to ±57344 by itself (docs/e5m2.md)."""
    if not CUDA:
        pytest.skip("CUDA only: models Triton's compiled e5m2 cast; no CUDA device here")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip(f"cvt.rn.satfinite.e5m2 needs sm_89+, this is sm_{torch.cuda.get_device_capability()}")
    x = all_patterns(DTYPES[dtype], "cuda")
    for scale in SCALES:
        out = torch.empty(x.shape, dtype=torch.float8_e5m2, device="cuda")
        _e5m2_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, fp32(scale), x.numel(), DIVIDE=recipe == "divide",
                                                      BLOCK=1024)
        ours = quantize(x, ScaleArg("float", fp32(scale), None), RECIPES[recipe], "fp8_e5m2").cpu()
        _match(x.float().cpu(), ours, _bytes(out), f"{dtype} Triton {recipe} e5m2 kernel at {scale}")


# ---- e4m3fnuz caches: the reference against torch's own fnuz cast (CPU) ------------------------

def _fnuz(y: torch.Tensor) -> torch.Tensor:
    return y.to(torch.float8_e4m3fnuz).view(torch.uint8)


def _match_exactly(y: torch.Tensor, ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    """Bytes equal with no exception: fnuz has one NaN (0x80), and torch's cast writes it for every NaN."""
    bad = (ours != theirs).nonzero().flatten()
    first = ", ".join(f"{y[i].item()!r}: reference 0x{int(ours[i]):02X}, torch 0x{int(theirs[i]):02X}"
                      for i in bad[:6].tolist())
    assert bad.numel() == 0, (f"{what}: {bad.numel()} of {y.numel()} values differ from torch "
                              f"{torch.__version__}'s e4m3fnuz cast; first: {first}")


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_fnuz_rounding_equals_torch_cast(dtype: str, scale: float):
    """encode_fp8 onto e4m3fnuz == torch's .to(float8_e4m3fnuz) of fp32 values, byte for byte: every
    pattern, its quotient by the scale, and each pattern's midpoint with its upper neighbour (ties at
    every binade, 248 among them; -0 and negative underflow to 0x00; every NaN 0x80). The non-saturating
    rule is torch's cast (NaN from 248 up: docs/facts.md, fact 6); the saturating rule is torch's cast
    after a clamp to ±240 (hip's __HIP_SATFINITE)."""
    x = all_patterns(DTYPES[dtype]).float()
    values = {"x": x, f"x / {scale}": x / fp32(scale),
              "between neighbours": ((x[:-1].double() + x[1:].double()) / 2).float()}  # exact in fp32
    for what, y in values.items():
        _match_exactly(y, encode_fp8(y, NON_SATURATING, E4M3FNUZ), _fnuz(y), f"{dtype} {what}: non-saturating")
        _match_exactly(y, encode_fp8(y, SATURATING, E4M3FNUZ), _fnuz(y.clamp(-240.0, 240.0)),
                       f"{dtype} {what}: saturating")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_unfused_fnuz_write_equals_div_cast(dtype: str):
    """The reference with the CPU's unfused arithmetic (CPU_UNFUSED_E5M2's steps: a true division stored
    in k's dtype, then a non-saturating cast) onto e4m3fnuz == x.div_(s).to(float8_e4m3fnuz) on the CPU."""
    x = all_patterns(DTYPES[dtype])
    for scale in SCALES:
        ours = quantize(x, ScaleArg("float", fp32(scale), None), CPU_UNFUSED_E5M2, "fp8_e4m3fnuz")
        _match_exactly(x.float(), ours, _fnuz(x.clone().div_(scale)), f"{dtype} CPU div_({scale}) + fnuz cast")
