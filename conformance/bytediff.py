"""The one byte-compare helper: whole cache buffers as uint8, and a report that says where.

`compare_caches` byte-diffs both caches (the harness, and so every property that runs
`check_case`, goes through it); `diff_buffers` does one buffer (isolation, big caches). Both return
None when the bytes are equal, else the report, which the caller asserts on. `tools.repro` prints
the same report, so a red CI line and a local replay read the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernel.plan import ScaleArg
from kernel.recipe import get_recipe
from kernel.reference import scaled
from strategies.build import GUARD_BYTES, Built
from strategies.case import Case

FIRST_N = 8


@dataclass(frozen=True)
class Position:
    """Where a flat byte of a cache buffer sits."""

    region: str  # "guard-before", "guard-after", "gap" (between view elements) or "view"
    page: int = -1
    offset: int = -1
    head: int = -1
    dim: int = -1

    def slot(self, page_size: int) -> int:
        return self.page * page_size + self.offset


def locate(case: Case, which: str, flat: int) -> Position:
    """Map a flat index of the k_cache/v_cache buffer to (page, offset, head, dim) or a region."""
    layout = case.k_cache_layout if which == "k_cache" else case.v_cache_layout
    shape = case.cache_shape
    rel = flat - GUARD_BYTES - layout.offset
    if flat < GUARD_BYTES:
        return Position("guard-before")
    if flat >= GUARD_BYTES + layout.span(shape):
        return Position("guard-after")
    if rel < 0:
        return Position("gap")
    strides = layout.strides(shape)
    coords = [0] * 4
    for dim in layout.order:
        coords[dim], rel = divmod(rel, strides[dim])
    if rel or any(c >= n for c, n in zip(coords, shape)):
        return Position("gap")
    return Position("view", *coords)


def decode_e4m3(byte: int, cache_format: str = "fp8_e4m3") -> float:
    """The value of an e4m3fn byte (of an e5m2 or e4m3fnuz byte, for such a Case's cache_format)."""
    dtype = {"fp8_e5m2": torch.float8_e5m2, "fp8_e4m3fnuz": torch.float8_e4m3fnuz}.get(cache_format,
                                                                                       torch.float8_e4m3fn)
    return torch.tensor([byte], dtype=torch.uint8).view(dtype).float().item()


def _scale_value(built: Built, which: str, head: int) -> float:
    """The scale this head's bytes were written with: the call's per-head tensor element, when it
    passed one (conformance/test_per_head.py), else the Case's one value."""
    given = built.k_scale if which == "k_cache" else built.v_scale
    if isinstance(given, torch.Tensor) and given.numel() > 1:
        return float(given.reshape(-1)[head])
    scale = built.case.k_scale if which == "k_cache" else built.case.v_scale
    return scale.value if scale.kind != "none" else 1.0


def _scaled(case: Case, x: torch.Tensor, s: float) -> float:
    """The value the recipe hands to the e4m3 rounding, for the report (the reference's own steps)."""
    return scaled(x, ScaleArg("float", s, None), get_recipe(case.recipe)).item()


def describe_byte(built: Built, which: str, flat: int, expected: int, actual: int) -> str:
    case = built.case
    pos = locate(case, which, flat)
    fmt = case.cache_format
    line = f"  {which}[{flat}] expected 0x{expected:02X} ({decode_e4m3(expected, fmt):g}) " \
           f"actual 0x{actual:02X} ({decode_e4m3(actual, fmt):g}) at {pos.region}"
    if pos.region != "view":
        return line
    slot = pos.slot(case.page_size)
    tokens = [t for t, s in enumerate(case.cache_loc) if s == slot]
    line += f" slot={slot} (page={pos.page}, offset={pos.offset}) head={pos.head} dim={pos.dim}"
    if not tokens:
        return line + ": no token writes this slot"
    logical = built.k_logical if which == "k_cache" else built.v_logical
    s = _scale_value(built, which, pos.head)
    for t in tokens:
        x = logical[t, pos.head, pos.dim]
        width = x.element_size() * 8  # show the input's raw bits unsigned, at its own width
        bits = x.view(torch.int16 if width == 16 else torch.int32).item() & ((1 << width) - 1)
        line += f"\n      token={t} input={x.item()!r} (0x{bits:X} {case.input_dtype}) scale={s!r} " \
                f"scaled={_scaled(case, x, s)!r}"
    return line


def diff_buffers(built: Built, which: str, expected: torch.Tensor, actual: torch.Tensor,
                 first_n: int = FIRST_N) -> str | None:
    """None if the two whole uint8 buffers are identical, else a report of the first mismatches."""
    if expected.shape != actual.shape:
        return f"{which}: buffer sizes differ ({expected.numel()} vs {actual.numel()})"
    bad = (expected != actual).nonzero().flatten()
    if bad.numel() == 0:
        return None
    first = bad[:first_n].tolist()
    exp, act = expected[first].tolist(), actual[first].tolist()
    lines = [f"{which}: {bad.numel()} of {expected.numel()} bytes differ; first {len(first)}:"]
    lines += [describe_byte(built, which, f, e, a) for f, e, a in zip(first, exp, act)]
    return "\n".join(lines)


def compare_caches(expected: Built, actual: Built, first_n: int = FIRST_N) -> str | None:
    """Byte-diff both caches (whole buffers, guard bands included); None when identical."""
    reports = [diff_buffers(actual, name, expected.buffers[name].cpu(), actual.buffers[name].cpu(), first_n)
               for name in ("k_cache", "v_cache")
               if not torch.equal(expected.buffers[name], actual.buffers[name])]  # on the device: cheap
    return "\n".join(reports) if reports else None
