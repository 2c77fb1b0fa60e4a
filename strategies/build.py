"""Case -> tensors, deterministically, on any device.

Every buffer is made on the target device from the Case's seed by integer hashing (`hash32`): the
value at each position is a pure function of (seed, tensor, position), computed with exact integer
operations, so the same Case gives the same bytes on every machine, device and torch version, and
building a large case costs a few dozen device ops instead of CPU random-number generation.
Views are carved out of larger buffers:
- inputs sit in buffers whose gaps hold a poison NaN, so a kernel that reads outside its view
  writes a wrong byte;
- caches sit in uint8 buffers with guard bands before and after, pre-filled with seeded bytes, so
  every byte a kernel must not touch has a known previous value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from strategies.case import Case, Layout, Scale

GUARD_BYTES = 256  # before and after every cache buffer
INPUT_GUARD = 64  # elements of poison before and after every input buffer (after: past a row past the last token)
#: Entries after cache_loc's last. A kernel whose row mask lets a token past T through reads them: the first is a
#: slot the Case leaves unwritten (the highest), so the stray row lands on bytes the comparison sees, the same every
#: time, as it would on a stale slot in a server's persistent buffer; the rest are padding.
LOC_GUARD = 64
POISON_BITS = {"bfloat16": 0x7FA5, "float16": 0x7E5A, "float32": 0x7FA5A5A5}  # quiet NaNs
PATTERN_LEN = 4093  # prime, so the pattern never lines up with a power-of-two stride

DTYPES = {
    "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
    "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2, "uint8": torch.uint8,
    "float8_e4m3fnuz": torch.float8_e4m3fnuz,
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
    k_logical: torch.Tensor  # [T, H, D] values, overrides applied, on the build device
    v_logical: torch.Tensor
    buffers: dict[str, torch.Tensor]  # name -> whole buffer (caches as uint8, guards included)
    # K and V with the Case's padded rows after the last token (None without): what a convention that takes keys
    # longer than slot_mapping is called with; k and v (T rows) are what the reference is called with.
    k_padded: torch.Tensor | None = None
    v_padded: torch.Tensor | None = None

    def implementation_call(self) -> dict[str, object]:
        """call(), with K and V padded past the last token where the Case has padded rows."""
        call = self.call()
        if self.k_padded is not None:
            call.update(k=self.k_padded, v=self.v_padded)
        return call

    def call(self) -> dict[str, object]:
        """The call's arguments by this project's names (the reference takes them as keywords;
        conformance.conventions spells them for other implementations). An e5m2 Case adds
        `cache_dtype`, which the reference reads (so does a Case whose format argument is spelled by its
        alias: conventions.Convention.invoke); conventions pass no keyword they do not spell, so a
        property that holds an implementation to it passes it as a fixed keyword (conformance/test_e5m2.py)."""
        call = {"k": self.k, "v": self.v, "k_cache": self.k_cache, "v_cache": self.v_cache,
                "cache_loc": self.cache_loc, "k_scale": self.k_scale, "v_scale": self.v_scale,
                "page_size": self.case.page_size, "recipe": self.case.recipe, "checked": self.case.checked}
        if self.case.cache_format != "fp8_e4m3" or self.case.format_alias:
            call["cache_dtype"] = self.case.cache_format
        return call

    def snapshot(self) -> dict[str, torch.Tensor]:
        """Copies of every buffer, to compare against after a call."""
        return {name: buf.clone() for name, buf in self.buffers.items()}

    def copy(self, inputs: bool = True) -> Built:
        """The same Case's tensors in fresh buffers: what a second build would give, by device copies.

        inputs=False copies only the caches and shares the rest (k, v, cache_loc, scale tensors): for
        a caller whose calls on the two do not write those, it saves their copies.
        """
        buffers = {name: buf.clone() if inputs or name in ("k_cache", "v_cache") else buf
                   for name, buf in self.buffers.items()}

        def same_view(t: torch.Tensor, name: str) -> torch.Tensor:
            if buffers[name] is self.buffers[name]:  # shared: the view itself
                return t
            buf = buffers[name] if t.dtype == buffers[name].dtype else buffers[name].view(t.dtype)
            return buf.as_strided(t.shape, t.stride(), t.storage_offset())

        scales = [same_view(s, n) if isinstance(s, torch.Tensor) and n in buffers else s
                  for n, s in (("k_scale", self.k_scale), ("v_scale", self.v_scale))]
        padded = [None if t is None else same_view(t, n) for n, t in (("k", self.k_padded), ("v", self.v_padded))]
        return Built(self.case, same_view(self.k, "k"), same_view(self.v, "v"),
                     same_view(self.k_cache, "k_cache"), same_view(self.v_cache, "v_cache"),
                     same_view(self.cache_loc, "cache_loc"), *scales, self.k_logical, self.v_logical,
                     buffers, *padded)


MASK32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32): split so that no int64 product overflows."""
    return torch.add(x * (c & 0xFFFF), (x * (c >> 16)) & 0xFFFF, alpha=1 << 16) & MASK32


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix (Wellons' lowbias32) of int64 values in [0, 2**32): exact on every device."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _hash32_int(x: int) -> int:
    """hash32 of one value, in Python integers (no tensor: a key costs no device work)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK32
    return x ^ (x >> 16)


def stream_key(seed: int, stream: str) -> int:
    """A 32-bit key per (seed, stream), so that every tensor of a Case draws independent values."""
    return _hash32_int((seed * 1_000_003 + sum(map(ord, stream)) * 7919) & MASK32)


def seeded_bits(seed: int, stream: str, n: int, device: torch.device) -> torch.Tensor:
    """n hashed 32-bit values (int64 tensor) of the (seed, stream) sequence."""
    return seeded_streams(seed, ((stream, n),), device)


def seeded_streams(seed: int, streams: tuple[tuple[str, int], ...], device: torch.device) -> torch.Tensor:
    """seeded_bits of each (stream, n), concatenated in order: the hash is elementwise, so one hash
    of all the streams gives the same values in a fraction of the device ops."""
    key = [stream_key(seed, stream) for stream, _ in streams]
    index = [torch.arange(k, k + n, dtype=torch.int64, device=device) for k, (_, n) in zip(key, streams)]
    return hash32((index[0] if len(index) == 1 else torch.cat(index)) & MASK32)


#: (mantissa bits, exponent bias, largest biased exponent of a finite value) per input dtype
_FIELDS = {"bfloat16": (7, 127, 254), "float16": (10, 15, 30), "float32": (23, 127, 254)}


def _logical_values(case: Case, h: torch.Tensor, rows: int) -> torch.Tensor:
    """K's and V's seeded values, [2, rows, H, D] (rows: T and the padded rows), spread over the whole e4m3 range
    after scaling, with the overrides applied. h: [2, rows*H*D], the hashed bits of the "k" and "v" streams.

    |x| is 2**(E + floor(log2(scale))) * (1 + f), E uniform-ish in [-12, 9] and f the dtype's own
    mantissa bits, so |x| / scale spans e4m3's subnormals through overflow past 448. The value is
    assembled as bits: subnormal where the exponent is below the dtype's range (mantissa shifted
    out, possibly to zero), the largest finite value above it. inf and NaN come only from overrides.
    K and V are one batch (half the device ops); only the scale's exponent differs by row. With
    case.v_values == "k", V's row is K's.
    """
    man_bits, bias, max_biased = _FIELDS[case.input_dtype]
    width = 32 if case.input_dtype == "float32" else 16
    fraction = h & ((1 << man_bits) - 1)
    # E = uniform-ish - 12, plus floor(log2(scale)) and the bias: one Python constant per row
    # e5m2's range is wider: E in [-20, 17] spans its subnormals (from 2**-16) through overflow past 61440.
    low, span = (-20, 38) if case.cache_format == "fp8_e5m2" else (-12, 22)
    k_offset, v_offset = (low + (math.frexp(s.value)[1] - 1) + bias for s in (case.k_scale, case.v_scale))
    biased = ((h >> 24) & 0x7F) % span + k_offset
    if v_offset != k_offset:  # V's row, in place: a [2, 1] tensor of offsets would be an upload
        biased[1] += v_offset - k_offset
    normal = (biased << man_bits) | fraction
    largest = (max_biased << man_bits) | ((1 << man_bits) - 1)
    shift = (1 - biased).clamp(0, man_bits + 1)  # below the normal range: a subnormal, or zero
    subnormal = ((1 << man_bits) | fraction) >> shift
    bits = torch.where(biased > max_biased, largest, torch.where(biased < 1, subnormal, normal))
    # With the sign bit set, the bits read as a signed `width`-bit integer are magnitude - 2**(width-1).
    signed = bits - ((h >> 31) << (width - 1))
    n, flat = h.shape[1], signed.view(-1)
    # An override's index counts in the first T rows (each stream's prefix is the same whatever the padded rows).
    for o in case.overrides:  # one fill each: an index tensor would cost a host-to-device copy, which waits
        if o.index < n:
            flat[o.index + (n if o.tensor == "v" else 0)].fill_(_signed(o.bits, width))  # fill_: no tensor made
    if case.v_values == "k":  # one tensor passed as both: V's row is K's, its own overrides unused
        signed[1].copy_(signed[0])
    return signed.to(BITS_DTYPES[case.input_dtype]).view(DTYPES[case.input_dtype]).reshape(2, rows,
                                                                                          *case.input_shape[1:])


def _signed(bits: int, width: int) -> int:
    return bits - (1 << width) if bits >= 1 << (width - 1) else bits


def _input_view(case: Case, name: str, layout: Layout, values: torch.Tensor,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The T-row view, its buffer, and the view of T and the padded rows (None without): `values` holds both, laid
    out at the padded shape's strides, so that the T-row view is the padded one's first rows."""
    shape = values.shape
    # a token's stride of poison past the span too: a kernel that reads row T (one row past the last) reads poison
    n = INPUT_GUARD + layout.span(shape) + layout.strides(shape)[0] + INPUT_GUARD
    bits = torch.full((n,), _signed(POISON_BITS[case.input_dtype], values.element_size() * 8),
                      dtype=BITS_DTYPES[case.input_dtype], device=device)
    buf = bits.view(values.dtype)
    padded = buf.as_strided(shape, layout.strides(shape), INPUT_GUARD + layout.offset)
    padded.copy_(values)
    if case.input_rank == 2:
        padded = _merge(padded, 1, f"{name} layout cannot be viewed as [T, H*D]")
    return padded[:case.num_tokens], buf, padded if case.padded_rows else None


def _merge(view: torch.Tensor, dim: int, why: str) -> torch.Tensor:
    """Merge dims (dim, dim+1) into one without copying; the strategies only ask when it can."""
    size, stride = list(view.shape), list(view.stride())
    if stride[dim] != stride[dim + 1] * size[dim + 1] and size[dim] > 1:
        raise ValueError(why)
    size[dim:dim + 2] = [size[dim] * size[dim + 1]]
    stride[dim:dim + 2] = [stride[dim + 1]]
    return view.as_strided(size, stride, view.storage_offset())


def _cache_view(case: Case, name: str, layout: Layout, pattern: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache's buffer, filled with `pattern` (its stream's PATTERN_LEN seeded bytes) repeated."""
    shape = case.cache_shape
    n = GUARD_BYTES + layout.span(shape) + GUARD_BYTES
    # On the CPU, past the buffer, room for both caches again: an interpreted Triton kernel stores through raw
    # pointers, and one that writes a cache with the other's strides (or its own, wrongly) lands there, not on
    # the process's heap. Never compared (the guard band before it catches such writes); on CUDA a stray write
    # lands in the caching allocator's blocks, as in a server.
    spill = 0 if pattern.device.type != "cpu" else 2 * max(case.k_cache_layout.span(shape),
                                                             case.v_cache_layout.span(shape))
    buf = pattern.repeat((n + spill) // PATTERN_LEN + 1)[:n]
    typed = buf if case.cache_dtype == "uint8" else buf.view(DTYPES[case.cache_dtype])
    view = typed.as_strided(shape, layout.strides(shape), GUARD_BYTES + layout.offset)
    if case.cache_rank == 3:
        view = _merge(view, 0, f"{name} layout cannot be viewed as [S, H, D]")
    return view, buf


#: Words after a tensor scale's one element (2.5, 3.5, ...): a kernel that reads a scale past its one element (a
#: [1] scale given a stride of 1 across heads) reads these, the same every time, not whatever memory follows.
SCALE_GUARD = tuple(2.5 + i for i in range(64))


def _scale(scale: Scale, device: torch.device) -> tuple[float | torch.Tensor | None, torch.Tensor | None]:
    """The scale argument, and for a tensor scale the buffer behind it (its element, then SCALE_GUARD)."""
    if scale.kind == "none":
        return None, None
    if scale.kind == "float":
        return scale.value, None
    buf = torch.tensor((scale.value, *SCALE_GUARD), dtype=torch.float32).to(device, non_blocking=True)
    return (buf[0] if scale.kind == "tensor0d" else buf[:1]), buf


def loc_guard_slot(case: Case) -> int:
    """The entry after cache_loc's last: the highest slot no token names, or -1 (padding) if every slot is named."""
    named = set(case.cache_loc)
    return next((s for s in range(case.num_slots - 1, -1, -1) if s not in named), -1)


def build(case: Case, device: torch.device | str = "cpu") -> Built:
    """Make the Case's tensors on `device`. The same Case always gives the same bytes."""
    device = torch.device(device)
    rows = case.num_tokens + case.padded_rows
    n = rows * case.num_heads * case.head_dim
    h = seeded_streams(case.seed, (("k", n), ("v", n), ("k_cache", PATTERN_LEN), ("v_cache", PATTERN_LEN)), device)
    logical = _logical_values(case, h[:2 * n].view(2, n), rows)
    k_logical, v_logical = logical[:, :case.num_tokens]
    k, k_buf, k_padded = _input_view(case, "k", case.k_layout, logical[0], device)
    v, v_buf, v_padded = _input_view(case, "v", case.v_layout, logical[1], device)
    patterns = (h[2 * n:] & 0xFF).to(torch.uint8)
    k_cache, kc_buf = _cache_view(case, "k_cache", case.k_cache_layout, patterns[:PATTERN_LEN])
    v_cache, vc_buf = _cache_view(case, "v_cache", case.v_cache_layout, patterns[PATTERN_LEN:])
    # Built on the host as one list and sent in one copy; non_blocking: an upload from pageable memory
    # is staged before the call returns, so the host need not wait for the device's queue.
    values = [-7] * (case.num_tokens * case.loc_step)  # -7 between strided entries
    values[::case.loc_step] = case.cache_loc
    values += [loc_guard_slot(case)] + [-1] * (LOC_GUARD - 1)
    loc_buf = torch.tensor(values, dtype=torch.int64).to(device, DTYPES[case.loc_dtype], non_blocking=True)
    cache_loc = loc_buf[:case.num_tokens * case.loc_step:case.loc_step]
    (k_scale, ks_buf), (v_scale, vs_buf) = _scale(case.k_scale, device), _scale(case.v_scale, device)
    buffers = {"k": k_buf, "v": v_buf, "k_cache": kc_buf, "v_cache": vc_buf, "cache_loc": loc_buf}
    for name, buf in (("k_scale", ks_buf), ("v_scale", vs_buf)):
        if buf is not None:
            buffers[name] = buf
    return Built(case, k, v, k_cache, v_cache, cache_loc, k_scale, v_scale, k_logical, v_logical,
                 buffers, k_padded, v_padded)
