"""Case: the plain, serializable description of one call, and the single currency of the suite.

Strategies draw Cases, `strategies.build` turns one into tensors on any device (deterministically),
the properties run an implementation and the reference on it, and a failing Case is saved as JSON
that replays the same bytes anywhere. Nothing here touches torch or a GPU.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

INPUT_DTYPES = ("bfloat16", "float16", "float32")
CACHE_DTYPES = ("float8_e4m3fn", "uint8")
#: The cache's number format (vLLM's kv_cache_dtype names) and its float8 dtype; a uint8 cache holds
#: either (kernel.plan). Drawn only where a property asks (strategies.cases(cache_formats=...)).
CACHE_FORMATS = ("fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz")
FP8_CACHE_DTYPES = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2", "fp8_e4m3fnuz": "float8_e4m3fnuz"}
LOC_DTYPES = ("int32", "int64")
SCALE_KINDS = ("none", "float", "tensor0d", "tensor1")

#: Logical dims: inputs are (token, head, dim); caches are (page, offset, head, dim).
INPUT_DIMS = ("token", "head", "dim")
CACHE_DIMS = ("page", "offset", "head", "dim")


@dataclass(frozen=True)
class Layout:
    """How a logical tensor sits in a larger buffer: a padded, permuted, offset strided view.

    Dims are laid out in `order` (outermost first). Each dim's extent in storage is its size plus
    `extra[dim]` (padding heads, padded rows, the other half of a K/V-interleaved page, ...); the
    innermost stored dim moves `step` elements at a time; the view starts `offset` elements in.
    """

    order: tuple[int, ...]
    extra: tuple[int, ...]
    step: int = 1
    offset: int = 0

    @staticmethod
    def contiguous(rank: int) -> Layout:
        return Layout(tuple(range(rank)), (0,) * rank)

    def strides(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        strides = [0] * len(shape)
        running = self.step
        for dim in reversed(self.order):
            strides[dim] = running
            running *= max(shape[dim] + self.extra[dim], 1)
        return tuple(strides)

    def span(self, shape: tuple[int, ...]) -> int:
        """Elements of buffer the view needs, from its start, offset included."""
        outer = self.order[0]
        return self.offset + self.strides(shape)[outer] * max(shape[outer] + self.extra[outer], 1)

    def is_contiguous(self) -> bool:
        return self == Layout.contiguous(len(self.order))


@dataclass(frozen=True)
class Scale:
    """A scale argument: None, a Python float, a 0-d tensor or a 1-element tensor (fp32 value)."""

    kind: Literal["none", "float", "tensor0d", "tensor1"] = "none"
    value: float = 1.0


@dataclass(frozen=True)
class Override:
    """Put one exact value (raw bits of the input dtype) at a flat [T, H, D] index of k or v."""

    tensor: Literal["k", "v"]
    index: int
    bits: int
    label: str = ""  # why it was drawn ("+inf", "tie", ...): for reports and statistics


@dataclass(frozen=True)
class Case:
    """Everything a call needs, as plain data. `build(case, device)` makes its tensors."""

    num_tokens: int
    num_heads: int
    head_dim: int
    page_size: int
    num_pages: int
    cache_loc: tuple[int, ...]
    input_dtype: str = "bfloat16"
    cache_dtype: str = "float8_e4m3fn"
    loc_dtype: str = "int64"
    input_rank: int = 3
    cache_rank: int = 4
    k_layout: Layout = field(default_factory=lambda: Layout.contiguous(3))
    v_layout: Layout = field(default_factory=lambda: Layout.contiguous(3))
    k_cache_layout: Layout = field(default_factory=lambda: Layout.contiguous(4))
    v_cache_layout: Layout = field(default_factory=lambda: Layout.contiguous(4))
    loc_step: int = 1
    k_scale: Scale = Scale()
    v_scale: Scale = Scale()
    seed: int = 0
    overrides: tuple[Override, ...] = ()
    recipe: str = "unfused"
    checked: bool = False
    cache_format: str = "fp8_e4m3"  # the bytes' format: a float8 cache's own, or cache_dtype= for uint8
    format_alias: bool = False  # a format argument spelled by its other name (vLLM's "fp8_e4m3" for "fp8")
    # Rows of K and V past the last token, which no slot names: vLLM's CUDA-graph padding, where the batch's T is
    # slot_mapping's length and the keys may be longer (vllm#13922). Only a convention that takes them passes them.
    padded_rows: int = 0
    # Whose values V holds: "own" (the "v" stream and V's overrides), or "k" (K's, overrides included): k and v
    # passed as one tensor (strategies.overlap's "same" sharing), so that the Case alone, in buffers of its own,
    # replays what V's path was given.
    v_values: Literal["own", "k"] = "own"

    def __post_init__(self) -> None:
        if self.v_values not in ("own", "k"):
            raise ValueError(f"Case.v_values must be 'own' or 'k', got {self.v_values!r}")
        if self.cache_format not in CACHE_FORMATS:
            raise ValueError(f"Case.cache_format must be one of {CACHE_FORMATS}, got {self.cache_format!r}")
        if self.cache_dtype != "uint8" and self.cache_dtype != FP8_CACHE_DTYPES[self.cache_format]:
            raise ValueError(f"Case.cache_dtype {self.cache_dtype} contradicts cache_format {self.cache_format}")
        if self.padded_rows < 0:
            raise ValueError(f"Case.padded_rows must be >= 0, got {self.padded_rows}")
        if len(self.cache_loc) != self.num_tokens:
            raise ValueError(f"Case.cache_loc has {len(self.cache_loc)} entries for {self.num_tokens} tokens")
        bits = 32 if self.loc_dtype == "int32" else 64
        outside = [s for s in self.cache_loc if not -2**(bits - 1) <= s < 2**(bits - 1)]
        if outside:  # the builder would wrap it to another slot, silently
            raise ValueError(f"Case.cache_loc holds {outside[0]}, which {self.loc_dtype} cannot hold")

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self.num_tokens, self.num_heads, self.head_dim)

    @property
    def cache_shape(self) -> tuple[int, int, int, int]:
        return (self.num_pages, self.page_size, self.num_heads, self.head_dim)

    def replace(self, **changes: Any) -> Case:
        return dataclasses.replace(self, **changes)

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Case:
        d = dict(d)
        for key in ("k_layout", "v_layout", "k_cache_layout", "v_cache_layout"):
            lay = d[key]
            d[key] = Layout(tuple(lay["order"]), tuple(lay["extra"]), lay["step"], lay["offset"])
        for key in ("k_scale", "v_scale"):
            d[key] = Scale(**d[key])
        d["overrides"] = tuple(Override(**o) for o in d["overrides"])
        d["cache_loc"] = tuple(d["cache_loc"])
        return Case(**d)

    @staticmethod
    def from_json(text: str) -> Case:
        return Case.from_dict(json.loads(text))
