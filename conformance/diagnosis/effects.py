"""Effects: what a defect does, read from a whole diff. An explanation counts only when it accounts
for every differing byte of the call.

Two kinds of explanation are tried on a replayed Case (reference and implementation on the same bytes):
- placement models: the reference itself, called with one argument misread the way real kernels
  misread it (inputs or cache_loc read as contiguous, one cache written with the other's strides,
  padding or out-of-range slots written somewhere). One explains the call when the reference's
  bytes under it equal the implementation's over both whole cache buffers.
- value models: each written byte as a function of its own token's input (another recipe, another
  scale, subnormal results flushed to zero, rounding toward zero, a value cast into a uint8 cache,
  a NaN or zero sign, one ulp off). One explains the call when the bytes of every written slot equal
  it and nothing else differs.
When none does, the effect is "unexplained", with a summary of the byte pairs: no guess.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from conformance.cachemap import CACHES, byte_index, written_mask, written_slots
from conformance.diagnosis.classify import _quantized, _Rows, _scale_value, _scale_variant_values, _sign_pairs
from kernel import RECIPES, naive_fp8_set_kv_buffer
from kernel.plan import ScaleArg, _self_overlapping
from kernel.recipe import NAN_BYTE, Recipe, get_recipe
from kernel.reference import (
    CACHE_FORMATS,
    INPUT_FORMATS,
    _finite_bytes,
    _magnitudes,
    encode_fp8,
    round_to_grid,
    round_to_input_dtype,
    scaled,
)
from strategies.build import SCALE_GUARD, Built
from strategies.case import FP8_CACHE_DTYPES, Case


@dataclass
class Effect:
    """One explanation of a whole diff: its key (the defect's identity with the trigger), its words."""

    key: str
    title: str
    detail: str = ""
    value: bool = False  # a value effect: a function of each token's own input
    alternatives: list[str] = field(default_factory=list)  # other keys that explain the same bytes
    # an unexplained diff's expected bytes by kind of value (byte_kinds' names): what the report weighs, so
    # that it never reads them back from the detail's words
    value_kinds: tuple[str, ...] = ()
    # the value rule a subnormal-path effect was read beside, in one call (_normal_values_rule)
    beside: str = ""


TITLES = {
    "flush-to-zero": "flushes subnormal results (of the cache's format) to zero",
    "flush-to-zero:inputs": "reads subnormal inputs as zero (denormals-are-zero: |x| below 2**-126, fp32's "
                            "smallest normal)",
    "rounds-toward-zero": "rounds toward zero instead of to nearest-even",
    "rounds-ties-away": "rounds ties away from zero instead of to even",
    "rounds-ties-to-odd": "rounds ties to odd instead of to even (the tie's other neighbour: a rounding step's "
                          "arms swapped)",
    "rounds-ties-toward-zero": "rounds ties toward zero instead of to even (rounds up only past the halfway point)",
    "rounds-sticky-lost": "rounds every value past a halfway point as a tie, to even (its rounding drops the bits "
                          "below the first one it cuts: the sticky bits)",
    "carry-lost": "loses the carry of a value rounding up to a power of two (writes half of it: the exponent taken "
                  "before rounding)",
    "input-misread:bfloat16": "reads its input's bytes as bfloat16 (another input dtype's path: float16 bits as "
                              "bfloat16, or float32 read through a bfloat16 pointer)",
    "input-misread:fp16-subnormals": "widens float16 inputs by the exponent rebias alone, right for normal values "
                                     "only: ±0 and subnormals read as ±2**-15 x (1 + m/1024)",
    "input-misread:float16": "reads its input's bytes as float16 (another input dtype's path: bfloat16 bits as "
                             "float16, or float32 read through a float16 pointer)",
    "rounding:unrounded": "does not round its quotient or product to fp32 before the fp8 rounding (a float64 "
                          "intermediate, or the multiply fused into the conversion)",
    "approximate-division": "is not correctly rounded: within two fp32 ulps of the recipe's value before the "
                            "e4m3 cast (an approximate division or reciprocal)",
    "off-by-one-ulp": "is not correctly rounded: within one e4m3 ulp of the recipe's byte",
    "input-rounded:bfloat16": "converts its inputs to bfloat16 before quantizing (float32 or float16 inputs: a "
                              "double rounding)",
    "input-rounded:float16": "converts its inputs to float16 before quantizing (float32 inputs: a double rounding; "
                             "bfloat16 inputs: past ±65504 they overflow to inf, small ones lose bits)",
    "storage:value-cast": "converts fp8 values numerically into a uint8 cache instead of copying their bits",
    "storage:sign-negated": "writes a negative value's byte as 256 minus its magnitude byte (the sign applied by "
                            "negating through an int8 view, two's complement, where the format has a sign bit)",
    "format:e4m3-bytes": "writes e4m3 bytes into a cache of another format (the format it is told is ignored)",
    "format:e5m2-bytes": "writes e5m2 bytes into a cache of another format (the format taken from elsewhere)",
    "format:e4m3fnuz-bytes": "writes e4m3fnuz bytes into a cache of another format (the format taken from "
                             "elsewhere)",
    "scale:ignored": "ignores a scale (writes a cache as if its scale were 1.0)",
    "scale:swapped": "writes a cache with the other cache's scale",
    "scale:inverted": "multiplies by the scale instead of dividing by it",
    "scale:near-one-ignored": "takes a scale near 1 for 1 and skips it (a unit-scale fast path with a tolerance)",
    "scale:held-float16": "holds the scale in float16 (rounds it before using it)",
    "scale:held-bfloat16": "holds the scale in bfloat16 (rounds it before using it)",
    "scale:power-of-two": "rounds its scale up to a power of two before using it (a UE8M0 scale's ceil)",
    "subnormal-path": "writes wrong bytes for some values below the format's smallest normal (its subnormal "
                      "range), every normal value right, by no rule the suite models: a wrong step of the "
                      "encoder's subnormal path (its denormalizing shift, implicit bit or flush bound)",
    "subnormal-shift": "writes each value below the format's smallest normal (its subnormal range) at twice or "
                       "half its value, normal values right (a software encoder's denormalizing shift one bit short "
                       "or long: the subnormal exponent taken as -bias, not 1 - bias)",
    "scale:exponent-off-by-one": "uses twice or half its scale, at least where it is a power of two (an exponent "
                                 "off by one: frexp's mantissa lies in [0.5, 1), not [1, 2))",
    "encoding:inf-kept": "writes an infinite quotient as the format's ±inf where the recipe saturates (finite "
                         "overflow saturated: a cast that propagates inf)",
    "encoding:overflow-inf": "writes ±inf past the format's range where the recipe saturates (a cast without "
                             "saturation)",
    "encoding:e5m2-top-exponent-finite": "rounds past e5m2's 57344 onto its reserved top exponent, read as finite "
                                         "(e4m3fn's rule), and saturates at 98304: it writes inf and NaN bytes "
                                         "where the recipe saturates (a largest value derived by another format's "
                                         "rule)",
    "storage:or-old": "ORs its bytes into the slot's old bytes (a store that takes the cache to be zeroed)",
    "storage:added-to-old": "adds its bytes to the slot's old bytes, mod 256 (a scatter that accumulates, "
                            "`index_put_(..., accumulate=True)`, where it should store)",
    "double-rounding:float16": "rounds each value to fp16 before the cast (two roundings: a value near a midpoint "
                               "of the cache's grid can go the wrong way)",
    "double-rounding:bfloat16": "rounds each value to bf16 before the cast (two roundings: a value near a midpoint "
                                "of the cache's grid can go the wrong way)",
    "input-clamped:dtype-max": "clamps its inputs to their dtype's largest finite value before the scale (±inf "
                               "is written as ±max/s where the recipe writes the format's ±inf or ±max)",
    "input-clamped": "clamps its inputs to the format's range before the scale (past ±max it writes ±max/s where "
                     "the recipe gives x/s)",
    "input-clamped:nan-to-num": "replaces non-finite inputs before the scale, as `torch.nan_to_num` does: NaN "
                                "becomes 0 and ±inf its dtype's ±largest finite value (NaN written as ±0, ±inf "
                                "as ±max/s, where the recipe gives the NaN byte and the format's ±inf or ±max)",
    "scale:none-read-from-input": "reads a scale given as None from an input's memory (a placeholder pointer "
                                  "loaded: the input's first value as the scale, or as its reciprocal)",
    "scale:applied-twice": "scales its inputs twice (x / s / s: a pre-scaled tensor scaled again)",
    "scale:dynamic": "computes its own scale from the data (the tensor's absolute maximum over the format's "
                     "largest value) instead of the one given",
    "strides:inputs-ignored": "reads its inputs ignoring their strides (as if contiguous)",
    "strides:inputs-heads-ignored": "reads each token's row as if packed: its head or dim strides (or both) "
                                    "ignored, its token stride kept",
    "strides:cache-loc-ignored": "reads cache_loc ignoring its stride (as if contiguous)",
    "strides:input-2d-as-dh": "reads a 2-D input [T, H*D] as [T, D, H] (its two dimensions swapped)",
    "strides:other-cache": "writes one cache with the other cache's strides",
    "strides:other-input": "reads one input with the other input's strides",
    "strides:cache-ignored": "writes a cache ignoring its strides (as if contiguous)",
    "strides:cache-head-major": "addresses a [pages, page_size, H, D] cache as [pages, H, page_size, D] (a "
                                "head-major, HND, page for an NHD one)",
    "strides:cache-page-stride": "addresses a cache's pages (or slots) with a stride computed from its shape, not "
                                 "the tensor's own (its other strides honoured)",
    "strides:cache-from-input": "addresses a cache with its input's head or dim stride (the input's stride "
                                "passed where the cache's goes)",
    "strides:cache-axis-stride": "addresses a cache's heads with its dim stride, or its dims with its head stride "
                                 "(one of its own strides read at another axis)",
    "strides:cache-inner-stride": "addresses a cache's heads, dims or slots within a page with a stride computed "
                                  "from its shape, not the tensor's own (its other strides honoured)",
    "overrun:tile": "writes each token as a tile of the next power of two heads and dims, lanes past H or D not "
                    "masked: bytes past a head's row or past the last head (the next head's first bytes, a padded "
                    "cache's gap, the next slot or past the cache)",
    "overrun:rows": "writes a token past the batch (a row mask that lets row T through: `<=` for `<`, or a tile's "
                    "rows past T unmasked): cache_loc[T] and the inputs' row T read past their ends, or zeros at "
                    "slot 0",
    "scale:read-past-tensor": "reads a one-element scale tensor once per head (a stride of 1 where the scale "
                              "broadcasts): head h divided by the h-th word from its start, past its one element",
    "strides:offset-ignored": "addresses a tensor from its storage's start, not the view's (its storage offset "
                              "dropped)",
    "kv-mixed:caches-swapped": "writes K into value_cache and V into key_cache (the caches swapped)",
    "kv-mixed:inputs-swapped": "quantizes V into key_cache and K into value_cache, each with its cache's scale (the "
                               "inputs swapped)",
    "kv-mixed:k-for-v": "writes K's values into value_cache too (V's input never read)",
    "kv-mixed:v-for-k": "writes V's values into key_cache too (K's input never read)",
    "kv-mixed:v-into-k-cache": "stores V through key_cache's pointer, at value_cache's offsets: V's bytes land in "
                               "key_cache's memory and value_cache is never written",
    "kv-mixed:nan-mask": "fixes up NaN where the other input is NaN (one input's NaN mask applied to the other's "
                         "bytes: the NaN byte where the other is NaN, the cast's own NaN where only this one is)",
    "padding:before-start": "writes padding tokens (negative cache_loc) at their own negative slot, before the "
                            "cache's start (no padding check)",
    "padding:wraps-to-end": "writes padding tokens (negative cache_loc) at slot num_slots + cache_loc[t] "
                            "(indexed from the end, as a floor division or a negative index does)",
    "padding:slot-0": "writes padding tokens (negative cache_loc) to slot 0",
    "wrong-slot:slot-0-zeroed": "writes zeros to slot 0 for each token that writes nothing (padding, out of range): an "
                            "unpredicated store of `where(valid, q, 0)` at a dummy slot 0",
    "padding:slots-compacted": "writes token i to the i-th non-negative slot (padding dropped from cache_loc but "
                               "not from the inputs; or the i-th slot in range, out-of-range slots dropped too)",
    "out-of-range:written": "writes tokens whose slot is out of range instead of skipping them",
    "out-of-range:wrong-bound": "skips in-range slots past a wrong number of slots (the cache's size read from "
                                "another dimension)",
    "encoding:nan-sign": "keeps the sign of a negative NaN (0xFF where every recipe writes 0x7F)",
    "encoding:e5m2-inf-fixup": "writes ±384 as ±352 (0x7C/0xFC as 0x7B/0xFB): e5m2's fix-up of its ±inf bytes "
                               "run on an e4m3 cache, where those bytes are finite",
    "encoding:saturates": "saturates to ±448 where the recipe gives NaN",
    "encoding:nan-past-448": "gives NaN past ±448 where the recipe saturates",
    "encoding:nan-produced": "writes NaN where the recipe gives a finite byte",
    "encoding:inf-nan": "writes NaN for an infinite value where the recipe saturates (finite values past 464 "
                        "saturate)",
    "encoding:nan-lost": "writes a finite byte where the recipe gives NaN",
    "encoding:e4m3-nan-byte": "writes e4m3fn's NaN byte 0x7F for NaN into an e4m3fnuz cache (+240 there; fnuz's "
                              "NaN is 0x80)",
    "encoding:overflow-zero": "writes ±0 where the recipe saturates to ±448 (an exponent that overflows its field "
                              "wraps to zero)",
    "encoding:overflow-sign": "saturates with the wrong sign (±448 of the other sign: the sign lost on overflow)",
    "sign:dropped": "writes negative results with a positive sign (the sign bit lost, for the kinds of value "
                    "named)",
    "sign:added": "writes positive results with a negative sign (the sign bit set, for the kinds of value named)",
    "zero-sign:plus": "writes +0 (0x00) for -0 (drops the sign of zero)",
    "zero-sign:minus": "writes -0 (0x80) for +0",
    "wrong-slot:unwritten": "leaves slots that tokens name unwritten",
    "wrong-slot:page-rest-zeroed": "zeroes the slots of each page it writes that no token names (writes whole "
                                   "pages)",
    "wrong-slot:loc-int32-words": "reads an int64 cache_loc as int32 words (token t gets the t-th 32-bit word: "
                                  "slots and their zero high halves in turn)",
    "wrong-slot:rows-repeated": "writes (token, head) row r = t x H + h at slot cache_loc[r mod T] (the slots "
                                "repeated H times, `repeat`, where each belongs to its token's H rows, "
                                "`repeat_interleave`)",
    "wrong-bytes:unexplained": "writes wrong bytes that no recipe, scale, rounding or encoding rule explains",
    "strides:heads-permuted": "writes a token's heads in the wrong order (each head's bytes under another head)",
    "strides:dims-permuted": "writes each head's dims in the wrong order (each dim's byte under another dim)",
    "input-misread:zeros": "reads every input value as +0 (a load masked off, or a bf16's bits shifted out of a "
                           "16-bit integer before widening)",
    "strides:rows-permuted": "writes each (token, head) row's bytes under another token's row (the batch's rows "
                             "permuted across tokens: a reshape where a transpose was meant, or a row index "
                             "computed wrongly)",
    "wrong-slot:tokens-moved": "writes whole tokens at wrong slots (each token's own bytes, at a slot computed "
                               "wrongly)",
    "wrong-slot:unexplained": "writes bytes in the wrong places, in a way no misread argument explains",
}


def title_of(key: str, held: str = "") -> str:
    effect = key.split("@", 1)[0]
    if effect.startswith("saturates-low:"):
        return f"saturates at ±{effect.split(':', 1)[1]}, below the format's largest finite value"
    if effect.startswith("strides:dims-reversed:"):
        return (f"writes each group of {effect.rsplit(':', 1)[1]} dims of a head in reverse order (a vector store "
                "packing its bytes in the wrong order)")
    if effect.startswith("strides:dims-halves-swapped:"):
        return (f"writes each group of {effect.rsplit(':', 1)[1]} dims of a head with its two halves swapped (a "
                "wide store's word built from its two half-words in the wrong order)")
    if effect.startswith("encoding:overflow-at:"):
        return (f"writes a quotient past the format's range as ±{effect.rsplit(':', 1)[1]}, another format's "
                "largest value, where the recipe saturates at the format's own (a saturation step's constant "
                "kept from another format's path)")
    if effect.startswith("encoding:nan-byte:"):
        return (f"writes NaN as {effect.rsplit(':', 1)[1]}, another NaN encoding of the cache's format than the "
                "recipe's (a NaN constant taken from another type: fp16's canonical NaN's high byte is 0x7E)")
    if effect.startswith("exponent-bias:"):
        bias = effect.split(":", 1)[1]
        return (f"rebiases the exponent by {bias}, another format's bias, not the cache format's own: each byte is "
                f"the format's byte of the value times a power of two (a software encoder's bias constant taken "
                "from another format's path)")
    if effect.startswith("subnormal-grid:"):
        emin = effect.split(":", 1)[1]
        return (f"rounds values below 2**{emin} onto the subnormal grid of a format whose smallest normal is "
                f"2**{emin} (another format's), coarser than the cache's")
    if effect.startswith("scale:floored:"):
        return f"puts a floor of {effect.split(':', 2)[2]} under its scale (a smaller scale, legal, is not used)"
    if effect.startswith("rounding:") and effect not in TITLES:
        return f"computes {effect.split(':', 1)[1]}" + (f" where {held} is asked" if held else "")
    if effect.startswith("encoding:") and "+" in effect:
        return "; ".join(TITLES.get("encoding:" + part, part) for part in effect.split(":", 1)[1].split("+"))
    return TITLES.get(effect, effect)


# -- placement models: the reference with one argument misread -------------------------------------

def _contiguous_strides(shape: torch.Size, keep_first: int | None = None) -> tuple[int, ...]:
    strides, running = [0] * len(shape), 1
    for i in reversed(range(len(shape))):
        strides[i] = running
        running *= shape[i]
    if keep_first is not None:
        strides[0] = keep_first
    return tuple(strides)


#: How far past its buffer a misread view may reach and still be simulated (elements).
MAX_OVERRUN = 1 << 24


def _same_strides(t: torch.Tensor, strides: tuple[int, ...]) -> bool:
    """Whether t already has these strides, but for dims of size 1 (whose stride reads nothing)."""
    return all(n == 1 or a == b for n, a, b in zip(t.shape, t.stride(), strides))


def _restrided(t: torch.Tensor, buf: torch.Tensor, strides: tuple[int, ...], offset: int,
               after: list | None = None, shape: tuple[int, ...] | None = None) -> torch.Tensor | None:
    """buf (viewed as t's dtype) read with t's shape (or `shape`) and these strides. A view that leaves buf is
    made over a longer copy of it (a kernel misreading strides writes past its buffer too): with `after`,
    the copy's first bytes go back into buf once the reference has written; without, None."""
    typed = buf if buf.dtype == t.dtype else buf.view(t.dtype)
    shape = tuple(t.shape) if shape is None else shape
    last = offset + sum((n - 1) * s for n, s in zip(shape, strides) if n > 0)
    if offset < 0 or min(strides, default=0) < 0:
        return None
    if last < typed.numel():
        return typed.as_strided(shape, strides, offset)
    if after is None or last - typed.numel() > MAX_OVERRUN:
        return None
    longer = torch.zeros(last + 1, dtype=typed.dtype, device=typed.device)
    longer[:typed.numel()] = typed
    after.append(lambda: typed.copy_(longer[:typed.numel()]))
    return longer.as_strided(shape, strides, offset)


def _inputs(names: tuple[str, ...], heads_only: bool) -> Callable[[Built], dict | None]:
    def call(b: Built) -> dict | None:
        out = b.call()
        for name in names:
            t = getattr(b, name)
            keep = t.stride(0) if heads_only else None
            strides = _contiguous_strides(t.shape, keep)
            if _same_strides(t, strides):
                return None
            out[name] = _restrided(t, b.buffers[name], strides, t.storage_offset())
            if out[name] is None:
                return None
        return out
    return call


def _input_2d_as_dh(b: Built) -> dict | None:
    """A 2-D input [T, H*D] read as [T, D, H] (a flattened layout's two dimensions swapped)."""
    if b.case.input_rank != 2 or b.case.num_heads < 2 or b.case.head_dim < 2:
        return None
    out = b.call()
    for name in ("k", "v"):
        t = getattr(b, name)
        out[name] = t.reshape(t.shape[0], b.case.head_dim, b.case.num_heads).transpose(1, 2)
    return out


def _loc_contiguous(b: Built) -> dict | None:
    if b.case.loc_step == 1 or b.case.num_tokens == 0:
        return None
    return {**b.call(), "cache_loc": b.buffers["cache_loc"][:b.case.num_tokens]}


def _other_cache(target: str) -> Callable[[Built], dict | None]:
    source = "k_cache" if target == "v_cache" else "v_cache"

    def call(b: Built) -> dict | None:
        t, s = getattr(b, target), getattr(b, source)
        if _same_strides(t, tuple(s.stride())):
            return None
        after: list = []  # the kernel's pointer is this cache's own: its offset, the other cache's strides
        view = _restrided(t, b.buffers[target], tuple(s.stride()), t.storage_offset(), after)
        return None if view is None else {**b.call(), target: view, "_after": after,
                                          "_token_by_token": _self_overlapping(view)}
    return call


def _other_input(target: str) -> Callable[[Built], dict | None]:
    """One input read with the other's strides (one stride set passed for both), from its own buffer and
    offset; None where that read leaves its buffer (memory the reference cannot know)."""
    source = "k" if target == "v" else "v"

    def call(b: Built) -> dict | None:
        t, s = getattr(b, target), getattr(b, source)
        if _same_strides(t, tuple(s.stride())):
            return None
        view = _restrided(t, b.buffers[target], tuple(s.stride()), t.storage_offset())
        return None if view is None else {**b.call(), target: view}
    return call


def _mixed(k: str, v: str, k_cache: str, v_cache: str) -> Callable[[Built], dict | None]:
    """K and V mixed up: the call with its inputs or caches taken from the other's place (K-first and V-first
    layouts confused; one pointer passed twice)."""
    def call(b: Built) -> dict | None:
        out = b.call()
        return {**out, "k": out[k], "v": out[v], "k_cache": out[k_cache], "v_cache": out[v_cache]}
    return call


def _stored_through(k_into: str, v_into: str) -> Callable[[Built], dict | None]:
    """K's bytes stored through k_into's pointer and V's through v_into's, each at its own cache's offsets and
    strides, K first (one base pointer passed for both stores). None where such a store leaves that buffer:
    memory the reference cannot know."""
    def call(b: Built) -> dict | None:
        views = {}
        for side, into in (("k_cache", k_into), ("v_cache", v_into)):
            views[side] = _restrided(getattr(b, side), b.buffers[into], tuple(getattr(b, side).stride()),
                                     getattr(b, side).storage_offset())
            if views[side] is None:
                return None

        def writer(c: dict) -> None:
            for side, other in (("k_cache", "v_cache"), ("v_cache", "k_cache")):
                # the side's bytes into a copy of where they land, the other side's into a throwaway cache
                landed = views[side].clone()
                naive_fp8_set_kv_buffer(**{**c, side: landed, other: c[other].clone()})
                views[side].copy_(landed)
        return {**b.call(), "_writer": writer}
    return call


def _caches_misread(names: tuple[str, ...], strides_of: Callable[[torch.Tensor, torch.Tensor], tuple[int, ...] | None]
                    ) -> Callable[[Built], dict | None]:
    """The call with each named cache written through its own buffer and offset at the strides a kernel
    misreads: strides_of(cache, its input) is None, or the cache's own strides, where that misreading changes
    nothing."""
    def call(b: Built) -> dict | None:
        out = {**b.call(), "_after": []}
        for name in names:
            t = getattr(b, name)
            strides = strides_of(t, getattr(b, name.split("_")[0]))
            if strides is None or _same_strides(t, strides):
                return None
            out[name] = _restrided(t, b.buffers[name], strides, t.storage_offset(), out["_after"])
            if out[name] is None:
                return None
            out["_token_by_token"] = out.get("_token_by_token", False) or _self_overlapping(out[name])
        return out
    return call


def _head_major(names: tuple[str, ...]) -> Callable[[Built], dict | None]:
    """A [pages, page_size, H, D] cache addressed as [pages, H, page_size, D] (HND for NHD): row (offset, head)
    of a page written at row head * page_size + offset of the cache's own rows."""
    def strides(t: torch.Tensor, _input: torch.Tensor) -> tuple[int, ...] | None:
        if t.dim() != 4 or t.shape[1] == 1 or t.shape[2] == 1:
            return None
        return t.stride(0), t.stride(2), t.shape[1] * t.stride(2), t.stride(3)
    return _caches_misread(names, strides)


def _cache_contiguous(names: tuple[str, ...], outer_only: bool = False) -> Callable[[Built], dict | None]:
    """Caches written as if contiguous; outer_only: only the outermost stride (a page's, or a 3-D cache's
    slot's) taken from the shape, the others the tensor's own (a block stride hard-coded as page_size x H x D)."""
    def strides(t: torch.Tensor, _input: torch.Tensor) -> tuple[int, ...]:
        contiguous = _contiguous_strides(t.shape)
        return (contiguous[0], *t.stride()[1:]) if outer_only else contiguous
    return _caches_misread(names, strides)


def _cache_inner_stride(names: tuple[str, ...], axis: int) -> Callable[[Built], dict | None]:
    """Caches written with one inner stride (a head's, a dim's, a slot's within a page) computed from the
    shape as if contiguous, the others the tensor's own: `h * head_dim` for `h * stride(2)` (an HND, padded or
    interleaved cache's heads land on other rows)."""
    def strides(t: torch.Tensor, _input: torch.Tensor) -> tuple[int, ...] | None:
        if t.dim() + axis < 1:  # the outermost stride is cache-page-stride's
            return None
        own = list(t.stride())
        own[axis] = _contiguous_strides(t.shape)[axis]
        return tuple(own)
    return _caches_misread(names, strides)


def _cache_axis_stride(names: tuple[str, ...], axis: int, source: int) -> Callable[[Built], dict | None]:
    """Caches addressed with one of their own strides at another axis: the head stride read where the dim
    stride is (a 3-D cache's strides indexed as a 4-D one's, `stride(2)` for its heads: ROCm/aiter#4531), or
    the dim stride where the head stride is. A token's heads then overlap, and which of its writes to one byte
    lands is the kernel's order: any of them may (`check`)."""
    def strides(t: torch.Tensor, _input: torch.Tensor) -> tuple[int, ...] | None:
        own = list(t.stride())
        if own[axis] == own[source]:
            return None
        own[axis] = own[source]
        return tuple(own)
    model = _caches_misread(names, strides)
    model.check = _any_writer(names, strides)
    return model


def _any_writer(names: tuple[str, ...], strides_of: Callable[[torch.Tensor, torch.Tensor], tuple[int, ...] | None]
                ) -> Callable[[Built, Callable[[], Built]], bool]:
    """Whether the implementation's bytes are the reference's moved to the misread strides, each byte that
    several of a call's writes reach holding one of theirs, every other byte its old one (the named caches), or
    the reference's (the others). Distinct slots only: which token lands on a shared slot is another question."""
    def check(actual: Built, fresh: Callable[[], Built]) -> bool:
        case = actual.case
        slots = [s for s in case.cache_loc if 0 <= s < case.num_slots]
        if len(set(slots)) != len(slots):
            return False
        expected, before = _modelled(lambda c: c.call(), fresh), fresh()
        if expected is None:
            return False
        for name in CACHES:
            a, e = actual.buffers[name].cpu(), expected.buffers[name].cpu()
            if name not in names:
                if not torch.equal(a, e):
                    return False
                continue
            t = getattr(before, name)
            misread = strides_of(t, getattr(before, name.split("_")[0]))
            if misread is None:
                return False
            flat = torch.arange(a.numel(), dtype=torch.int64)
            rows = t.shape[0] * (t.shape[1] if t.dim() == 4 else 1)
            try:
                to = flat.as_strided(t.shape, misread, t.storage_offset()).reshape(rows, *t.shape[-2:])[slots]
            except RuntimeError:  # the misread strides reach past the buffer
                return False
            source = byte_index(case, name).flatten(0, 1)[slots]
            reached, landed = _landed(a, to.flatten(), e[source.flatten()])
            if not bool(landed[reached].all()) or not torch.equal(a[~reached], before.buffers[name].cpu()[~reached]):
                return False
        return True
    return check


def _landed(a: torch.Tensor, to: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the bytes of `a` that writes of `values` at `to` reach; those of them holding one of their values): where
    several writes reach one byte, any of them may land last."""
    reached = torch.zeros(a.numel(), dtype=torch.bool)
    reached[to] = True
    hits = torch.zeros(a.numel(), dtype=torch.int64).index_add_(0, to, (a[to] == values).long())
    return reached, hits > 0


def _cache_from_input(names: tuple[str, ...], axis: int) -> Callable[[Built], dict | None]:
    """Caches addressed with their own input's head (axis -2) or dim (axis -1) stride, in elements, for their
    own: a kernel that passes `key.stride(1)` where `key_cache.stride(-2)` goes. Shows wherever the two
    strides differ, a strided input or a strided cache; with a contiguous input it is the stride computed
    from the shape (cache-inner-stride's reading), which report._merge_stride_source joins to it."""
    def strides(t: torch.Tensor, x: torch.Tensor) -> tuple[int, ...] | None:
        if x.dim() != 3:
            return None
        own = list(t.stride())
        own[axis] = x.stride(axis)
        return tuple(own)
    return _caches_misread(names, strides)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


#: A tile of the next power of two heads and dims, and which of its lanes a kernel's mask lets through: past (H, D)
#: the dims (a mask on the heads only), the heads (a mask on the dims only), or both but the corner (`|` for `&`);
#: or its heads bounded by D (`h < head_size` for `h < num_heads`): heads past D are never written, and where H < D
#: the tile's heads past H are.
TILE_LANES = {"dims": lambda h, d, H, D: h < H, "heads": lambda h, d, H, D: d < D,
              "heads or dims": lambda h, d, H, D: h < H or d < D,
              "heads bounded by D": lambda h, d, H, D: h < D and d < D}


def _stray_lanes(lanes: str, heads: int, dim: int) -> list[tuple[int, int]]:
    """The (head, dim) lanes of the tile past (H, D) that TILE_LANES[lanes] leaves unmasked."""
    return [(h, d) for h in range(_pow2(heads)) for d in range(_pow2(dim))
            if (h >= heads or d >= dim) and TILE_LANES[lanes](h, d, heads, dim)]


def _tile_overrun(b: Built, extra: list[tuple[int, int]], zeros: bool, t: int, slot: int) -> None:
    """Token t's stray lanes `extra`, stored at the cache's own strides past each head's row or past the last
    head (into the next head's first bytes, a padded cache's gap, the next slot or past the view): the input's
    elements at those positions of its own strides (its next head's, or the next token's), or zeros. Raises
    where either lies outside its buffer (the reference cannot model it)."""
    case = b.case
    dim = case.head_dim
    for x_name, cache_name, scale in (("k", "k_cache", case.k_scale), ("v", "v_cache", case.v_scale)):
        x, cache = getattr(b, x_name), getattr(b, cache_name)
        xs = x.stride() if x.dim() == 3 else (x.stride(0), dim * x.stride(1), x.stride(1))
        cs = cache.stride() if cache.dim() == 4 else (cache.stride(0), 0, *cache.stride()[1:])
        ps = cache.shape[1] if cache.dim() == 4 else 1
        src = [x.storage_offset() + t * xs[0] + h * xs[1] + d * xs[2] for h, d in extra]
        dst = [cache.storage_offset() + (slot // ps) * cs[0] + (slot % ps) * cs[1] + h * cs[2] + d * cs[3]
               for h, d in extra]
        typed, raw = b.buffers[x_name].view(x.dtype), b.buffers[cache_name]
        if max(src) >= typed.numel() or max(dst) >= raw.numel():
            raise IndexError("a lane leaves its buffer")
        values = torch.zeros(len(src), dtype=x.dtype) if zeros else typed.cpu()[torch.tensor(src)]
        q = _quantized(values.reshape(1, 1, -1).to(x.device), _scale_value(scale), case.recipe, case.cache_format)
        raw[torch.tensor(dst, device=raw.device)] = q.reshape(-1).to(raw.device)


def _tile(lanes: str, zeros: bool) -> Callable[[Built], dict | None]:
    """Each token written as a tile of the next power of two heads and dims with some lanes past (H, D) not
    masked (a mask-free fast path chosen where D is not the tile's width; a mask `|` for `&`): token by token,
    in token order, each token's stray lanes, then its own row over them (a later head's real bytes win over
    an earlier head's stray ones, as the lanes of one tile store land in order)."""
    def call(b: Built) -> dict | None:
        case = b.case
        heads, dim = case.num_heads, case.head_dim
        extra = _stray_lanes(lanes, heads, dim)
        kept = sum(TILE_LANES[lanes](h, 0, heads, dim) for h in range(heads))  # a prefix of the heads
        if case.num_tokens == 0 or not extra and kept == heads or kept == 0:
            return None

        def writer(c: dict) -> None:
            for t, slot in enumerate(c["cache_loc"].tolist()):
                if 0 <= slot < case.num_slots:
                    if extra:
                        _tile_overrun(b, extra, zeros, t, slot)
                    row = {n: c[n][t:t + 1].reshape(1, heads, dim)[:, :kept] for n in ("k", "v")}
                    caches = {n: c[n][..., :kept, :] for n in CACHES}
                    naive_fp8_set_kv_buffer(**{**c, **row, **caches, "cache_loc": c["cache_loc"][t:t + 1]})
        return {**b.call(), "_writer": writer}
    return call


def _row_past(b: Built, name: str, zeros: bool) -> torch.Tensor:
    """Input `name`'s row T, one past its last, as a [1, ...] view: read at its own strides from its buffer (the
    build's poison past the last token), or zeros. Raises where row T leaves the buffer (the reference cannot
    model it)."""
    t = getattr(b, name)
    if zeros:
        return t.new_zeros((1, *t.shape[1:]))
    typed = b.buffers[name].view(t.dtype)
    offset = t.storage_offset() + t.shape[0] * t.stride(0)
    if offset + sum((n - 1) * s for n, s in zip(t.shape[1:], t.stride()[1:])) >= typed.numel():
        raise IndexError("row T leaves its buffer")
    return typed.as_strided((1, *t.shape[1:]), t.stride(), offset)


def _past_batch(slot: str, zeros: bool, last: bool) -> Callable[[Built], dict | None]:
    """The call with a token past the batch written too (a row mask that lets row T through, `<=` for `<`, or a
    tile's rows past T stored unmasked): at cache_loc's next entry (past its end) or at slot 0 (a slot load
    masked with other=0), with the inputs' row T (past their ends) or zeros (loads masked with other=0). At slot
    0 the stray write lands before or after the batch's own, in either order a GPU's stores may take."""
    def call(b: Built) -> dict | None:
        case = b.case
        if slot == "loc":
            at = case.num_tokens * case.loc_step
            loc = b.buffers["cache_loc"][at:at + 1]
            if not 0 <= int(loc[0]) < case.num_slots:
                return None
        else:
            loc = b.cache_loc.new_zeros(1)
        out = b.call()
        stray = {**out, "cache_loc": loc, "k": _row_past(b, "k", zeros), "v": _row_past(b, "v", zeros)}

        def writer(c: dict) -> None:
            order = (c, {**stray, "k_cache": c["k_cache"], "v_cache": c["v_cache"]})
            for one in order if last else order[::-1]:
                naive_fp8_set_kv_buffer(**one)
        return {**out, "_writer": writer}
    return call


def _offset_ignored(names: tuple[str, ...]) -> Callable[[Built], dict | None]:
    """Tensors addressed from their storage's start, their strides kept: a kernel that takes the storage's
    pointer (`storage().data_ptr()`, `as_strided(..., 0)`) for the view's drops its storage offset. Every
    tensor the suite builds sits past a guard band, so this shows on every call."""
    def call(b: Built) -> dict | None:
        out = {**b.call(), "_after": []}
        for name in names:
            t = getattr(b, name)
            if t.storage_offset() == 0:
                return None
            after = out["_after"] if name in CACHES else None
            out[name] = _restrided(t, b.buffers[name], tuple(t.stride()), 0, after)
            if out[name] is None:
                return None
        return out
    return call


def _token_rows(call: dict) -> dict[str, torch.Tensor]:
    """Each token's reference bytes [T, H, D] for both caches, from scratch caches of one slot a token."""
    tokens = call["cache_loc"].shape[0]
    scratch = {**call, "cache_loc": torch.arange(tokens, device=call["cache_loc"].device), "page_size": 1}
    for n in CACHES:
        scratch[n] = torch.zeros((tokens, 1, *call[n].shape[-2:]), dtype=call[n].dtype, device=call[n].device)
    naive_fp8_set_kv_buffer(**scratch)
    return {n: scratch[n][:, 0] for n in CACHES}


def _valid_tokens(call: dict) -> Iterator[tuple[int, int]]:
    """(token, slot) of the call's tokens whose slot is in range, in token order."""
    cache = call["k_cache"]
    slots = cache.shape[0] * (cache.shape[1] if cache.dim() == 4 else 1)
    return ((t, s) for t, s in enumerate(call["cache_loc"].tolist()) if 0 <= s < slots)


def _slot_view(cache: torch.Tensor, s: int) -> torch.Tensor:
    """Slot s of a 3-D or 4-D cache: its [H, D] view."""
    return cache[s // cache.shape[1], s % cache.shape[1]] if cache.dim() == 4 else cache[s]


def _token_by_token(call: dict) -> None:
    """The reference's write where a misread cache view overlaps itself (a page stride smaller than a page),
    which the reference refuses: each valid token's bytes copied to its slot of the view in token order (so a
    later token's bytes land over an earlier's, as a sequential write leaves them)."""
    rows = _token_rows(call)
    for name in CACHES:
        for t, s in _valid_tokens(call):
            _slot_view(call[name], s).copy_(rows[name][t])


def _head_major_rows(b: Built) -> dict | None:
    """A [pages, page_size, H, D] cache whose (offset, head) rows are indexed head-major, by logical index: row
    (offset, h) of a page written at the cache's row h * page_size + offset, that is [r // H, r % H]."""
    if b.case.cache_rank != 4 or b.case.page_size == 1 or b.case.num_heads == 1:
        return None

    def write(call: dict) -> None:
        rows = _token_rows(call)
        size, heads = b.case.page_size, b.case.num_heads
        for name in CACHES:
            for t, s in _valid_tokens(call):
                for h in range(heads):
                    r = h * size + s % size
                    call[name][s // size, r // heads, r % heads].copy_(rows[name][t, h])
    return {**b.call(), "_writer": write}


def _slots(rule: Callable[[torch.Tensor, int], torch.Tensor]) -> Callable[[Built], dict | None]:
    def call(b: Built) -> dict | None:
        loc = b.cache_loc
        new = rule(loc.to(torch.int64), b.case.num_slots).to(loc.dtype)
        return None if torch.equal(new, loc) else {**b.call(), "cache_loc": new}
    call.rule = rule  # type: ignore[attr-defined]  # read by _any_winner: the slots it sends tokens to
    return call


def _past_the_end(b: Built) -> dict | None:
    """Out-of-range tokens written at their own slots, past the cache's end, as if it had the pages they name:
    no bound check at all (the bytes after the view, and after its buffer, take them)."""
    loc = b.cache_loc.to(torch.int64)
    if not bool((loc >= b.case.num_slots).any()):
        return None
    need = int(loc.max()) + 1
    out = {**b.call(), "_after": []}
    for name in CACHES:
        t = getattr(b, name)
        rows = -(-need // t.shape[1]) if t.dim() == 4 else need
        out[name] = _restrided(t, b.buffers[name], tuple(t.stride()), t.storage_offset(), out["_after"],
                               (rows, *t.shape[1:]))
        if out[name] is None:
            return None
    return out


def _padding_before_start(rounding: str) -> Callable[[Built], dict | None]:
    """No padding check: a padding token written at its own negative slot, before the cache's start, its page and
    in-page offset by floor division (`//`, `%`: Python, numpy, Triton's interpreter) or by C's truncation (a
    compiled kernel's: page 0, offset -1). A check-only model (its bytes land outside the view, where the
    reference cannot write): each byte several writes reach holds one of theirs."""
    def model(_b: Built) -> dict | None:
        return None

    def check(actual: Built, fresh: Callable[[], Built]) -> bool:
        case = actual.case
        padding = [t for t, s in enumerate(case.cache_loc) if s < 0]
        if not padding:
            return False
        expected, before = _modelled(lambda c: c.call(), fresh), fresh()
        if expected is None:
            return False
        for name, x, scale in (("k_cache", "k", case.k_scale), ("v_cache", "v", case.v_scale)):
            a, e = actual.buffers[name].cpu(), expected.buffers[name].cpu()
            t = getattr(before, name)
            q = _quantized(getattr(before, f"{x}_logical").cpu(), _scale_value(scale), case.recipe,
                           case.cache_format)
            st = t.stride()
            targets, values = [], []
            for tok in padding:
                s = case.cache_loc[tok]
                if t.dim() == 4:
                    page = s // t.shape[1] if rounding == "floor division" else -(-s // t.shape[1])
                    off = s - page * t.shape[1]
                    base = t.storage_offset() + page * st[0] + off * st[1]
                else:
                    base = t.storage_offset() + s * st[0]
                if not 0 <= base < a.numel():  # far before the buffer (-2**63): not a write this model sees
                    return False
                h = torch.arange(t.shape[-2]).reshape(-1, 1) * st[-2]
                d = torch.arange(t.shape[-1]).reshape(1, -1) * st[-1]
                targets.append((base + h + d).flatten())
                values.append(q[tok].flatten())
            to = torch.cat(targets)
            if int(to.min()) < 0 or int(to.max()) >= a.numel():
                return False
            reached, landed = _landed(a, to, torch.cat(values))
            # a byte several writes reach: a padding token's, or the reference's own (a valid token there too)
            if not bool((landed | (a == e))[reached].all()) or not torch.equal(a[~reached], e[~reached]):
                return False
        return True
    model.check = check
    return model


def _zeros_at_slot_0(b: Built) -> dict | None:
    """Each token that writes nothing (padding, out of range) stores zeros at slot 0 instead, in token order: an
    unpredicated store of `where(valid, q, 0)` at `where(valid, loc, 0)` (slot 0 taken for a dummy slot)."""
    loc = b.cache_loc.to(torch.int64)
    skip = (loc < 0) | (loc >= b.case.num_slots)
    if not bool(skip.any()) or b.case.num_slots == 0:
        return None
    out = b.call()
    for name in ("k", "v"):
        x = getattr(b, name).clone()
        x[skip.to(x.device)] = 0
        out[name] = x
    out["cache_loc"] = torch.where(skip, torch.zeros_like(loc), loc).to(b.cache_loc.dtype)
    return out


def _winners(loc: torch.Tensor, n: int) -> list[torch.Tensor]:
    """Where a misread cache_loc sends several tokens to one slot: cache_locs with one of them kept at each such
    slot (the others skipped as padding), the i-th of each slot's tokens in the i-th; [] without such a slot."""
    groups: dict[int, list[int]] = {}
    for t, s in enumerate(loc.tolist()):
        if 0 <= s < n:
            groups.setdefault(s, []).append(t)
    shared = [ts for ts in groups.values() if len(ts) > 1]
    out = []
    for i in range(max((len(ts) for ts in shared), default=0)):
        kept = loc.clone()
        for ts in shared:
            for t in ts:
                if t != ts[min(i, len(ts) - 1)]:
                    kept[t] = -1
        out.append(kept)
    return out


def _any_winner(model: Callable[[Built], dict | None], actual: Built, fresh: Callable[[], Built]) -> bool:
    """Whether a slot model explains the bytes with any of the tokens it sends to one slot landing there, byte by
    byte: on a GPU, which of several writes to one byte lands is undefined (a wrapped out-of-range token and the
    real token of its slot race), so the reference's one order need not be the kernel's."""
    rule = getattr(model, "rule", None)
    if rule is None:
        return False
    case = actual.case  # the slots from the Case: a kernel may have changed its cache_loc in place
    loc = rule(torch.tensor(case.cache_loc, dtype=torch.int64), case.num_slots)
    builds = [_modelled(lambda c, k=kept: {**c.call(), "cache_loc": k.to(c.cache_loc.device, c.cache_loc.dtype)},
                        fresh)
              for kept in _winners(loc, case.num_slots)]
    if not builds or any(x is None for x in builds):
        return False
    return all(functools.reduce(torch.logical_or, (x.buffers[w].cpu() == actual.buffers[w].cpu() for x in builds))
               .all() for w in CACHES)


def _loc_words(b: Built) -> dict | None:
    """An int64 cache_loc read through an int32 pointer: token t gets its t-th 32-bit word (slot 5 then its
    high word 0, ...), little-endian. One token too: its low word alone differs from its value past int32's
    range (a padding of -2**63 reads as slot 0)."""
    loc = b.cache_loc
    if loc.dtype != torch.int64 or loc.numel() < 1:
        return None
    words = loc.contiguous().view(torch.int32)[:loc.numel()].to(torch.int64)
    return {**b.call(), "cache_loc": words}


def _rows_repeated(b: Built) -> dict | None:
    """K and V flattened to (token, head) rows r = t x H + h, each written at slot cache_loc[r mod T] in row order
    (a later row over an earlier one, as an in-order scatter leaves them): the slots expanded with `repeat` where
    `repeat_interleave` belongs. Needs two tokens and two heads (else it is the right call)."""
    if b.case.num_tokens < 2 or b.case.num_heads < 2:
        return None

    def writer(call: dict) -> None:
        rows, slots = _token_rows(call), dict(_valid_tokens(call))
        tokens, heads = call["cache_loc"].shape[0], call["k_cache"].shape[-2]
        for name in CACHES:
            for r in range(tokens * heads):
                if r % tokens in slots:
                    _slot_view(call[name], slots[r % tokens])[r % heads].copy_(rows[name][r // heads, r % heads])
    return {**b.call(), "_writer": writer}


def _page_rest_zeroed(b: Built) -> dict | None:
    """The call, then every slot of a page it writes that no token of the call names zeroed: a kernel that
    writes whole pages from a zeroed staging copy."""
    case = b.case
    size = case.page_size if case.cache_rank == 4 else 1
    named = {s for s in case.cache_loc if 0 <= s < case.num_slots}
    rest = [s for p in {s // size for s in named} for s in range(p * size, (p + 1) * size) if s not in named]
    if not rest:
        return None
    call = b.call()

    def zero() -> None:
        for name in CACHES:
            rows = call[name].view(torch.uint8)
            for s in rest:
                rows[s // size, s % size].zero_()
    return {**call, "_after": [zero]}


def _dims_regrouped(group: int, arrange: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[Built], dict | None]:
    """Each group of `group` dims of a head written in another order, `arrange` of the [..., group] groups: the
    call with its inputs' dims so permuted."""
    def call(b: Built) -> dict | None:
        t, h, d = b.case.input_shape
        if d % group or group < 2 or t == 0:
            return None
        out = b.call()
        for name in ("k", "v"):
            out[name] = arrange(getattr(b, name).reshape(t, h, d // group, group)).reshape(t, h, d)
        return out
    return call


def _dims_reversed(group: int) -> Callable[[Built], dict | None]:
    """Each group of dims in reverse order (a vector store packing its bytes in the wrong order)."""
    return _dims_regrouped(group, lambda x: x.flip(-1))


def _dims_halves_swapped(group: int) -> Callable[[Built], dict | None]:
    """Each group of dims with its two halves swapped (a wide word built from its two half-words in the wrong
    order, `(lo << 32) | hi`)."""
    return _dims_regrouped(group, lambda x: x.unflatten(-1, (2, group // 2)).flip(-2))


def _compacted(loc: torch.Tensor, n: int) -> torch.Tensor:
    """Padding dropped from the slots but not from the inputs: token i gets the i-th non-negative slot."""
    return _first_slots(loc, loc[loc >= 0])


def _compacted_in_range(loc: torch.Tensor, n: int) -> torch.Tensor:
    """Every slot that writes nothing (padding, out of range) dropped, the inputs not: token i gets the i-th
    slot in range (`masked_scatter_` filling the valid rows from the tokens in order, say)."""
    return _first_slots(loc, loc[(loc >= 0) & (loc < n)])


def _first_slots(loc: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    out = torch.full_like(loc, -1)
    out[:kept.numel()] = kept
    return out


def _wrap_negative(loc: torch.Tensor, n: int) -> torch.Tensor:
    return torch.where((loc < 0) & (loc >= -n), loc + n, loc)


def _bound(name: str, slots: Callable[[Case], int]) -> Callable[[Built], dict | None]:
    """The call with every token whose slot is at or past a wrong number of slots skipped (as padding): a
    bounds check that reads the cache's size from another dimension (pages x H for a [pages, H, page, D]
    layout's, say) leaves the in-range slots past it unwritten."""
    def call(b: Built) -> dict | None:
        bound = slots(b.case)
        loc = b.cache_loc
        if not 0 < bound < b.case.num_slots or not bool(((loc >= bound) & (loc < b.case.num_slots)).any()):
            return None
        return {**b.call(), "cache_loc": torch.where(loc >= bound, torch.full_like(loc, -1), loc)}
    call.__name__ = name
    return call


#: Wrong numbers of slots a kernel's bounds check has read: the pages times another dimension of the cache.
#: The simplest first: a minimal Case of one head cannot tell pages from pages x H.
BOUNDS = (("pages", lambda c: c.num_pages), ("pages x H", lambda c: c.num_pages * c.num_heads),
          ("pages x D", lambda c: c.num_pages * c.head_dim),
          ("pages x H x D", lambda c: c.num_pages * c.num_heads * c.head_dim))

PLACEMENT: tuple[tuple[str, str, Callable[[Built], dict | None]], ...] = (
    ("strides:inputs-ignored", "both inputs", _inputs(("k", "v"), False)),
    ("strides:inputs-ignored", "k", _inputs(("k",), False)),
    ("strides:inputs-ignored", "v", _inputs(("v",), False)),
    ("strides:inputs-heads-ignored", "both inputs", _inputs(("k", "v"), True)),
    ("strides:inputs-heads-ignored", "k", _inputs(("k",), True)),
    ("strides:inputs-heads-ignored", "v", _inputs(("v",), True)),
    ("strides:input-2d-as-dh", "", _input_2d_as_dh),
    ("strides:other-input", "v with k's strides", _other_input("v")),
    ("strides:other-input", "k with v's strides", _other_input("k")),
    ("strides:cache-loc-ignored", "", _loc_contiguous),
    ("strides:other-cache", "v_cache with k_cache's strides", _other_cache("v_cache")),
    ("strides:other-cache", "k_cache with v_cache's strides", _other_cache("k_cache")),
    ("strides:cache-ignored", "both caches", _cache_contiguous(("k_cache", "v_cache"))),
    ("strides:cache-ignored", "k_cache", _cache_contiguous(("k_cache",))),
    ("strides:cache-ignored", "v_cache", _cache_contiguous(("v_cache",))),
    ("strides:cache-head-major", "both caches", _head_major(("k_cache", "v_cache"))),
    ("strides:cache-head-major", "k_cache", _head_major(("k_cache",))),
    ("strides:cache-head-major", "v_cache", _head_major(("v_cache",))),
    ("strides:cache-head-major", "by logical rows", _head_major_rows),
    ("strides:cache-page-stride", "both caches", _cache_contiguous(("k_cache", "v_cache"), outer_only=True)),
    ("strides:cache-page-stride", "k_cache", _cache_contiguous(("k_cache",), outer_only=True)),
    ("strides:cache-page-stride", "v_cache", _cache_contiguous(("v_cache",), outer_only=True)),
    *(("strides:cache-inner-stride", f"{what}, {who}", _cache_inner_stride(names, axis))
      for axis, what in ((-2, "the head stride as head_dim"), (-1, "the dim stride as 1"),
                         (1, "the in-page slot stride as H x D"))
      for who, names in (("both caches", ("k_cache", "v_cache")), ("k_cache", ("k_cache",)),
                         ("v_cache", ("v_cache",)))),
    *(("strides:cache-axis-stride", f"{what}, {who}", _cache_axis_stride(names, axis, source))
      for axis, source, what in ((-2, -1, "the head stride read as the dim stride"),
                                 (-1, -2, "the dim stride read as the head stride"))
      for who, names in (("both caches", ("k_cache", "v_cache")), ("k_cache", ("k_cache",)),
                         ("v_cache", ("v_cache",)))),
    *(("strides:cache-from-input", f"{what}, {who}", _cache_from_input(names, axis))
      for axis, what in ((-2, "the head stride"), (-1, "the dim stride"))
      for who, names in (("both caches", ("k_cache", "v_cache")), ("k_cache", ("k_cache",)),
                         ("v_cache", ("v_cache",)))),
    ("strides:offset-ignored", "both caches", _offset_ignored(CACHES)),
    ("strides:offset-ignored", "k_cache", _offset_ignored(("k_cache",))),
    ("strides:offset-ignored", "v_cache", _offset_ignored(("v_cache",))),
    ("strides:offset-ignored", "both inputs", _offset_ignored(("k", "v"))),
    ("strides:offset-ignored", "k", _offset_ignored(("k",))),
    ("strides:offset-ignored", "v", _offset_ignored(("v",))),
    ("kv-mixed:caches-swapped", "", _mixed("k", "v", "v_cache", "k_cache")),
    ("kv-mixed:inputs-swapped", "", _mixed("v", "k", "k_cache", "v_cache")),
    ("kv-mixed:k-for-v", "", _mixed("k", "k", "k_cache", "v_cache")),
    ("kv-mixed:v-for-k", "", _mixed("v", "v", "k_cache", "v_cache")),
    ("kv-mixed:v-into-k-cache", "", _stored_through("k_cache", "k_cache")),
    ("wrong-slot:loc-int32-words", "", _loc_words),
    ("wrong-slot:rows-repeated", "", _rows_repeated),
    ("wrong-slot:page-rest-zeroed", "", _page_rest_zeroed),
    *((f"strides:dims-reversed:{g}", f"in groups of {g}", _dims_reversed(g)) for g in (2, 4, 8, 16)),
    *((f"strides:dims-halves-swapped:{g}", f"in groups of {g}", _dims_halves_swapped(g)) for g in (4, 8, 16, 32)),
    ("padding:wraps-to-end", "", _slots(_wrap_negative)),
    *(("padding:before-start", f"pages and offsets by {how}", _padding_before_start(how))
      for how in ("floor division", "truncation")),
    ("padding:slots-compacted", "", _slots(_compacted)),
    ("padding:slots-compacted", "out-of-range slots dropped too", _slots(_compacted_in_range)),
    ("padding:slot-0", "", _slots(lambda loc, n: loc.clamp(min=0))),
    ("wrong-slot:slot-0-zeroed", "", _zeros_at_slot_0),
    ("out-of-range:written", "unchecked: at its own slot, past the cache's end", _past_the_end),
    ("out-of-range:written", "clamped to the last slot", _slots(lambda loc, n: torch.where(loc >= n, n - 1, loc))),
    ("out-of-range:written", "wrapped modulo the number of slots", _slots(lambda loc, n: torch.where(loc >= n, loc % n,
                                                                                                     loc))),
    *(("out-of-range:wrong-bound", f"slots at or past {name} skipped", _bound(name, slots)) for name, slots in BOUNDS),
    *(("overrun:tile", (f"the {lanes} past the tile's H x D unmasked: {what} stored there" if "bounded" not in lanes
                        else f"the tile's heads masked with h < head_dim, not h < H (heads past D unwritten; {what} "
                             "stored in the tile's heads past H)"), _tile(lanes, zeros))
      for lanes in TILE_LANES for zeros, what in ((False, "the input's next elements"), (True, "zeros"))),
    ("overrun:rows", "one token past T: cache_loc[T] and the inputs' row T, read past their ends",
     _past_batch("loc", False, True)),
    *(("overrun:rows", f"rows past T at slot 0 ({where}), {what}", _past_batch("zero", zeros, last))
      for zeros, what in ((True, "zeros"), (False, "the inputs' row T")) for last, where in
      ((True, "after the batch's own writes"), (False, "before them"))),
)


def _modelled(model: Callable[[Built], dict | None], fresh: Callable[[], Built]) -> Built | None:
    """The reference's bytes under this misread call; None when the reference cannot make it."""
    built = fresh()
    try:
        call = model(built)
        if call is None:
            return None
        after = call.pop("_after", [])
        writer = call.pop("_writer", None) or (_token_by_token if call.pop("_token_by_token", False)
                                               else lambda c: naive_fp8_set_kv_buffer(**c))
        writer(call)
        for write_back in after:
            write_back()
    except Exception:  # the misread call is not one the reference can make: not this model
        return None
    return built


def _reproduces(model: Callable[[Built], dict | None], actual: Built, fresh: Callable[[], Built],
                built: Built | None = None) -> bool:
    """Whether the reference under this misread call gives the implementation's bytes over both caches (`built`:
    that call, made already)."""
    built = built if built is not None else _modelled(model, fresh)
    check = getattr(model, "check", None)
    if built is None:  # a check-only model, or a call the model cannot make
        return check is not None and check(actual, fresh)
    return _same_caches(built, actual) or _any_winner(model, actual, fresh) or (check is not None
                                                                                 and check(actual, fresh))


def _same_caches(a: Built, b: Built) -> bool:
    return all(torch.equal(a.buffers[w].cpu(), b.buffers[w].cpu()) for w in CACHES)


def _heads_split(case: Case, expected: Built, actual: Built,
                 modelled: Built) -> tuple[dict[str, list[int]], int] | None:
    """The heads of each cache that hold the model's bytes, when every head holds either the reference's or the
    model's (some the model's, where they differ from the reference's, and some the reference's where the
    model's differ), and every byte outside the heads is the reference's: a head-tiled kernel whose later tiles
    take a wrong base. With the count of heads right where the model differs (the fewer, the closer the model).
    None otherwise."""
    split: dict[str, list[int]] = {}
    partial = 0
    for which in CACHES:
        e, a, m = (b.buffers[which].cpu() for b in (expected, actual, modelled))
        ok_e, ok_m = a == e, a == m
        index = byte_index(case, which).flatten(0, 1)  # [slots, H, D]
        inside = torch.zeros_like(ok_e)
        inside[index.flatten()] = True
        if not bool(ok_e[~inside].all()):
            return None
        heads = []
        for h in range(case.num_heads):
            at = index[:, h].flatten()
            if bool(ok_e[at].all()):
                partial += not bool(ok_m[at].all())
            elif bool(ok_m[at].all()):
                heads.append(h)
            else:
                return None
        if heads:
            split[which] = heads
    return (split, partial) if split and partial else None


def _placed_on_some_heads(case: Case, expected: Built, actual: Built, fresh: Callable[[], Built],
                          exclude: frozenset[str] = frozenset()) -> Effect | None:
    """A placement model that gives the implementation's bytes on some heads, the reference's on the rest; of
    several, the one fewest heads contradict (V's later heads read from K fit K and V swapped too, with every
    head of K's cache against it), the others its alternatives."""
    if case.num_heads < 2:
        return None
    fits: list[tuple[int, str, str, dict[str, list[int]]]] = []
    for key, detail, model in PLACEMENT:
        built = None if key in exclude or any(f[1] == key for f in fits) else _modelled(model, fresh)
        found = None if built is None else _heads_split(case, expected, actual, built)
        if found:
            fits.append((found[1], key, detail, found[0]))
    if not fits:
        return None
    best = min(f[0] for f in fits)
    (_, key, detail, split), *others = [f for f in fits if f[0] == best]
    where = "; ".join(f"{w} only on heads {', '.join(map(str, hs))}" for w, hs in split.items())
    return Effect(key, f"{title_of(key)}, on some heads only", f"{detail + '; ' if detail else ''}{where} (the "
                  "other heads right)", alternatives=[f[1] for f in others])


def explains(key: str, case: Case, expected: Built, actual: Built, before: dict[str, torch.Tensor],
             fresh: Callable[[], Built]) -> bool:
    """Whether this placement or moved effect explains every differing byte of the call (a placement model on
    some heads, the reference's bytes on the others, too)."""
    models = [model for k, _, model in PLACEMENT if k == key]
    if models:
        builds = []  # each model's call made once, read whole and then head by head
        for model in models:
            built = _modelled(model, fresh)
            if _reproduces(model, actual, fresh, built):
                return True
            builds += [built] if built is not None else []
        return any(_heads_split(case, expected, actual, b) is not None for b in builds)
    moved = {"wrong-slot:tokens-moved": _tokens_moved, "strides:rows-permuted": _rows_permuted}.get(key, _within_rows)
    found = moved(case, expected, actual, before)
    return found is not None and key in (found.key, *found.alternatives)


def _placement(case: Case, actual: Built, fresh: Callable[[], Built], exclude: frozenset[str]) -> Effect | None:
    """The placement models (but those excluded) whose reference bytes equal the implementation's over both
    caches: the first, with the others as alternatives (V written with K's strides reads as V written
    contiguously when K's cache is contiguous)."""
    found: list[tuple[str, str]] = []
    for key, detail, model in PLACEMENT:
        if key in exclude or any(k == key for k, _ in found):
            continue
        if _reproduces(model, actual, fresh):
            found.append((key, detail))
    if not found:
        return None
    key, detail = found[0]
    return Effect(key, title_of(key), detail, alternatives=[k for k, _ in found[1:]])


# -- value models: each written byte from its own token's input --------------------------------------

#: Floors a kernel may put under its scale (a guard against dividing by ~0): common epsilons and fp32's tiny. Not
#: a symptom-level scale variant (classify): at a scale of 2**-149 plain values saturate under every floor too.
SCALE_FLOORS = (1e-12, 1e-10, 1e-8, 1e-6, 2.0**-126)

def _pre_cast(rows: _Rows, recipe: str) -> torch.Tensor:
    """fp32 [T, H, D]: the recipe's value before the e4m3 rounding."""
    value = rows.scale.value if rows.scale.kind != "none" else 1.0
    return scaled(rows.x, ScaleArg("float", value, None), get_recipe(recipe)).cpu()


def _e5m2_inf_fixup(q: torch.Tensor) -> torch.Tensor:
    """e4m3 bytes with e5m2's ±inf (0x7C, 0xFC) replaced by e5m2's largest finite (0x7B, 0xFB): in e4m3 those
    are ±384 written as ±352."""
    low = q & 0x7F
    return torch.where(low == 0x7C, q - 1, q)


def _other_nan_mask(rows: _Rows, held: str) -> list[torch.Tensor] | None:
    """The NaN fix-up applied where the other input is NaN (a copy-pasted `isnan(k)` in V's path): the format's NaN
    byte there, and where only this input's value is NaN the cast's own NaN byte (its sign kept, or not). None
    when neither input has a NaN the other lacks."""
    y = _pre_cast(rows, held)
    own, other = y.isnan(), rows.other_x.isnan()
    if not bool((own ^ other).any()):
        return None
    q = rows.q(held)
    nan = q[own][0] if bool(own.any()) else torch.tensor(NAN_BYTE, dtype=q.dtype)
    fixed = torch.where(other, nan, q)
    if rows.case.cache_format == "fp8_e4m3fnuz":  # one NaN byte, no sign
        return [fixed]
    signed = torch.where(own & ~other & torch.signbit(rows.x), nan | 0x80, fixed)
    return [fixed, signed]


def _multiplied(rows: _Rows, held: str, factor: float | None = None) -> torch.Tensor:
    """The held recipe's bytes with x multiplied by its scale (one fp32 multiply) instead of divided; with
    `factor`, by that."""
    recipe = get_recipe(held)
    s = torch.tensor(factor if factor is not None else rows.scale.value if rows.scale.kind != "none" else 1.0,
                     dtype=torch.float32)
    if recipe.scale_dtype == "input":
        s = round_to_input_dtype(s, INPUT_FORMATS[rows.x.dtype])
    y = rows.x.to(torch.float32) * s
    if recipe.intermediate == "input":
        y = round_to_input_dtype(y, INPUT_FORMATS[rows.x.dtype])
    return encode_fp8(y, recipe, CACHE_FORMATS[rows.case.cache_format]).cpu()


def _first_values(rows: _Rows) -> list[float]:
    """The first values of K's and V's inputs (a placeholder pointer's first element), finite, nonzero and not
    1 (which a scale of 1 reads alike)."""
    firsts = {float(x.reshape(-1)[0]) for x in (rows.x, rows.other_x) if x.numel()}
    return sorted(f for f in firsts if math.isfinite(f) and f not in (0.0, 1.0))


def _overflow_inf(rows: _Rows, held: str) -> torch.Tensor:
    """The held recipe's steps with a non-saturating cast (`__NV_NOSAT`, torch's own e5m2 cast): ±inf past the
    largest finite value, where the recipe saturates."""
    return encode_fp8(_pre_cast(rows, held), dataclasses.replace(get_recipe(held), overflow="nan"),
                      CACHE_FORMATS[rows.case.cache_format]).cpu()


def _overflow_at(rows: _Rows, held: str, bound: float) -> torch.Tensor:
    """The held recipe's bytes with each quotient that overflows the cast (the format's own ±max where the recipe
    saturates it) written as ±bound, another format's largest value: a saturation step that replaces the cast's
    ±inf with a constant kept from another format's path (448 in an e5m2 write). Finite values up to the format's
    max stay right, which a clamp at ±bound (`saturates-low`) would not leave."""
    y = _pre_cast(rows, held)
    recipe, fmt = get_recipe(held), CACHE_FORMATS[rows.case.cache_format]
    q = rows.q(held)
    top = encode_fp8(torch.tensor([fmt.max_finite]), recipe, fmt).cpu()
    overflow = (_overflow_inf(rows, held) != q) & ((q & 0x7F) == top)
    plus = encode_fp8(torch.tensor([bound]), recipe, fmt).cpu()
    return torch.where(overflow, torch.where(y.cpu() < 0, plus | 0x80, plus), q)


#: e5m2 with its top exponent field (31) read as finite, e4m3fn's rule: 0x7C..0x7E are 65536, 81920 and
#: 98304, the largest; only 0x7F is NaN.
E5M2_TOP_FINITE = dataclasses.replace(CACHE_FORMATS["fp8_e5m2"], name="e5m2, top exponent finite",
                                      max_finite=98304.0)


def _top_exponent_finite(rows: _Rows, held: str) -> torch.Tensor:
    """The held recipe's bytes encoded on E5M2_TOP_FINITE: a quotient from 61440 up lands on the reserved
    exponent (an inf or NaN byte), the saturation at 98304 where the recipe's is at 57344."""
    return encode_fp8(_pre_cast(rows, held), get_recipe(held), E5M2_TOP_FINITE).cpu()


def _inf_kept(rows: _Rows, held: str) -> torch.Tensor | None:
    """The held recipe's bytes with each infinite quotient written as the format's ±inf, finite ones saturated
    (hip's `__HIP_SATFINITE` style: "propagate NaN/inf, no clipping"); None where no quotient is infinite."""
    y = _pre_cast(rows, held)
    inf = y.isinf()
    if not bool(inf.any()):
        return None
    fmt = CACHE_FORMATS[rows.case.cache_format]
    plus = encode_fp8(torch.tensor([float("inf")]), dataclasses.replace(get_recipe(held), overflow="nan"), fmt).cpu()
    signed = torch.where(y < 0, plus | 0x80, plus)
    return torch.where(inf, signed, rows.q(held))


def _clamped_inputs(rows: _Rows, held: str, bound: float) -> torch.Tensor | None:
    """The held recipe's bytes with each input first clamped to ±bound; None when no input is past it (the
    model is the recipe itself)."""
    if not bool((rows.x.to(torch.float32).abs() > bound).any()):
        return None
    return _quantized(rows.x.clamp(-bound, bound), _scale_value(rows.scale), held, rows.case.cache_format)


def _nan_to_num(rows: _Rows, held: str, dtype: torch.dtype) -> torch.Tensor | None:
    """The held recipe's bytes with each input first put through `torch.nan_to_num` in `dtype` (NaN -> 0, ±inf ->
    ±finfo(dtype).max); None unless the inputs hold both a NaN and an infinity."""
    x = rows.x.to(torch.float32)
    if not (bool(x.isnan().any()) and bool(x.isinf().any())):
        return None
    return _quantized(torch.nan_to_num(rows.x.to(dtype)), _scale_value(rows.scale), held, rows.case.cache_format)


def _or_old(rows: _Rows, held: str) -> torch.Tensor:
    """The held recipe's bytes ORed into the old bytes of each token's slot."""
    q = rows.q(held).clone()
    for s, ts in rows.writers.items():
        for t in ts:
            q[t] |= rows.row(rows.before, s)
    return q


def _subnormal_grid(rows: _Rows, held: str, emin: int) -> torch.Tensor:
    """The held recipe's bytes with values below 2**emin first rounded (to nearest, ties to even) onto the
    cache format's grid with that smallest normal exponent (a software encoder that floors the binade at
    another format's: e4m3's -6 in an e5m2 write), then encoded exactly."""
    fmt = CACHE_FORMATS[rows.case.cache_format]
    y = _pre_cast(rows, held)
    coarse = round_to_grid(y, dataclasses.replace(fmt, min_normal_exp=emin)).to(torch.float32)
    return encode_fp8(torch.where(y.abs() < 2.0**emin, coarse, y), get_recipe(held), fmt).cpu()


def _rebiased(rows: _Rows, held: str, shift: int) -> torch.Tensor:
    """The held recipe's bytes of each value times 2**shift: a software encoder that rebiases the exponent with
    another format's bias (e4m3's 7 in an e5m2 write, shift -8), its mantissa, subnormal and saturation steps
    the cache format's own."""
    fmt = CACHE_FORMATS[rows.case.cache_format]
    return encode_fp8(_pre_cast(rows, held) * 2.0**shift, get_recipe(held), fmt).cpu()


def _subnormal_shifted(rows: _Rows, held: str) -> list[torch.Tensor]:
    """The held recipe's bytes with each value below the format's smallest normal encoded at twice or half its
    value, every other value right: a software encoder whose denormalizing shift is one bit short or long (the
    subnormal exponent taken as -bias for 1 - bias). Doubled, the top subnormal binade lands on the smallest
    normal's bytes, as such an encoder's carry into the exponent field puts it."""
    fmt = CACHE_FORMATS[rows.case.cache_format]
    y = _pre_cast(rows, held)
    small = y.abs() < 2.0**fmt.min_normal_exp
    return [encode_fp8(torch.where(small, y * factor, y), get_recipe(held), fmt).cpu() for factor in (2.0, 0.5)]


def _through(rows: _Rows, held: str, dtype: torch.dtype, instead: bool = False) -> torch.Tensor:
    """The held recipe's fp32 value rounded (RNE) to a 16-bit float before the cast: two roundings, where a
    value within half a 16-bit ulp of a midpoint of the cache's grid lands on it and goes to even (an encoder
    that converts through `__half`, or a quotient stored as bf16/fp16 first). `instead` (a recipe that rounds
    the quotient to the input's dtype): rounded to this dtype in its place (a quotient staged in a bf16 buffer
    whatever the input's dtype)."""
    recipe = get_recipe(held)
    if instead:
        value = _scale_value(rows.scale)
        y = scaled(rows.x, ScaleArg("float", value, None), dataclasses.replace(recipe, intermediate="none")).cpu()
    else:
        y = _pre_cast(rows, held)
    fmt = CACHE_FORMATS[rows.case.cache_format]
    return encode_fp8(torch.where(y.isnan(), y, y.to(dtype).to(torch.float32)), recipe, fmt).cpu()


def _added_to_old(rows: _Rows, held: str) -> torch.Tensor:
    """The held recipe's bytes added (mod 256) to the old bytes of each token's slot: a scatter that
    accumulates (`index_put_(..., accumulate=True)`) where it should store."""
    q = rows.q(held).to(torch.int64)
    for s, ts in rows.writers.items():
        for t in ts:
            q[t] = (q[t] + rows.row(rows.before, s).to(torch.int64)) & 0xFF
    return q.to(torch.uint8)


def _dynamic(rows: _Rows, held: str) -> list[torch.Tensor]:
    """The held recipe's bytes under a per-tensor scale made from the data, fp32 amax(|x|) / the format's largest
    value (a dynamic quantizer's `scale=None` carried into a static write), the amax over every token or over
    the tokens that write."""
    fmax = CACHE_FORMATS[rows.case.cache_format].max_finite
    x = rows.x.to(torch.float32).abs()
    written = [t for t, s in enumerate(rows.case.cache_loc) if 0 <= s < rows.case.num_slots]
    amaxes = [x.amax()] + ([x[written].amax()] if written else [])
    return [rows.q(held, float(a / torch.tensor(fmax, dtype=torch.float32))) for a in amaxes]


def _flushed(e: torch.Tensor, keep_sign: bool, cache_format: str) -> torch.Tensor:
    mag = e & 0x7F
    sub = (mag >= 1) & (mag < 1 << CACHE_FORMATS[cache_format].mantissa_bits)  # the subnormal bytes
    return torch.where(sub, e & 0x80 if keep_sign else torch.zeros_like(e), e)


#: fp32's smallest normal: a float mode that flushes denormals reads anything below it as zero.
FP32_TINY = 2.0**-126
E4M3_NAN, FNUZ_NAN = 0x7F, 0x80  # the NaN byte each format's recipes write


def _inputs_flushed(rows: _Rows, held: str) -> torch.Tensor | None:
    """The held recipe's bytes with every input below fp32's normal range read as a zero of its sign (bf16's
    and fp32's subnormals; fp16 has none there), as a denormals-are-zero float mode computes; None when no
    input is that small (the model is the recipe itself)."""
    small = rows.x.to(torch.float32).abs() < FP32_TINY
    if not bool((small & (rows.x != 0)).any()):
        return None
    flushed = torch.where(small, torch.copysign(torch.zeros_like(rows.x), rows.x), rows.x)
    return _quantized(flushed, _scale_value(rows.scale), held, rows.case.cache_format)


def _inputs_zero(rows: _Rows, held: str) -> torch.Tensor | None:
    """The held recipe's bytes of +0 inputs: every value read as zero (a load masked off, or a bf16's bits shifted
    out of a 16-bit integer before it was widened); None where every input is a zero already."""
    if not bool((rows.x != 0).any()):
        return None
    return _quantized(torch.zeros_like(rows.x), _scale_value(rows.scale), held, rows.case.cache_format)


def _grid(case: Case) -> tuple[torch.Tensor, int]:
    """The cache format's finite magnitudes by byte (float64, CPU) and the largest finite byte (e4m3's 0x7E)."""
    return _grid_of(case.cache_format)


def _grid_of(cache_format: str) -> tuple[torch.Tensor, int]:
    fmt = CACHE_FORMATS[cache_format]
    return _magnitudes(torch.device("cpu"), fmt), _finite_bytes(fmt) - 1


def _toward_zero(rows: _Rows, held: str) -> torch.Tensor:
    e = rows.q(held)
    y = _pre_cast(rows, held).to(torch.float64).abs()
    mag = (e & 0x7F).to(torch.int64)
    table, last = _grid(rows.case)
    # The largest finite byte included: e4m3's 448 (0x7E) is where a value in (416, 448) rounds up to.
    finite = mag <= last
    above = finite & (table[mag.clamp(max=last)] > y) & (mag > 0)
    return torch.where(above, e - 1, e)


def ties_above(y: torch.Tensor, e: torch.Tensor, cache_format: str) -> torch.Tensor:
    """Where |y| lies exactly halfway between byte e's magnitude and the next finite one up (NaN and the largest
    finite byte have none)."""
    table, last = _grid_of(cache_format)
    mag = (e & 0x7F).to(torch.int64)
    lower, upper = table[mag.clamp(max=last)], table[(mag + 1).clamp(max=last)]
    return (mag < last) & (y.to(torch.float64).abs() == (lower + upper) / 2)


def _ties_away(rows: _Rows, held: str) -> torch.Tensor:
    """The recipe's bytes with every exact tie between two grid values rounded away from zero (a software
    encoder's floor(a / q + 0.5)): where nearest-even took the lower magnitude of a tie, the upper."""
    e = rows.q(held)
    return torch.where(ties_above(_pre_cast(rows, held), e, rows.case.cache_format), e + 1, e)


def _ties_to_odd(rows: _Rows, held: str) -> torch.Tensor:
    """The recipe's bytes with every exact tie between two grid values rounded to the odd one: nearest-even's
    other neighbour, above it or below it."""
    e, y, inside, lower, upper = _bracket_below(rows, held)
    up = ties_above(_pre_cast(rows, held), e, rows.case.cache_format)
    return torch.where(up, e + 1, torch.where(inside & (y == (lower + upper) / 2), e - 1, e))


def _bracket_below(rows: _Rows, held: str) -> tuple[torch.Tensor, ...]:
    """(e, |y|, inside, lower, upper): the recipe's bytes, the magnitudes before the cast (float64), where e is a
    finite magnitude with one below it, and the grid values of the byte below e and of e (clamped to the finite
    grid, so a NaN byte past it indexes nothing: e5m2 has 124 finite magnitudes)."""
    e = rows.q(held)
    y = _pre_cast(rows, held).to(torch.float64).abs()
    table, last = _grid(rows.case)
    mag = (e & 0x7F).to(torch.int64)
    inside = (mag > 0) & (mag <= last)
    return e, y, inside, table[(mag - 1).clamp(min=0, max=last)], table[mag.clamp(max=last)]


def _sticky_lost(rows: _Rows, held: str) -> torch.Tensor:
    """The recipe's bytes with every value strictly between a halfway point and the grid value above it rounded as
    that tie, to even (a software encoder that keeps the round bit and drops the sticky bits): where nearest-even
    went up to an odd magnitude from past the halfway point, the even one below."""
    e, y, inside, lower, upper = _bracket_below(rows, held)
    past_half = inside & (y > (lower + upper) / 2) & (y < upper)
    return torch.where(past_half & ((e & 0x7F) % 2 == 1), e - 1, e)


def _ties_toward_zero(rows: _Rows, held: str) -> torch.Tensor:
    """The recipe's bytes with every exact tie between two grid values rounded toward zero (a software
    encoder that rounds up only past the halfway point, `rem > half`): where nearest-even took the upper
    magnitude of a tie, the lower."""
    e, y, inside, lower, upper = _bracket_below(rows, held)
    return torch.where(inside & (y == (lower + upper) / 2), e - 1, e)


def _read_as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x's bytes read as `dtype`, element i of x's shape from element i of the reinterpreted buffer (a pointer
    of the other type with the same element offsets: a float32 input read as bfloat16 takes byte 2i)."""
    flat = x.contiguous().reshape(-1).view(dtype)
    return flat[:x.numel()].reshape(x.shape)


def _fp16_widened_as_normal(x: torch.Tensor) -> torch.Tensor | None:
    """float16 x widened by the exponent rebias alone (`(bits & 0x7FFF) << 13` plus 112 << 23, right for normal
    values only): ±0 and subnormals m * 2**-24 read as ±2**-15 * (1 + m / 1024). None for other dtypes, or when x
    has no such value."""
    if x.dtype != torch.float16:
        return None
    bits = x.view(torch.int16).to(torch.int32)
    em = bits & 0x7FFF
    low = em < 0x0400
    if not bool(low.any()):
        return None
    widened = (2.0**-15 * (1 + (em & 0x3FF).double() / 1024)).float()
    return torch.where(low, torch.where(bits < 0, -widened, widened), x.float())


def _carry_lost(rows: _Rows, held: str) -> list[torch.Tensor]:
    """The recipe's bytes with each value that rounds up into the next power of two written one binade low
    (a software encoder that takes the exponent before rounding: [1.9375, 2) written as 1.0, not 2.0); with and
    without the same for a subnormal value rounding up to the smallest normal."""
    e = rows.q(held)
    y = _pre_cast(rows, held).to(torch.float64).abs()
    table, last = _grid(rows.case)
    mbits = CACHE_FORMATS[rows.case.cache_format].mantissa_bits
    mag = (e & 0x7F).to(torch.int64)
    carried = (mag <= last) & (mag >> mbits > 0) & ((mag & ((1 << mbits) - 1)) == 0) & (table[mag.clamp(max=last)] > y)
    from_normal = carried & (mag >> mbits > 1)
    return [torch.where(from_normal, e - (1 << mbits), e), torch.where(carried, e - (1 << mbits), e)]


def _saturated_low(w: _Written, held: str) -> tuple[float, torch.Tensor] | None:
    """(bound, bytes): the held recipe's bytes with every finite magnitude above the largest one the call
    wrote clamped to it (a clamp at another format's maximum: e4m3fnuz's 240 in an e4m3 write). None when
    the call wrote the format's largest finite value, or a bound below a quarter of it that is no FP8
    format's maximum (every byte ±0 at an extreme scale is not a clamp; e4m3's 448 in an e5m2 write is)."""
    e = w.rows.q(held)
    table, last = _grid(w.rows.case)
    written = (w.actual & 0x7F).to(torch.int64)
    finite = written[written <= last]
    if finite.numel() == 0 or int(finite.max()) >= last:
        return None
    bound = int(finite.max())
    value = float(table[bound])
    if value < float(table[last]) / 4 and value not in {f.max_finite for f in CACHE_FORMATS.values()}:
        return None
    mag = (e & 0x7F).to(torch.int64)
    return value, torch.where((mag > bound) & (mag <= last), (e & 0x80) | bound, e)


@functools.cache
def _nan_bytes(fmt: str) -> frozenset[int]:
    """The bytes a format reads as NaN (e5m2 has six: exponent all ones, a fraction; e4m3fn two; fnuz one)."""
    dtype = getattr(torch, CACHE_FORMATS[fmt].name)
    every = torch.arange(256, dtype=torch.uint8)
    return frozenset(every[every.view(dtype).float().isnan()].tolist())


def _nan_written_as(w: _Written, held: str) -> tuple[int, torch.Tensor] | None:
    """(byte, bytes): the held recipe's bytes with each NaN byte replaced by the one byte the call wrote for every
    NaN, when that byte is another NaN encoding of the cache's format (fp16's canonical NaN's high byte, 0x7E,
    in an e5m2 cache). None otherwise (a sign kept, a finite byte: the encoding rules' and other models')."""
    e = w.rows.q(held)
    own = _nan_bytes(w.rows.case.cache_format)
    at_nan = (e.unsqueeze(-1) == torch.tensor(sorted(own), dtype=e.dtype)).any(-1)
    mine = at_nan[w.tokens]
    written = set(w.actual[mine].unique().tolist())
    if len(written) != 1 or not written <= own or written == set(e[w.tokens][mine].unique().tolist()):
        return None
    byte = written.pop()
    return byte, torch.where(at_nan, torch.full_like(e, byte), e)


def nudged_bytes(y: torch.Tensor, recipe: Recipe, ulps: int = 2, cache_format: str = "fp8_e4m3") -> list[torch.Tensor]:
    """The e4m3 bytes of fp32 values y moved 1..`ulps` fp32 ulps down and up in magnitude, sign kept
    (PTX's div.full.f32, Triton's default `/`, is within 2 ulps of the IEEE quotient, and a quotient's
    sign is exact: a zero is not nudged across to the other sign)."""
    out = []
    magnitude = y.abs()
    for d in (0.0, torch.inf):
        z = magnitude
        for _ in range(ulps):
            z = torch.nextafter(z, torch.full_like(z, d))
            out.append(encode_fp8(torch.copysign(z, y), recipe, CACHE_FORMATS[cache_format]))
    return out


def _neighbours(rows: _Rows, held: str) -> list[torch.Tensor]:
    """The bytes of the recipe's pre-cast value up to two fp32 ulps below and above."""
    return nudged_bytes(_pre_cast(rows, held), get_recipe(held), cache_format=rows.case.cache_format)


def _value_cast(rows: _Rows, held: str) -> torch.Tensor:
    return rows.q(held).view(getattr(torch, FP8_CACHE_DTYPES[rows.case.cache_format])).to(torch.uint8)


def _sign_negated(rows: _Rows, held: str) -> torch.Tensor:
    """The magnitude byte, negated as an int8 where the sign bit is set: -0 becomes 0x00, -448 0x82 (0xFE)."""
    q = rows.q(held)
    magnitude = q & 0x7F
    return torch.where((q & 0x80) != 0, ((256 - magnitude.to(torch.int16)) % 256).to(torch.uint8), q)


@dataclass
class _Written:
    """One cache's written slots, with a single writer each: the token of each and the actual rows."""

    rows: _Rows
    tokens: list[int]
    actual: torch.Tensor  # [n, H, D] uint8

    @staticmethod
    def of(rows: _Rows, slots: list[int]) -> _Written:
        """The rows of these slots (each with one writer): their tokens and actual bytes."""
        return _Written(rows, [rows.writers[s][0] for s in slots], torch.stack([rows.row(rows.act, s) for s in slots]))

    def fits(self, predicted: torch.Tensor | list[torch.Tensor]) -> bool:
        """Whether the actual rows equal the prediction (or one of a list, byte by byte)."""
        options = predicted if isinstance(predicted, list) else [predicted]
        ok = torch.zeros_like(self.actual, dtype=torch.bool)
        for p in options:
            ok |= p[self.tokens] == self.actual
        return bool(ok.all())


def _read_past_scale(rows: _Rows, held: str) -> torch.Tensor:
    """Head h divided by the h-th float32 word from a one-element scale tensor's start: its own value, then the
    words the suite puts after it (strategies.build.SCALE_GUARD), as a kernel that reads an [H] scale with a
    stride of 1 where the scale has one element does."""
    values = (_scale_value(rows.scale), *SCALE_GUARD)[:rows.x.shape[1]]
    return torch.cat([rows.q(held, value)[:, h:h + 1] for h, value in enumerate(values)], dim=1)


def _applied_twice(rows: _Rows, held: str) -> list[torch.Tensor]:
    """The recipe on inputs already scaled once: x / s (or x * (1/s)) in fp32, or rounded back to the input
    dtype, then quantized with s again (a caller's pre-scaled tensor passed to a write that scales)."""
    s = _scale_value(rows.scale)
    x32 = rows.x.float()
    s32 = torch.tensor(s, dtype=torch.float32)
    once = [x32 / s32, x32 * (torch.ones_like(s32) / s32)]
    once += [y.to(rows.x.dtype).float() for y in once]
    return [_quantized(y, s, held, rows.case.cache_format) for y in once]


def _round_to_odd_fp32(y: torch.Tensor) -> torch.Tensor:
    """float64 to float32 rounded to odd (toward zero, the last bit set where inexact): a second rounding to fp8's
    few bits then rounds as once from y itself."""
    t = y.to(torch.float32)
    exact = (t.double() == y) | ~torch.isfinite(y)
    bits = t.view(torch.int32)
    bits = torch.where((t.double().abs() > y.abs()) & ~exact, bits - 1, bits)  # a magnitude one ulp toward zero
    return torch.where(exact, bits, bits | 1).view(torch.float32)


def _unrounded(rows: _Rows, held: str) -> torch.Tensor | None:
    """The held recipe's quotient (x / s) or product (x * fl32(1/s)) in float64, rounded once into the cache's
    format: an encoder that works in double, or a multiply fused into the conversion. Only for recipes with no
    input-dtype rounding, where fp32's rounding is the one step it skips."""
    rule = get_recipe(held)
    if rule.intermediate != "none" or rule.scale_dtype != "fp32":
        return None
    s = torch.tensor(_scale_value(rows.scale), dtype=torch.float32)
    x = rows.x.double()
    y = x * (torch.ones_like(s) / s).double() if rule.scale_op == "mul_reciprocal" else x / s.double()
    return _quantized(_round_to_odd_fp32(y), 1.0, "divide", rows.case.cache_format)


def _value_models(w: _Written, held: str, case: Case) -> Iterator[tuple[str, Callable[[], torch.Tensor | list]]]:
    rows = w.rows
    if case.cache_format != "fp8_e4m3":  # first: a kernel that writes e4m3 whatever it is told
        yield "format:e4m3-bytes", lambda: [_quantized(rows.x, _scale_value(rows.scale), held),
                                            *_e4m3_of_e5m2(rows, held, case)]
    flushed = _inputs_flushed(rows, held)
    if flushed is not None:  # first: at a tiny scale, scale:ignored and others read these zeros alike
        yield "flush-to-zero:inputs", lambda: flushed
    for r in RECIPES:
        if r != held:
            yield f"rounding:{r}", lambda r=r: rows.q(r)
    unrounded = _unrounded(rows, held)
    if unrounded is not None:  # after the recipes: on a few bytes, one of them may fit too, and re-drawn values tell
        yield "rounding:unrounded", lambda: unrounded
    for key, value in _scale_variant_values(rows).items():
        if key == "scale:inverted":  # x * s itself (x / fl(1/s) rounds otherwise), under any recipe's steps
            yield key, lambda: [_multiplied(rows, r) for r in RECIPES]
        elif key.startswith("scale:held-"):  # under any recipe's steps: the closest recipe need not be its own
            yield key, lambda value=value: [rows.q(r, value) for r in RECIPES]
        else:
            yield key, lambda value=value: rows.q(held, value)
    if rows.scale.kind in ("tensor0d", "tensor1") and rows.x.shape[1] > 1:  # a per-head read of a broadcast scale
        yield "scale:read-past-tensor", lambda: _read_past_scale(rows, held)
    yield "scale:dynamic", lambda: _dynamic(rows, held)
    firsts = _first_values(rows) if rows.scale.kind == "none" else []
    if firsts:  # a None scale's placeholder pointer loaded: an input's first value as the scale or its reciprocal
        yield "scale:none-read-from-input", lambda: [m for r in RECIPES for f in firsts
                                                     for m in (_multiplied(rows, r, f), rows.q(r, f))]
    yield "scale:applied-twice", lambda: _applied_twice(rows, held)
    own = _scale_value(rows.scale)
    if 0 < own < float("inf") and math.frexp(own)[0] != 0.5:  # not a power of two already
        # 2**ceil(log2 s); below fp32's normal range, a bit trick on the exponent field gives 2**-126
        ups = {2.0 ** math.ceil(math.log2(own)), max(2.0 ** math.ceil(math.log2(own)), FP32_TINY)}
        yield "scale:power-of-two", lambda: [rows.q(r, up) for r in RECIPES for up in sorted(ups)]
    if case.cache_format == "fp8_e5m2":  # e5m2 has infinities: a cast without saturation writes them
        yield "encoding:overflow-inf", lambda: _overflow_inf(rows, held)
        kept = _inf_kept(rows, held)
        if kept is not None:
            yield "encoding:inf-kept", lambda: kept
        yield "encoding:e5m2-top-exponent-finite", lambda: _top_exponent_finite(rows, held)
    own_max = CACHE_FORMATS[case.cache_format].max_finite
    for bound in sorted({f.max_finite for f in CACHE_FORMATS.values() if f.max_finite < own_max}):
        yield f"encoding:overflow-at:{bound:g}", lambda bound=bound: _overflow_at(rows, held, bound)
    if case.cache_format == "fp8_e4m3":  # e5m2's ±inf bytes "fixed up" to its largest finite on an e4m3 cache
        yield "encoding:e5m2-inf-fixup", lambda: _e5m2_inf_fixup(rows.q(held))
    if case.cache_format == "fp8_e4m3fnuz":  # a NaN byte fixed up by e4m3fn's rule: 0x7F, +240 in fnuz
        yield "encoding:e4m3-nan-byte", lambda: torch.where(rows.q(held) == FNUZ_NAN, E4M3_NAN, rows.q(held))
    other_nan = _other_nan_mask(rows, held)
    if other_nan is not None:
        yield "kv-mixed:nan-mask", lambda: other_nan
    nan_as = _nan_written_as(w, held)
    if nan_as is not None:  # the byte in the key: re-drawn calls must write the same one
        yield f"encoding:nan-byte:0x{nan_as[0]:02X}", lambda: nan_as[1]
    own_emin = CACHE_FORMATS[case.cache_format].min_normal_exp
    for emin in sorted({f.min_normal_exp for f in CACHE_FORMATS.values()} - {own_emin}):
        if emin > own_emin:  # another format's smallest normal, coarser: its subnormal grid
            yield f"subnormal-grid:{emin}", lambda emin=emin: _subnormal_grid(rows, held, emin)
    yield "storage:or-old", lambda: _or_old(rows, held)
    yield "storage:added-to-old", lambda: _added_to_old(rows, held)
    # Inputs clamped before the scale: to the format's largest finite value (a guard put on the input instead of
    # the quotient: past it, x/s is ±max/s where the recipe saturates at ±max), or to their own dtype's (a guard
    # against inf, `x.clamp(-finfo.max, finfo.max)`: ±inf becomes ±max/s, finite values stay).
    for key, bound in (("input-clamped", CACHE_FORMATS[case.cache_format].max_finite),
                       ("input-clamped:dtype-max", torch.finfo(rows.x.dtype).max)):
        clamped = _clamped_inputs(rows, held, bound)
        if clamped is not None:
            yield key, lambda clamped=clamped: clamped
    # `torch.nan_to_num` before the scale, on the input or on its fp32 widening: both of its rules at once, where
    # the Case has a NaN and an inf to show them (either alone is `encoding:nan-lost` or the clamp above)
    for dtype in dict.fromkeys((rows.x.dtype, torch.float32)):
        replaced = _nan_to_num(rows, held, dtype)
        if replaced is not None:
            yield "input-clamped:nan-to-num", lambda replaced=replaced: replaced
    for floor in SCALE_FLOORS:  # a guard under the scale (`s.clamp(min=1e-12)`) that a legal tiny scale meets
        if own < floor:  # the floor in the key, so that re-drawn calls must show the same one
            yield f"scale:floored:{floor:g}", lambda floor=floor: rows.q(held, floor)
    narrower = {torch.float32: (torch.bfloat16, torch.float16), torch.bfloat16: (torch.float16,),
                torch.float16: (torch.bfloat16,)}.get(rows.x.dtype, ())
    # an input converted first (float32 narrowed for a bf16/fp16 kernel; bf16 sent through a kernel built for
    # fp16, which overflows past 65504 and loses small values)
    for dtype in narrower:
        yield f"input-rounded:{str(dtype).split('.')[1]}", lambda dtype=dtype: _quantized(
            rows.x.to(dtype).to(rows.x.dtype), _scale_value(rows.scale), held, case.cache_format)
    # A deviation of the arithmetic is read against every recipe's steps, the held one first: a kernel that
    # matches no recipe is held to the closest, which need not be the one it deviates from.
    order = [held] + [r for r in RECIPES if r != held]
    for r in order:
        yield "flush-to-zero", lambda r=r: [_flushed(rows.q(r), True, case.cache_format),
                                             _flushed(rows.q(r), False, case.cache_format)]
    if case.cache_dtype == "uint8":
        yield "storage:value-cast", lambda: _value_cast(rows, held)
    yield "storage:sign-negated", lambda: _sign_negated(rows, held)
    for r in order:
        yield "rounds-toward-zero", lambda r=r: _toward_zero(rows, r)
    for r in order:
        yield "rounds-ties-away", lambda r=r: _ties_away(rows, r)
    for r in order:
        yield "rounds-ties-to-odd", lambda r=r: _ties_to_odd(rows, r)
    for r in order:
        yield "rounds-ties-toward-zero", lambda r=r: _ties_toward_zero(rows, r)
    for r in order:
        yield "rounds-sticky-lost", lambda r=r: _sticky_lost(rows, r)
    for r in order:
        yield "carry-lost", lambda r=r: _carry_lost(rows, r)
    other = {torch.bfloat16: (torch.float16,), torch.float16: (torch.bfloat16,),
             torch.float32: (torch.bfloat16, torch.float16)}.get(rows.x.dtype, ())
    rebiased = _fp16_widened_as_normal(rows.x)
    if rebiased is not None:  # a widening right for normal values only: zeros and subnormals near 2**-15
        yield "input-misread:fp16-subnormals", lambda: _quantized(rebiased, _scale_value(rows.scale), held,
                                                                  case.cache_format)
    zeros = _inputs_zero(rows, held)
    if zeros is not None:  # after the rules that write zeros for some values (flushes, underflows)
        yield "input-misread:zeros", lambda: zeros
    for dtype in other:  # an input sent down another dtype's path: its bytes read as that dtype's
        yield f"input-misread:{str(dtype).split('.')[1]}", lambda dtype=dtype: _quantized(
            _read_as(rows.x, dtype), _scale_value(rows.scale), held, case.cache_format)
    for fmt in CACHE_FORMATS:  # bytes of another format (a uint8 cache taken to hold e5m2, say)
        if fmt not in (case.cache_format, "fp8_e4m3"):
            yield f"format:{fmt.removeprefix('fp8_')}-bytes", lambda fmt=fmt: _other_format(rows, held, fmt)
    # before a scale off by a binade: a subnormal doubled is also that value under half the scale
    yield "subnormal-shift", lambda: _subnormal_shifted(rows, held)
    own_bias = 1 - CACHE_FORMATS[case.cache_format].min_normal_exp
    for bias in sorted({1 - f.min_normal_exp for f in CACHE_FORMATS.values()}):
        if abs(bias - own_bias) > 1:  # one binade apart is a scale off by one (e4m3fnuz's 8 beside e4m3's 7)
            yield f"exponent-bias:{bias}", lambda bias=bias: _rebiased(rows, held, bias - own_bias)
    if 0 < own < float("inf"):  # after the formats: e4m3fnuz's bytes are e4m3's at half the value
        # a kernel that takes the exponent apart for powers of two only is right at other scales: there its
        # own scale is one of the alternatives (the call is right at the telling scales the effect is held to)
        others = [] if math.frexp(own)[0] == 0.5 else [own]
        yield "scale:exponent-off-by-one", lambda: [rows.q(held, x) for x in (own * 2, own / 2, *others)]
    for dtype in (torch.float16, torch.bfloat16):
        yield f"double-rounding:{str(dtype).split('.')[1]}", lambda dtype=dtype: _through(rows, held, dtype)
        if get_recipe(held).intermediate == "input" and rows.x.dtype != dtype:
            yield f"double-rounding:{str(dtype).split('.')[1]}", lambda dtype=dtype: _through(rows, held, dtype, True)
    saturated = _saturated_low(w, held)
    if saturated is not None:  # the bound in the key: re-drawn calls must show the same one
        yield f"saturates-low:{saturated[0]:g}", lambda: saturated[1]
    for r in order:
        yield "approximate-division", lambda r=r: [rows.q(r), *_neighbours(rows, r)]


def _e4m3_of_e5m2(rows: _Rows, held: str, case: Case) -> list[torch.Tensor]:
    """In an e5m2 cache, e4m3 bytes of the right e5m2 values: an e5m2 result stored through a view typed e4m3
    (`cache.view(torch.float8_e4m3fn)[i] = q`, a value conversion), saturating at ±448 or as torch's cast,
    which makes a value past 448 NaN."""
    if case.cache_format != "fp8_e5m2":
        return []
    values = _quantized(rows.x, _scale_value(rows.scale), held, "fp8_e5m2").view(torch.float8_e5m2).float()
    return [_quantized(values, 1.0, held), values.to(torch.float8_e4m3fn).view(torch.uint8)]


def _other_format(rows: _Rows, held: str, fmt: str) -> list[torch.Tensor]:
    """Each token's bytes in another format; a NaN as that format's NaN byte or as the cache's own: a kernel
    that took the format from elsewhere still writes the NaN byte its author set explicitly (0x7F)."""
    theirs = _quantized(rows.x, _scale_value(rows.scale), held, fmt)
    own_nan = _quantized(torch.tensor([float("nan")]), 1.0, held, rows.case.cache_format)[0]
    return [theirs, torch.where(rows.x.isnan(), own_nan, theirs)]


def value_keys_fitting(case: Case, expected: Built, actual: Built, before: dict[str, torch.Tensor],
                       keys: list[str]) -> list[str]:
    """Of these value effects, those whose model gives every written byte of one of this call's caches, where
    the call holds no other evidence (it passes): a model that predicts other bytes than either cache holds is
    refuted (a scale ignored where scales of 0.3 and 1.7 are right). Keys no model of this call computes are
    kept."""
    ok: dict[str, bool] = {}
    for which in CACHES:
        rows = _Rows(case, which, expected, actual, before)
        single = [s for s in rows.writers if len(rows.writers[s]) == 1]
        if not single:
            continue
        w = _Written.of(rows, single)
        seen: dict[str, bool] = {}
        for key, model in _value_models(w, case.recipe, case):
            if key in keys and not seen.get(key):
                seen[key] = w.fits(model())
        for key, fits in seen.items():  # one cache it fits is enough: an effect is read cache by cache (a 0-d
            ok[key] = ok.get(key, False) or fits  # scale's rounding predicts nothing right of a 1-element scale)
    return [k for k in keys if ok.get(k, True)]


def encoding_key(e: torch.Tensor, a: torch.Tensor) -> str | None:
    """encoding:<kinds> (or zero-sign:...) when every differing byte pair is a NaN, zero or overflow rule."""
    differ = e != a
    nan, zero = _sign_pairs(e, a)
    kinds = set()
    if (differ & nan).any():
        kinds.add("nan-sign")
    zero_pairs = differ & zero
    rest = differ & ~nan & ~zero
    nan_e, nan_a = (e & 0x7F) == 0x7F, (a & 0x7F) == 0x7F
    sat_e, sat_a = (e & 0x7F) == 0x7E, (a & 0x7F) == 0x7E
    rules = {"saturates": nan_e & sat_a, "nan-past-448": sat_e & nan_a, "nan-produced": nan_a & ~nan_e & ~sat_e,
             "nan-lost": nan_e & ~nan_a & ~sat_a, "overflow-sign": sat_e & sat_a & (((e ^ a) & 0x80) != 0),
             "overflow-zero": sat_e & ((a & 0x7F) == 0)}
    covered = torch.zeros_like(rest)
    for name, where in rules.items():
        if (rest & where).any():
            kinds.add(name)
            covered |= rest & where
    if bool((rest & ~covered).any()):
        return None
    if zero_pairs.any():
        if kinds:
            return None  # two rules in one call: leave it to the ablations to separate them
        return "zero-sign:" + ("minus" if bool(((e == 0) & (a == 0x80))[zero_pairs].any()) else "plus")
    return "encoding:" + "+".join(sorted(kinds)) if kinds else None


def _infinities_only(w: _Written, e: torch.Tensor, held: str) -> str | None:
    """For NaN-past-448 bytes: "shown" when they are those of infinite values only (before the cast: ±inf
    inputs, or quotients past fp32's range) and the call's finite values past 464 saturate as the recipe
    says (the rule is about infinity, not the range); "possible" when they are infinite values' but no
    finite value past 464 is here to tell; None when a finite value got NaN."""
    y = _pre_cast(w.rows, held)[w.tokens]
    nan_for_sat = ((e & 0x7F) == 0x7E) & ((w.actual & 0x7F) == 0x7F)
    if not bool(torch.isinf(y[nan_for_sat]).all()):
        return None
    finite_past = torch.isfinite(y) & (y.abs() > 464.0)
    return "shown" if bool(((w.actual & 0x7F) == 0x7E)[finite_past].any()) else "possible"


def _nan_sign_only(e: torch.Tensor, a: torch.Tensor) -> bool:
    """Whether every differing byte pair is the same NaN but for its sign bit (0x7F against 0xFF)."""
    differ = e != a
    return bool(differ.any()) and bool((((e ^ a) == 0x80) & ((e & 0x7F) == 0x7F))[differ].all())


def _fnuz_nan_lost(e: torch.Tensor, a: torch.Tensor) -> bool:
    """Whether every differing byte of an e4m3fnuz cache is its NaN (0x80) written as a finite byte."""
    differ = e != a
    return bool(differ.any()) and bool((e[differ] == FNUZ_NAN).all())


def _off_by_one(e: torch.Tensor, a: torch.Tensor, cache_format: str = "fp8_e4m3") -> bool:
    differ = e != a
    same_sign = ((e ^ a) & 0x80) == 0
    top = _finite_bytes(CACHE_FORMATS[cache_format])
    finite = ((e & 0x7F) < top) & ((a & 0x7F) < top)
    step = ((e & 0x7F).to(torch.int16) - (a & 0x7F).to(torch.int16)).abs() == 1
    return bool((~differ | (same_sign & finite & step)).all())


#: Effects on values below the smallest normal alone: a wrong byte of a normal value is another cause's.
SUBNORMAL_ONLY = ("subnormal-path", "subnormal-shift", "flush-to-zero")


def _below_normal(w: _Written, held: str, y: torch.Tensor | None = None) -> torch.Tensor:
    """Which of the rows' elements are nonzero values below the format's smallest normal (y: the recipe's fp32
    value before the cast, computed when not given): the ones an encoder's subnormal path writes."""
    y = _pre_cast(w.rows, held)[w.tokens] if y is None else y
    return (y.abs() < 2.0**CACHE_FORMATS[w.rows.case.cache_format].min_normal_exp) & (y != 0)


def _subnormal_range_only(w: _Written, e: torch.Tensor, held: str) -> bool:
    """Whether every differing byte is of a nonzero value below the format's smallest normal, every normal value
    right: a byte that the encoder's subnormal path alone writes wrong (its shift, its implicit bit, its flush
    bound), whatever the rule."""
    return bool(_below_normal(w, held)[e != w.actual].all())


def _normal_values_rule(w: _Written, e: torch.Tensor, held: str,
                        case: Case) -> tuple[list[str], torch.Tensor | None]:
    """The value rules that give every byte but those in the subnormal range (the rule's or the recipe's), where
    those differ by no rule: two defects of one encoder, one of them in its subnormal path, which runs on what
    the other rule made of the value (an e5m2 bias constant wrong beside a flush bound one binade high, held-out
    batch 61's pair: a quotient of 2**-10 rebiased to 2**-18 is then flushed). Returns the rules and the bytes
    the first one leaves to the subnormal path; ([], None) unless some byte differs outside the recipe's
    subnormal range."""
    y = _pre_cast(w.rows, held)[w.tokens]
    small = _below_normal(w, held, y)
    differ = e != w.actual
    if not bool((differ & ~small).any()):
        return [], None
    mbits = CACHE_FORMATS[case.cache_format].mantissa_bits
    nonzero = y != 0
    # a byte the subnormal path writes: below the smallest normal, or rounded up to it
    sub_written = (w.actual.to(torch.int64) & 0x7F) <= 1 << mbits
    keys, off = [], None
    for key, model in _value_models(w, held, case):
        predicted = model()
        ok = torch.zeros_like(differ)
        below = small.clone()
        for p in predicted if isinstance(predicted, list) else [predicted]:
            p = p[w.tokens]
            ok |= p == w.actual
            below |= ((p.to(torch.int64) & 0x7F) >> mbits == 0) & nonzero
        missed = ~ok
        if bool((missed & ~(below & sub_written)).any()) or not bool(missed.any()) or not bool((ok & differ).any()):
            continue
        keys.append(key)
        off = missed if off is None else off
    return keys, off


def _sign_only(e: torch.Tensor, a: torch.Tensor) -> str | None:
    """sign:dropped (or sign:added) when every differing byte differs from the recipe's in its sign bit alone,
    all one way: a sign lost (or set) by an encoder branch, for the kinds of value the detail names."""
    differ = e != a
    if not differ.any() or bool((((e ^ a) != 0x80) & differ).any()):
        return None
    negative = (e[differ] & 0x80) != 0
    return "sign:dropped" if bool(negative.all()) else "sign:added" if not bool(negative.any()) else None


def _on_some_heads(w: _Written, e: torch.Tensor, held: str, case: Case) -> tuple[str, str] | None:
    """A value model that gives every byte of the heads that are wrong, where the others are right: (key, which
    heads) for a rule applied to some heads alone (a per-head scale vector read where one scale is given)."""
    heads = w.actual.shape[1]
    wrong = [h for h in range(heads) if bool((e[:, h] != w.actual[:, h]).any())]
    if heads < 2 or len(wrong) in (0, heads):
        return None
    for key, model in _value_models(w, held, case):
        predicted = model()
        options = predicted if isinstance(predicted, list) else [predicted]
        if any(bool((p[w.tokens][:, wrong] == w.actual[:, wrong]).all()) for p in options):
            right = [h for h in range(heads) if h not in wrong]
            return key, f"only on heads {', '.join(map(str, wrong))} (heads {', '.join(map(str, right))} right)"
    return None


def _values(case: Case, expected: Built, actual: Built, before: dict[str, torch.Tensor],
            only: frozenset[str] = frozenset()) -> list[Effect]:
    """Value effects, one per differing cache, when only written slots differ; [] otherwise. With `only`, the
    models of those keys are tried first, and the rest only where none of them fits: a caller asking whether
    these keys fit again reads the same answer without some forty other models' reference calls."""
    held = case.recipe
    effects = []
    written = _single_writers(case, expected, actual, before)
    if written is None:  # bytes outside the written slots (a placement defect), or in a slot of several writers
        return []
    for which, (rows, single) in written.items():
        w = _Written.of(rows, single)
        e = torch.stack([rows.row(rows.exp, s) for s in single])
        old = torch.stack([rows.row(rows.before, s) for s in single])
        kept = (w.actual == old)[e != w.actual]
        if kept.numel() > 1 and bool(kept.all()):
            return []  # every differing byte is the slot's old one: not written (no value rule fit by chance;
            # one byte alone is no evidence: a seeded old byte is 0x00 one time in 256, as a flushed value is)
        found = list(dict.fromkeys(key for key, model in _value_models(w, held, case)
                                   if key in only and w.fits(model()))) if only else []
        if not found:
            found = list(dict.fromkeys(key for key, model in _value_models(w, held, case) if w.fits(model())))
        encoding = encoding_key(e, w.actual) if case.cache_format == "fp8_e4m3" else None  # e4m3's byte rules
        if case.cache_format == "fp8_e5m2" and _nan_sign_only(e, w.actual):
            encoding = "encoding:nan-sign"  # e5m2's NaN bytes keep a sign too (0x7F and 0xFF)
        if case.cache_format == "fp8_e4m3fnuz" and not found and _fnuz_nan_lost(e, w.actual):
            encoding = "encoding:nan-lost"  # fnuz's NaN is 0x80: +0 for it differs in its sign bit alone
        infinities = _infinities_only(w, e, held) if encoding == "encoding:nan-past-448" else None
        if infinities == "shown":
            encoding = "encoding:inf-nan"
        if encoding:
            found.insert(0, encoding)  # a sign or overflow rule is the most specific
        nan = torch.tensor(sorted(_nan_bytes(case.cache_format)), dtype=e.dtype)
        if "kv-mixed:nan-mask" in found and not bool(torch.isin(e[e != w.actual], nan).all()):
            # but for the cause of its NaN where the recipe gives a finite byte (where it gives NaN too, a sign
            # rule is the one: the mask's own-NaN bytes with their sign kept are a NaN sign kept)
            found.insert(0, found.pop(found.index("kv-mixed:nan-mask")))
        if infinities == "possible":  # no finite value past 464 here to tell the two apart
            found.insert(1, "encoding:inf-nan")
        if _subnormal_range_only(w, e, held):  # the widest class of a wrong subnormal, after every rule in it
            found.append("subnormal-path")  # and before a byte one ulp off: a subnormal's ulp is the widest
        if _off_by_one(e, w.actual, case.cache_format) and "off-by-one-ulp" not in found:
            # The widest class of a byte one ulp off, last: an alternative of every narrower one (within two fp32
            # ulps before the cast is within one e4m3 ulp after it), so that a kernel off by up to one ulp is one
            # defect whichever Case showed it, and what remains when re-drawn values refute the narrower one.
            found.append("off-by-one-ulp")
        rules = [k for k in found if k != "subnormal-path"]  # a head's or a sign's rule is narrower than it
        heads = None if rules else _on_some_heads(w, e, held, case)
        if heads is not None:
            found = [heads[0], *found]
        sign = None if rules or heads else _sign_only(e, w.actual)
        if sign is not None:
            found = [sign, *found]
        kind = (case.k_scale if which == "k_cache" else case.v_scale).kind
        split, off = ([], None) if found else _normal_values_rule(w, e, held, case)
        if split:
            by_rule = (e != w.actual) & ~off
            effects.append(Effect(split[0], title_of(split[0], held), f"{which}, {kind} scale; every byte but some "
                                  "in the subnormal range, which differ another way; the differing bytes' values: "
                                  f"{kinds_text(e[by_rule], case.cache_format)}", value=True, alternatives=split[1:]))
            effects.append(Effect("subnormal-path", title_of("subnormal-path", held), f"{which}, {kind} scale; "
                                  f"beside {split[0]}, subnormal results of its values wrong; the recipe's bytes "
                                  f"there: {kinds_text(e[off], case.cache_format)}", value=True, beside=split[0]))
            continue
        if not found:
            return []
        where = f"{heads[1]}; " if heads is not None else ""
        effects.append(Effect(found[0], title_of(found[0], held), f"{which}, {kind} scale; {where}the differing "
                              f"bytes' values: {kinds_text(e[e != w.actual], case.cache_format)}", value=True,
                              alternatives=found[1:]))
    return effects


# -- moved models: the reference's own bytes, every one of them, in other places -----------------------

#: The most bytes of a cache's slots a moved model compares (a minimal Case is small; a whole big call is not read
#: this way). The slots' bytes, not the buffer's: a strided cache's padding is never read. 8 MiB: a minimal Case of
#: 257 tokens, each on a page of 16 slots of its own (the page-size ablation keeps T), holds 2 MiB, and the models
#: compare row by row in well under a second there.
MOVED_MAX_BYTES = 1 << 23


def _too_many_to_move(case: Case) -> bool:
    return case.num_slots * case.num_heads * case.head_dim > MOVED_MAX_BYTES


def _permutation(e: torch.Tensor, a: torch.Tensor) -> list[int] | None:
    """pi with a[i] == e[pi[i]] for each i along dim 0 (pi[i] = i where a[i] is right), when that is not the
    identity; None where some wrong a[i] equals none of e's, or several (rows too alike to tell which moved)."""
    n = e.shape[0]
    e2, a2 = e.reshape(n, -1), a.reshape(n, -1)
    if n < 2 or e2.shape[1] < 2:
        return None
    pi = []
    for i in range(n):
        if torch.equal(a2[i], e2[i]):
            pi.append(i)
            continue
        hits = (e2 == a2[i]).all(1).nonzero().flatten().tolist()
        if len(hits) != 1:
            return None
        pi.append(hits[0])
    return None if pi == list(range(n)) else pi


def _mapping_words(pi: list[int], what: str) -> str:
    """A permutation in words: reversed, rotated, halves swapped, interleaved, or its first moves."""
    n = len(pi)
    if pi == list(range(n))[::-1]:
        return f"{what}s in reverse order ({what} i holds {what} {n - 1}-i)"
    for k in range(1, n):
        if pi == [(i + k) % n for i in range(n)]:
            return f"{what} i holds {what} i+{k} (mod {n})"
    if n % 2 == 0:
        half = n // 2
        if pi == [2 * i if i < half else 2 * (i - half) + 1 for i in range(n)]:
            return f"even {what}s first, then odd ones (de-interleaved)"
        if pi == [i // 2 + (i % 2) * half for i in range(n)]:
            return f"the two halves' {what}s interleaved"
    moves = [f"{what} {i} holds {what} {j}" for i, j in enumerate(pi) if i != j]
    return ", ".join(moves[:4]) + (f" (and {len(moves) - 4} more)" if len(moves) > 4 else "")


def _single_writers(case: Case, expected: Built, actual: Built, before: dict[str, torch.Tensor]
                    ) -> dict[str, tuple[_Rows, list[int]]] | None:
    """Each differing cache's rows and its slots of one writer each; None where bytes differ outside the written
    slots (a placement defect), or in a slot several tokens write (which token's bytes it holds is left open)."""
    found = {}
    for which in CACHES:
        diff = expected.buffers[which].cpu() != actual.buffers[which].cpu()
        if not diff.any():
            continue
        if (diff & ~written_mask(case, which)).any():
            return None
        rows = _Rows(case, which, expected, actual, before)
        if any(len(rows.writers[s]) > 1 and diff[rows.index[s]].any() for s in rows.writers):
            return None
        found[which] = (rows, [s for s in rows.writers if len(rows.writers[s]) == 1])
    return found


def _written_rows(case: Case, expected: Built, actual: Built, before: dict[str, torch.Tensor]
                  ) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
    """Each differing cache's single-writer rows, expected and actual ([n, H, D] each), as _single_writers."""
    found = _single_writers(case, expected, actual, before)
    return None if found is None else {
        which: (torch.stack([rows.row(rows.exp, s) for s in single]),
                torch.stack([rows.row(rows.act, s) for s in single])) for which, (rows, single) in found.items()}


def _within_rows(case: Case, expected: Built, actual: Built, before: dict[str, torch.Tensor]) -> Effect | None:
    """Heads or dims permuted within each written slot: every written row holds the reference's bytes of its own
    token, with one permutation of its heads (or of each head's dims) for all tokens of a cache (a head index
    or a vector store's lanes computed wrongly)."""
    written = None if _too_many_to_move(case) else _written_rows(case, expected, actual, before)
    if not written:
        return None
    for axis, what, key in ((1, "head", "strides:heads-permuted"), (2, "dim", "strides:dims-permuted")):
        words = []
        for which, (e, a) in written.items():
            pi = _permutation(e.movedim(axis, 0), a.movedim(axis, 0))
            if pi is None:
                words = []
                break
            words.append(f"{which}: {_mapping_words(pi, what)}")
        if words:
            return Effect(key, TITLES[key], "; ".join(words))
    return None


def _rows_permuted(case: Case, expected: Built, actual: Built, before: dict[str, torch.Tensor]) -> Effect | None:
    """(token, head) rows permuted across the batch: every wrong written row holds the reference's bytes of
    another (token, head) row, and some of another token (a [H, T, D] result reshaped to [T, H, D], not
    transposed, also moves rows within a token); read after the permutations within a token and the whole tokens
    moved. Rows alike (saturated, or patterned values) may match several: any will do, another token's first,
    as the bytes cannot tell them apart."""
    written = None if _too_many_to_move(case) else _written_rows(case, expected, actual, before)
    if not written:
        return None
    heads, words = case.num_heads, []
    for which, (e, a) in written.items():
        e2, a2 = e.flatten(0, 1).flatten(1), a.flatten(0, 1).flatten(1)
        pi = []
        for r in range(e2.shape[0]):
            if torch.equal(a2[r], e2[r]):
                pi.append(r)
                continue
            others = [j for j in (e2 == a2[r]).all(1).nonzero().flatten().tolist() if j != r]
            if not others:
                return None
            pi.append(next((j for j in others if j // heads != r // heads), others[0]))
        if all(i // heads == j // heads for i, j in enumerate(pi)):
            return None  # rows moved within tokens only: _within_rows's, where one permutation fits them
        words.append(f"{which}: {_mapping_words(pi, 'row')} (row r: the r // {heads}-th written slot, head "
                     f"r % {heads})")
    return Effect("strides:rows-permuted", TITLES["strides:rows-permuted"], "; ".join(words))


def _tokens_moved(case: Case, expected: Built, actual: Built, before: dict[str, torch.Tensor]) -> Effect | None:
    """Whole tokens at other slots: every slot whose bytes are wrong holds its old bytes (left unwritten) or
    some token's reference bytes, and at least one holds a token's bytes somewhere else than that
    token's slot (a slot index computed wrongly: off by one, another token's, another page's)."""
    if _too_many_to_move(case):
        return None
    moves: list[tuple[int, int]] = []  # (token, slot it landed at)
    copies: list[bool] = []  # each move: whether the token's own slot holds its bytes too (a stray second store)
    for which in CACHES:
        exp, act = expected.buffers[which].cpu(), actual.buffers[which].cpu()
        if torch.equal(exp, act):
            continue
        rows = _Rows(case, which, expected, actual, before)
        outside = exp != act
        outside[rows.index.flatten()] = False
        if outside.any():  # bytes changed outside every slot (between pages, past the view): not whole tokens
            return None
        try:
            own = rows.q(case.recipe)
        except Exception:  # a scale kind the per-tensor model cannot quantize: not this model
            return None
        ref = own.clone()
        for s, ts in rows.writers.items():  # the reference's own bytes of each written token
            if len(ts) == 1:
                ref[ts[0]] = rows.row(rows.exp, s)
        for s in range(case.num_slots):
            got = rows.row(rows.act, s)
            if torch.equal(got, rows.row(rows.exp, s)):
                continue
            if s in rows.writers and any(torch.equal(got, ref[t]) for t in rows.writers[s]):
                continue  # a shared slot may hold any of its tokens' bytes
            if torch.equal(got, rows.row(rows.before, s)):
                continue  # left unwritten
            hits = (ref.flatten(1) == got.flatten()).all(1).nonzero().flatten().tolist()
            if not hits:
                return None
            moves.append((hits[0], s))  # tokens of identical bytes (all zeros, say): any of them
            own_slot = case.cache_loc[hits[0]]
            copies.append(0 <= own_slot < case.num_slots
                          and torch.equal(rows.row(rows.act, own_slot), rows.row(rows.exp, own_slot)))
    if not moves:
        return None
    offsets = {s - case.cache_loc[t] for t, s in moves}
    if len(offsets) == 1 and all(0 <= case.cache_loc[t] < case.num_slots for t, _ in moves):
        k = offsets.pop()
        detail = f"each moved token {abs(k)} slot{'s' if abs(k) != 1 else ''} {'past' if k > 0 else 'before'} its own"
    else:
        named = {s: t for t, s in enumerate(case.cache_loc)}
        if all(s in named for _, s in moves):
            detail = "tokens at other tokens' slots: " + ", ".join(
                f"token {t} at token {named[s]}'s slot" for t, s in sorted(set(moves))[:4])
        else:
            detail = ", ".join(f"token {t} (slot {case.cache_loc[t]}) at slot {s}" for t, s in sorted(set(moves))[:4])
    if all(copies):
        detail += "; each also written at its own slot (a stray second store)"
    if all(case.cache_loc[t] < 0 for t, _ in moves) and {s for _, s in moves} == {0}:
        # Padding tokens at slot 0: on a GPU, which of them lands there is undefined, so the padding model's
        # exact simulation may not reproduce the bytes while each slot holds one token's own. (A kernel that
        # sorts the slots and not the rows puts padding there too; a larger call tells them apart.)
        return Effect("padding:slot-0", TITLES["padding:slot-0"], detail, alternatives=["wrong-slot:tokens-moved"])
    return Effect("wrong-slot:tokens-moved", TITLES["wrong-slot:tokens-moved"], detail)


def _spans(values: list[int]) -> str:
    """1, 2, 3, 7 -> '1-3, 7'."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)


def unwritten_where(case: Case, expected: Built, actual: Built) -> str:
    """Which part of the named slots kept its old bytes: some slots whole, some heads or some dims of each (a head
    loop that stops one short leaves the last head; a D tail leaves the last dims)."""
    slots = written_slots(case)
    if not slots:
        return ""
    diff = torch.zeros(len(slots), case.num_heads, case.head_dim, dtype=torch.bool)
    for which in CACHES:
        index = byte_index(case, which).flatten(0, 1)[torch.tensor(slots)]  # [n, H, D]
        diff |= (expected.buffers[which].cpu()[index] != actual.buffers[which].cpu()[index])
    parts = []
    named = [s for s, d in zip(slots, diff.flatten(1).any(1).tolist()) if d]
    if len(named) < len(slots):
        parts.append(f"slot{'s' if len(named) > 1 else ''} {_spans(named)[:80]} of the {len(slots)} named")
    heads = [h for h, d in enumerate(diff.any(2).any(0).tolist()) if d]
    if len(heads) < case.num_heads:
        parts.append(f"head{'s' if len(heads) > 1 else ''} {_spans(heads)} of {case.num_heads}")
    dims = [i for i, d in enumerate(diff.any(1).any(0).tolist()) if d]
    if len(dims) < case.head_dim:
        parts.append(f"dim{'s' if len(dims) > 1 else ''} {_spans(dims)} of {case.head_dim}")
    return "unwritten: " + ("; ".join(parts) if parts else "every named slot whole")


def _unwritten(case: Case, expected: Built, actual: Built, before: dict[str, torch.Tensor]) -> bool:
    """Whether every differing byte is a written byte that kept its old value (a token not written)."""
    for which in CACHES:
        exp, act, old = expected.buffers[which].cpu(), actual.buffers[which].cpu(), before[which].cpu()
        diff = exp != act
        if (diff & ~written_mask(case, which)).any() or (diff & (act != old)).any():
            return False
    return True


def byte_kinds(e: torch.Tensor, cache_format: str) -> Counter:
    """How many of these expected bytes are ±0, subnormal, normal, the largest finite magnitude, or NaN/inf:
    where in the format a residual lies (subnormal results only, say, is a subnormal rule gone wrong)."""
    fmt = CACHE_FORMATS[cache_format]
    e = e.to(torch.int64)
    mag = e & 0x7F
    top = _finite_bytes(fmt) - 1
    nan = (e == 0x80) if cache_format == "fp8_e4m3fnuz" else torch.zeros_like(e, dtype=torch.bool)  # fnuz's "-0"
    zero = (mag == 0) & ~nan
    sub = (mag >> fmt.mantissa_bits == 0) & ~zero & ~nan
    largest = mag == top
    beyond = nan | (mag > top)
    kinds = {"±0": zero, "subnormal": sub, "largest": largest, "NaN/inf": beyond,
             "normal": ~(zero | sub | largest | beyond)}
    return Counter({kind: int(mask.sum()) for kind, mask in kinds.items() if mask.any()})


def kinds_text(e: torch.Tensor, cache_format: str) -> str:
    """byte_kinds in words, commonest first: '14 subnormal, 2 normal'."""
    return _kinds_words(byte_kinds(e, cache_format).most_common())


def _kinds_words(kinds: list[tuple[str, int]]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in kinds)


def unexplained(key: str, expected: Built, actual: Built, why: str = "") -> Effect:
    """The effect of a diff that no model fits: its commonest byte pairs and which kinds of value it touches."""
    text, kinds = summary(expected, actual)
    return Effect(key, TITLES[key], f"{text}; {why}" if why else text, value_kinds=kinds)


def summary(expected: Built, actual: Built) -> tuple[str, tuple[str, ...]]:
    """The commonest (expected -> actual) byte pairs of a diff nothing explains, in words, and which kinds of
    value (byte_kinds') the expected bytes are, commonest first."""
    pairs: Counter = Counter()
    total = 0
    differing = []
    for which in CACHES:
        e, a = expected.buffers[which].cpu(), actual.buffers[which].cpu()
        d = e != a
        total += int(d.sum())
        pairs.update(zip(e[d].tolist()[:4096], a[d].tolist()[:4096]))
        differing.append(e[d][:4096])
    top = ", ".join(f"0x{x:02X}->0x{y:02X} x{n}" for (x, y), n in pairs.most_common(5))
    kinds = byte_kinds(torch.cat(differing), expected.case.cache_format).most_common()
    return f"{total} bytes differ; commonest (expected->actual): {top}; expected values: {_kinds_words(kinds)}", \
        tuple(kind for kind, _ in kinds)


def explain(case: Case, expected: Built, actual: Built, before: dict[str, torch.Tensor],
            fresh: Callable[[], Built], placement: bool = True, exclude: frozenset[str] = frozenset(),
            only: frozenset[str] = frozenset()) -> list[Effect]:
    """The effects that account for every differing cache byte of this call ([] when none differs); exclude:
    placement effects a larger call refuted; only: the value effects the caller asks about (_values)."""
    if _same_caches(expected, actual):
        return []
    if placement:  # first: an exact simulation of a misread argument, which no value rule can give by chance
        moved = _placement(case, actual, fresh, exclude)
        if moved is not None:
            return [moved]
    values = _values(case, expected, actual, before, only)
    if values:
        return values
    if _unwritten(case, expected, actual, before):
        return [Effect("wrong-slot:unwritten", TITLES["wrong-slot:unwritten"], unwritten_where(case, expected, actual))]
    for model in (_within_rows, _tokens_moved, _rows_permuted):  # after the value models: a permutation of few
        moved = model(case, expected, actual, before)  # bytes can fit a value defect by chance
        keys = [] if moved is None else [k for k in (moved.key, *moved.alternatives) if k not in exclude]
        if keys:
            return [moved if keys[0] == moved.key else Effect(keys[0], title_of(keys[0]), moved.detail,
                                                              alternatives=keys[1:])]
    if placement:  # last: one misread argument on some heads, the rest right (a head tile's wrong base)
        some = _placed_on_some_heads(case, expected, actual, fresh, exclude)
        if some is not None:
            return [some]
    outside = any(((expected.buffers[w].cpu() != actual.buffers[w].cpu()) & ~written_mask(case, w)).any()
                  for w in CACHES)
    return [unexplained("wrong-slot:unexplained" if outside else "wrong-bytes:unexplained", expected, actual)]
