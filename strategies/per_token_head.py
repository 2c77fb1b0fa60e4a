"""Per-(token, head) writes: the mode, where the scales go, and heads whose values test the edge cases.

A `PTHCase` is a plain `Case` (sizes, dtypes, input and cache layouts, cache_loc, seed, overrides: all
drawn by strategies.cases, so every layout the suite knows is met here too) plus:
- `mode`: a recipe of kernel.per_token_head.PTH_RECIPES;
- `layout`: "inline" (the caches' last dim widened to D + 4: the cache buffers are built from the same
  Case with head_dim D + 4, so their layouts, guard bands and seeded bytes are the usual ones) or
  "separate" (float32 scale caches shaped like the cache minus head_dim, each a `Layout` of its own);
- `heads`: special heads, (tensor, token, head, kind) with kind one of HEAD_KINDS: "zero" (every value
  ±0, signs seeded), "subnormal" (every value a subnormal of the input dtype, so amax is one), "small"
  (amax in [2**-20, 2**-11): below 448e-6, where vLLM's floor of 1e-6 decides s), "tiny" (amax in
  [2**-44, 2**-37), around FlashInfer's floor of 1e-12; zero in fp16), "inf" (one ±inf among seeded
  values), "nan" (one NaN among them).
Tensor contents come from the Case's seed (strategies.build's hashing): no unmanaged RNG.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch
from hypothesis import event
from hypothesis import strategies as st

from strategies._cache import ints, sampled
from strategies.build import BITS_DTYPES, Built, build, seeded_bits
from strategies.case import Case, Layout

PTH_MODES = ("per-token-head-vllm", "per-token-head-flashinfer")
LAYOUTS = ("inline", "separate")
HEAD_KINDS = ("zero", "subnormal", "small", "tiny", "inf", "nan")
#: Per kind of a small head: the exponent range of its amax, around where each recipe's floor acts.
_SMALL_EXPONENTS = {"small": (-20, -12), "tiny": (-44, -38)}
SCALE_GUARD = 16  # float32 elements of seeded bits before and after each scale cache
#: Per input dtype: (bits, mantissa mask, the dtype's +inf bits, a quiet NaN's bits)
_BITS = {"bfloat16": (16, 0x7F, 0x7F80, 0x7FC1), "float16": (16, 0x3FF, 0x7C00, 0x7E01),
         "float32": (32, 0x7FFFFF, 0x7F800000, 0x7FC00001)}


@dataclass(frozen=True)
class PTHCase:
    """A per-token-head call: the base Case (head_dim = D), the mode, the layout and special heads."""

    case: Case
    mode: str
    layout: Literal["inline", "separate"]
    k_scale_layout: Layout | None = None  # separate: over [P, page_size, H] (merged to [S, H] for 3-D caches)
    v_scale_layout: Layout | None = None
    heads: tuple[tuple[str, int, int, str], ...] = ()

    @property
    def scale_shape(self) -> tuple[int, int, int]:
        c = self.case
        return (c.num_pages, c.page_size, c.num_heads)

    def to_dict(self) -> dict:
        """JSON-able: what a failure file holds to rebuild the same bytes (tools.repro)."""
        lay = lambda x: None if x is None else dataclasses.asdict(x)  # noqa: E731
        return {"case": self.case.to_dict(), "mode": self.mode, "layout": self.layout,
                "k_scale_layout": lay(self.k_scale_layout), "v_scale_layout": lay(self.v_scale_layout),
                "heads": [list(h) for h in self.heads]}

    @staticmethod
    def from_dict(d: dict) -> PTHCase:
        lay = lambda x: None if x is None else Layout(tuple(x["order"]), tuple(x["extra"]), x["step"], x["offset"])  # noqa: E731
        return PTHCase(Case.from_dict(d["case"]), d["mode"], d["layout"], lay(d["k_scale_layout"]),
                       lay(d["v_scale_layout"]), tuple(tuple(h) for h in d["heads"]))


@st.composite
def _scale_layouts(draw: st.DrawFn, cache_rank: int) -> Layout:
    # A 3-D cache's scale cache is [S, H]: page and offset stay adjacent (page outer) to merge.
    orders = ((0, 1, 2), (2, 0, 1)) if cache_rank == 3 else ((0, 1, 2), (2, 0, 1), (0, 2, 1), (1, 0, 2))
    order = draw(sampled(orders), label="scale_order")
    extra = tuple(draw(sampled((0, 0, 1, 3)), label=f"scale_extra_{d}") for d in range(3))
    if cache_rank == 3:
        extra = (extra[0], 0, extra[2])  # no padding between page and offset: [S, H] must stay a view
    step = draw(sampled((1, 1, 2)), label="scale_step")  # 2: a column of a [..., 2] K/V scale table
    return Layout(order, extra, step, draw(ints(0, 3), label="scale_offset"))


def scale_layouts(cache_rank: int) -> st.SearchStrategy[Layout]:
    """A float32 scale cache's Layout over [P, page_size, H]: storage order (head-major among them),
    padding after dims, an innermost step of 2 (every other element) and a start offset.
    Shrinks toward the contiguous layout."""
    if cache_rank not in (3, 4):
        raise ValueError(f"scale_layouts(cache_rank): 3 or 4, got {cache_rank!r}")
    return _scale_layouts(cache_rank)


@st.composite
def _special_heads(draw: st.DrawFn, case: Case, kinds: tuple[str, ...], max_heads: int) -> tuple:
    n = draw(ints(0, max_heads), label="special_heads") if case.num_tokens else 0
    out = []
    for i in range(n):
        out.append((draw(sampled(("k", "v")), label=f"head_{i}_tensor"),
                    draw(ints(0, case.num_tokens - 1), label=f"head_{i}_token"),
                    draw(ints(0, case.num_heads - 1), label=f"head_{i}_head"),
                    draw(sampled(kinds), label=f"head_{i}_kind")))
        event(f"per-token-head: a {out[-1][3]} head")
    return tuple(out)


def special_heads(case: Case, kinds: tuple[str, ...] = HEAD_KINDS, max_heads: int = 4) -> st.SearchStrategy[tuple]:
    """Up to max_heads (tensor, token, head, kind) of the Case, kind from `kinds` (HEAD_KINDS).
    Later ones overwrite earlier ones at the same head. Shrinks toward none."""
    if not kinds or any(k not in HEAD_KINDS for k in kinds):
        raise ValueError(f"special_heads(kinds): a non-empty subset of {HEAD_KINDS}, got {kinds!r}")
    return _special_heads(case, tuple(kinds), max_heads)


@st.composite
def _pth_cases(draw: st.DrawFn, base: st.SearchStrategy[Case], modes: tuple[str, ...], layouts: tuple[str, ...],
               kinds: tuple[str, ...]) -> PTHCase:
    case = draw(base, label="case")
    mode = draw(sampled(modes), label="mode")
    layout = draw(sampled(layouts), label="layout")
    event(f"per-token-head: {mode}, {layout}")
    k_sl = v_sl = None
    if layout == "separate":
        k_sl = draw(scale_layouts(case.cache_rank), label="k_scale_layout")
        v_sl = draw(scale_layouts(case.cache_rank), label="v_scale_layout")
    heads = draw(special_heads(case, kinds), label="heads") if kinds else ()
    return PTHCase(case, mode, layout, k_sl, v_sl, heads)  # type: ignore[arg-type]


def pth_cases(base: st.SearchStrategy[Case], modes: tuple[str, ...] = PTH_MODES,
              layouts: tuple[str, ...] = LAYOUTS, kinds: tuple[str, ...] = HEAD_KINDS) -> st.SearchStrategy[PTHCase]:
    """A PTHCase: a Case from `base` (draw it with scale_kinds=("none",): the scales are computed),
    then the mode, the layout, the scale caches' layouts (separate) and special heads (none when
    kinds is empty). Shrinks as the Case, then toward vLLM's recipe, inline, plain layouts, no special head."""
    for name, got, allowed in (("modes", modes, PTH_MODES), ("layouts", layouts, LAYOUTS)):
        if not got or any(x not in allowed for x in got):
            raise ValueError(f"pth_cases({name}): a non-empty subset of {allowed}, got {got!r}")
    return _pth_cases(base, tuple(modes), tuple(layouts), tuple(kinds))


# -- building -----------------------------------------------------------------------------------
@dataclass
class PTHBuilt:
    """A PTHCase's tensors: `built` holds the inputs, the (widened, inline) caches and cache_loc;
    `buffers` every whole buffer behind them, scale caches (with their guards) included."""

    pc: PTHCase
    built: Built
    k_scale_cache: torch.Tensor | None
    v_scale_cache: torch.Tensor | None
    buffers: dict[str, torch.Tensor]

    def call(self) -> dict[str, object]:
        b = self.built
        return dict(k=b.k, v=b.v, k_cache=b.k_cache, v_cache=b.v_cache, cache_loc=b.cache_loc,
                    page_size=self.pc.case.page_size, checked=self.pc.case.checked, per_token_head=self.pc.mode,
                    k_scale_cache=self.k_scale_cache, v_scale_cache=self.v_scale_cache)

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {name: buf.clone() for name, buf in self.buffers.items()}


def _set_head(x3: torch.Tensor, t: int, h: int, kind: str, dtype: str, seed: int, device: torch.device) -> None:
    """Make head (t, h) of the [T, H, D] view x3 a `kind` head, from seeded bits."""
    width, mant, inf, nan = _BITS[dtype]
    d = x3.shape[2]
    r = seeded_bits(seed, f"head-{t}-{h}-{kind}", d + 1, device)
    sign = ((r[:d] >> 31) & 1) << (width - 1)
    row = x3[t, h].view(BITS_DTYPES[dtype])
    bits = row.to(torch.int64) & ((1 << width) - 1)  # the row's current bits, unsigned
    where = int(r[d].item()) % d
    if kind == "zero":
        bits = sign
    elif kind == "subnormal":
        bits = sign | (r[:d] & mant)  # exponent field 0: subnormal, or zero where the mantissa is 0
        bits[where] = sign[where] | (r[d] & mant) | 1  # at least one lane nonzero: amax is subnormal
    elif kind in _SMALL_EXPONENTS:  # (1 + 16 bits) * 2**e in fp32 (exact), then RNE to the dtype
        lo, hi = _SMALL_EXPONENTS[kind]
        top = lo + int(r[d].item()) % (hi - lo + 1)
        pow2 = ((top - (r[:d] >> 16) % 4 + 127) << 23).to(torch.int32).view(torch.float32)  # 2**e from its bits
        mag = (1 + (r[:d] & 0xFFFF).to(torch.float32) / 65536) * pow2
        small = torch.where(sign != 0, -mag, mag).to(x3.dtype).view(BITS_DTYPES[dtype])
        bits = small.to(torch.int64) & ((1 << width) - 1)
    elif kind == "inf":
        bits[where] = inf | sign[where]
    else:
        bits[where] = nan | sign[where]
    signed = torch.where(bits >= 1 << (width - 1), bits - (1 << width), bits)
    row.copy_(signed.to(BITS_DTYPES[dtype]))


def _inputs_3d(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x if x.dim() == 3 else x.unflatten(1, (heads, -1))


def _scale_cache(pc: PTHCase, name: str, layout: Layout, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    shape = pc.scale_shape
    n = SCALE_GUARD + layout.span(shape) + SCALE_GUARD
    buf = seeded_bits(pc.case.seed, name, n, device).to(torch.int32).view(torch.float32)  # wraps: any bits
    strides = layout.strides(shape)
    if pc.case.cache_rank == 3:  # [S, H]: page and offset adjacent, page outer, no padding between
        return buf.as_strided((shape[0] * shape[1], shape[2]), strides[1:], SCALE_GUARD + layout.offset), buf
    return buf.as_strided(shape, strides, SCALE_GUARD + layout.offset), buf


def build_pth(pc: PTHCase, device: torch.device | str = "cpu") -> PTHBuilt:
    """The PTHCase's tensors on `device`; the same PTHCase always gives the same bytes."""
    device = torch.device(device)
    case = pc.case
    built = build(case, device)
    for tensor, t, h, kind in pc.heads:
        x = built.k if tensor == "k" else built.v
        _set_head(_inputs_3d(x, case.num_heads), t, h, kind, case.input_dtype, case.seed, device)
    buffers = {name: built.buffers[name] for name in ("k", "v", "cache_loc")}
    ks = vs = None
    if pc.layout == "inline":
        wide = build(case.replace(head_dim=case.head_dim + 4, overrides=()), device)
        built = dataclasses.replace(built, k_cache=wide.k_cache, v_cache=wide.v_cache)
        buffers.update(k_cache=wide.buffers["k_cache"], v_cache=wide.buffers["v_cache"])
    else:
        buffers.update(k_cache=built.buffers["k_cache"], v_cache=built.buffers["v_cache"])
        ks, buffers["k_scale_cache"] = _scale_cache(pc, "k_scale_cache", pc.k_scale_layout, device)
        vs, buffers["v_scale_cache"] = _scale_cache(pc, "v_scale_cache", pc.v_scale_layout, device)
    built = dataclasses.replace(built, buffers=buffers)
    return PTHBuilt(pc, built, ks, vs, buffers)
