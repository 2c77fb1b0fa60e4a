"""Case -> tensors, deterministically, on any device.

Every buffer is built on the CPU from the Case's seed with a private `torch.Generator`, then moved:
the same Case gives the same bytes on every machine. Views are carved out of larger buffers:
- inputs sit in buffers whose gaps hold a poison NaN, so a kernel that reads outside its view
  writes a wrong byte;
- caches sit in uint8 buffers with guard bands before and after, pre-filled with seeded bytes, so
  every byte a kernel must not touch has a known previous value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strategies.case import Case, Layout, Scale

GUARD_BYTES = 256  # before and after every cache buffer
INPUT_GUARD = 64  # elements of poison before and after every input buffer
POISON_BITS = {"bfloat16": 0x7FA5, "float16": 0x7E5A, "float32": 0x7FA5A5A5}  # quiet NaNs
PATTERN_LEN = 4093  # prime, so the pattern never lines up with a power-of-two stride

DTYPES = {
    "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn, "uint8": torch.uint8,
    "int32": torch.int32, "int64": torch.int64,
}
BITS_DTYPES = {"bfloat16": torch.int16, "float16": torch.int16, "float32": torch.int32}


@dataclass
class Built:
    """A Case's tensors: what the implementation is called with, and the buffers behind them."""

    case: Case
    k: torch.Tensor
    v: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cache_loc: torch.Tensor
    k_scale: float | torch.Tensor | None
    v_scale: float | torch.Tensor | None
    k_logical: torch.Tensor  # [T, H, D] values on the CPU, overrides applied
    v_logical: torch.Tensor
    buffers: dict[str, torch.Tensor]  # name -> whole buffer (caches as uint8, guards included)

    def args(self) -> tuple:
        """Positional arguments of fused_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, ...)."""
        return (self.k, self.v, self.k_cache, self.v_cache, self.cache_loc, self.k_scale,
                self.v_scale, self.case.page_size)

    def kwargs(self) -> dict:
        return {"recipe": self.case.recipe, "checked": self.case.checked}

    def snapshot(self) -> dict[str, torch.Tensor]:
        """Copies of every buffer, to compare against after a call."""
        return {name: buf.clone() for name, buf in self.buffers.items()}


def seeded_generator(seed: int, stream: str) -> torch.Generator:
    """A private CPU generator per (seed, stream): independent streams, stable across devices."""
    return torch.Generator().manual_seed((seed * 1_000_003 + sum(map(ord, stream)) * 7919) % 2**63)


def _logical_values(case: Case, name: str, scale: Scale) -> torch.Tensor:
    """Seeded values spread over the whole e4m3 range after scaling, with the overrides applied.

    |x| / scale is 2**E * (1 + f) with E uniform in [-12, 9]: subnormal e4m3 results through
    overflow past 448. Clamped to the dtype's finite range, so inf and NaN come only from overrides.
    """
    g = seeded_generator(case.seed, name)
    shape = case.input_shape
    exponent = torch.randint(-12, 10, shape, generator=g).to(torch.float64)
    fraction = torch.rand(shape, generator=g, dtype=torch.float64)
    sign = torch.randint(0, 2, shape, generator=g).to(torch.float64) * 2 - 1
    values = sign * torch.exp2(exponent) * (1 + fraction) * scale.value
    dtype = DTYPES[case.input_dtype]
    finite = torch.finfo(dtype).max
    x = values.clamp(-finite, finite).to(dtype)
    flat_bits = x.view(BITS_DTYPES[case.input_dtype]).reshape(-1)
    for o in case.overrides:
        if o.tensor == name and o.index < flat_bits.numel():
            flat_bits[o.index] = _signed(o.bits, flat_bits.element_size() * 8)
    return x


def _signed(bits: int, width: int) -> int:
    return bits - (1 << width) if bits >= 1 << (width - 1) else bits


def _input_view(case: Case, name: str, layout: Layout, values: torch.Tensor,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    shape = case.input_shape
    n = INPUT_GUARD + layout.span(shape) + INPUT_GUARD
    bits = torch.full((n,), _signed(POISON_BITS[case.input_dtype], values.element_size() * 8),
                      dtype=BITS_DTYPES[case.input_dtype])
    buf = bits.view(values.dtype).to(device)
    view = buf.as_strided(shape, layout.strides(shape), INPUT_GUARD + layout.offset)
    view.copy_(values.to(device))
    if case.input_rank == 2:
        view = _merge(view, 1, f"{name} layout cannot be viewed as [T, H*D]")
    return view, buf


def _merge(view: torch.Tensor, dim: int, why: str) -> torch.Tensor:
    """Merge dims (dim, dim+1) into one without copying; the strategies only ask when it can."""
    size, stride = list(view.shape), list(view.stride())
    if stride[dim] != stride[dim + 1] * size[dim + 1] and size[dim] > 1:
        raise ValueError(why)
    size[dim:dim + 2] = [size[dim] * size[dim + 1]]
    stride[dim:dim + 2] = [stride[dim + 1]]
    return view.as_strided(size, stride, view.storage_offset())


def _cache_view(case: Case, name: str, layout: Layout,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    shape = case.cache_shape
    n = GUARD_BYTES + layout.span(shape) + GUARD_BYTES
    pattern = torch.randint(0, 256, (PATTERN_LEN,), generator=seeded_generator(case.seed, name),
                            dtype=torch.uint8).to(device)
    buf = pattern.repeat(n // PATTERN_LEN + 1)[:n].contiguous()
    typed = buf if case.cache_dtype == "uint8" else buf.view(DTYPES[case.cache_dtype])
    view = typed.as_strided(shape, layout.strides(shape), GUARD_BYTES + layout.offset)
    if case.cache_rank == 3:
        view = _merge(view, 0, f"{name} layout cannot be viewed as [S, H, D]")
    return view, buf


def _scale(scale: Scale, device: torch.device) -> float | torch.Tensor | None:
    if scale.kind == "none":
        return None
    if scale.kind == "float":
        return scale.value
    shape = () if scale.kind == "tensor0d" else (1,)
    return torch.full(shape, scale.value, dtype=torch.float32, device=device)


def build(case: Case, device: torch.device | str = "cpu") -> Built:
    """Make the Case's tensors on `device`. The same Case always gives the same bytes."""
    device = torch.device(device)
    k_logical = _logical_values(case, "k", case.k_scale)
    v_logical = _logical_values(case, "v", case.v_scale)
    k, k_buf = _input_view(case, "k", case.k_layout, k_logical, device)
    v, v_buf = _input_view(case, "v", case.v_layout, v_logical, device)
    k_cache, kc_buf = _cache_view(case, "k_cache", case.k_cache_layout, device)
    v_cache, vc_buf = _cache_view(case, "v_cache", case.v_cache_layout, device)
    loc_buf = torch.full((max(1, case.num_tokens * case.loc_step),), -7, dtype=DTYPES[case.loc_dtype])
    loc_buf[::case.loc_step][:case.num_tokens] = torch.tensor(case.cache_loc, dtype=torch.int64)
    loc_buf = loc_buf.to(device)
    cache_loc = loc_buf[::case.loc_step][:case.num_tokens]
    k_scale, v_scale = _scale(case.k_scale, device), _scale(case.v_scale, device)
    buffers = {"k": k_buf, "v": v_buf, "k_cache": kc_buf, "v_cache": vc_buf, "cache_loc": loc_buf}
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(s, torch.Tensor):
            buffers[name] = s
    return Built(case, k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, k_logical, v_logical,
                 buffers)
