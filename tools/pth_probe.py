"""Per-(token, head) write variants, timed against a copy of the same bytes and bit-checked against the kernel.

    python -m tools.pth_probe [--tiles 2048,4096] [--warps 4,8] [--variants base,chunk] [--shapes 8x128,4x256]

Experiments for the inline layout's bandwidth (issue 26), not the kernel: each variant is a Triton kernel of
its own for contiguous bf16 [T, H, D] inputs, caches [pages, 16, H, W] (W = D + 4 inline, D with separate
[pages, 16, H] float32 scale caches) and the vLLM per-token-head recipe, with H and D as constexprs (the
kernel's are runtime values). Each first writes Cases with an all-zero, a NaN, an inf and a subnormal head
and a padding slot, and must match kernel/per_token_head_kernel.py's bytes, scales and untouched slots
included; then, on CUDA, each (variant, tile elements, warps) is graph-replayed like `make bench` at
T = 32768 and printed as % of a device-to-device copy of the same bytes, with the compiled registers and
spills. The kernel itself is the `kernel` row. Variants:
- `base`: the kernel's tile and steps ([BT, BH, BD], a head's amax one in-register reduction);
- `lean`: the amax from the inputs' 16-bit patterns, the tile kept in bf16 until it is scaled;
- `kvsplit`, `lean-kvsplit`: a program writes K or V, not both (twice the programs, half the registers);
- `persist4-lean`, `persist8-lean`: 4 or 8 programs an SM looping over token blocks, the next block's loads
  issued before this one's stores;
- `chunk`, `chunk-kvsplit` (inline only): each token's slot row written as 16-byte chunks of H * (D + 4)
  bytes (the kernel's inline stores are 4 bytes wide), its data re-read per byte and each head's scale
  broadcast to the chunks by a one-hot max;
- `f32s` (`-f32s`): an inline scale stored as one fp32 through a cast pointer, not as 4 bytes (its place is
  4-byte aligned); `stream` (`-stream`): loads marked evict-first, stores streaming (`.cs`);
- `pipePsS`: P programs an SM looping over token blocks in a `tl.range(num_stages=S)` loop, which Triton's
  software pipeliner turns into asynchronous copies of the next S - 1 blocks' inputs to shared memory
  (loads in flight that hold no registers), `lean-f32s` otherwise;
- `abl-*`, ablations of `lean-f32s`, timed but never bit-checked (their bytes are wrong by design), to place
  the time: `abl-nodiv` (approximate scale and reciprocal, no IEEE division), `abl-noamax` (every scale 1),
  `abl-noscale` (the scales not stored);
- `ceil-scatter`, `ceil-contiguous` (inline only, timed, not bit-checked): the same bytes read and written
  with no arithmetic, 16-byte stores to each token's slot row, at the random slots or at slots 0..T-1: the
  ceiling that the slot rows' alignment to 32-byte sectors leaves (an 8x128 row is 1056 bytes, 33 sectors;
  a 4x256 row 1040, 32.5); `ceil-flat`, `ceil-flat-contiguous`: the same with a program's tokens read and
  written as flat runs of 16-byte vectors, no lane padded (both for slot rows of H * (D + 4) bytes, a
  multiple of 16).
Under TRITON_INTERPRET=1 (no CUDA) only the bit-checks run, on the software encoder.
Results: docs/results/ (the README there indexes them).
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from kernel.backend import fma_is_exact, interpreted
from kernel.per_token_head import FLOOR_FLASHINFER, FLOOR_VLLM, NAN_SCALE_BITS, fp32_bits, make_pth_plan
from kernel.per_token_head_kernel import _encode, _reciprocal, _scale_of, launch_per_token_head, slot_parts, token_slots
from kernel.triton_kernel import _e4m3_hw, _e4m3_sw
from tools._cli import comma_list, parser

FV, FF, NB_ = fp32_bits(FLOOR_VLLM), fp32_bits(FLOOR_FLASHINFER), NAN_SCALE_BITS
PAGE = 16
#: name -> launch options (`launch_variant`)
VARIANTS: dict[str, dict] = {
    "base": {},
    "lean": {"lean": True},
    "kvsplit": {"kv": 1},
    "lean-kvsplit": {"lean": True, "kv": 1},
    "persist4-lean": {"lean": True, "persist": 4},
    "persist8-lean": {"lean": True, "persist": 8},
    "chunk": {"chunk": True},
    "chunk-kvsplit": {"chunk": True, "kv": 1},
    "f32s": {"f32s": True},
    "stream": {"stream": True},
    "f32s-stream": {"f32s": True, "stream": True},
    "lean-kvsplit-f32s": {"lean": True, "kv": 1, "f32s": True},
    "lean-kvsplit-f32s-stream": {"lean": True, "kv": 1, "f32s": True, "stream": True},
    "pipe2s3": {"lean": True, "f32s": True, "pipe": (2, 3)},
    "pipe4s2": {"lean": True, "f32s": True, "pipe": (4, 2)},
    "pipe4s3": {"lean": True, "f32s": True, "pipe": (4, 3)},
    "pipe8s2": {"lean": True, "f32s": True, "pipe": (8, 2)},
    # Ablations: timed, not bit-checked (their bytes are wrong by design): where the time goes.
    "abl-nodiv": {"lean": True, "f32s": True, "abl": 1},
    "abl-noamax": {"lean": True, "f32s": True, "abl": 2},
    "abl-noscale": {"lean": True, "f32s": True, "abl": 3},
    # Ceilings (inline only): no quantization, the same bytes read and written, 16-byte stores.
    "ceil-scatter": {"ceil": "random"},
    "ceil-contiguous": {"ceil": "contiguous"},
    "ceil-flat": {"ceil": "random", "flat": True},
    "ceil-flat-contiguous": {"ceil": "contiguous", "flat": True},
}
OUTPUTS = ("k_cache", "v_cache", "k_scale_cache", "v_scale_cache")


@triton.jit
def _amax16(x):
    """bf16/fp16 [.., BD] -> each row's max |x| as fp32 bits, from the 16-bit patterns (exact)."""
    b = x.to(tl.int16, bitcast=True).to(tl.int32) & 0x7FFF
    m = tl.max(b, axis=2)
    if x.dtype == tl.bfloat16:
        # bf16 NaN: > 0x7F80; fp32 bits are the same shifted
        return m << 16
    else:
        # fp16: convert the max's value exactly; NaN (> 0x7C00) -> fp32 NaN bits
        v = m.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True)
        return tl.where(m > 0x7C00, 0x7FC00000, v)


@triton.jit
def _quant(x, LEAN: tl.constexpr, SOFTWARE: tl.constexpr, EXACT_FMA: tl.constexpr,
           FV: tl.constexpr, FF: tl.constexpr, NB: tl.constexpr, ABL: tl.constexpr = 0):
    if ABL == 1:  # ablation: no IEEE division (approximate scale and reciprocal)
        amax = _amax16(x).to(tl.float32, bitcast=True)
        s = tl.maximum(amax * (1.0 / 448.0), 1e-6)
        r = 1.0 / s
        return _encode(x.to(tl.float32), s[:, :, None], r[:, :, None], True, SOFTWARE, EXACT_FMA), s
    if ABL == 2:  # ablation: no amax either (every scale 1)
        s = tl.zeros((x.shape[0], x.shape[1]), dtype=tl.float32) + 1.0
        return _encode(x.to(tl.float32), s[:, :, None], s[:, :, None], True, SOFTWARE, EXACT_FMA), s
    if LEAN:
        s = _scale_of(_amax16(x), True, EXACT_FMA, FV, FF, NB)
    else:
        x32 = x.to(tl.float32)
        s = _scale_of(tl.max(x32.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=2), True, EXACT_FMA, FV, FF, NB)
    r = _reciprocal(s, True)
    return _encode(x.to(tl.float32), s[:, :, None], r[:, :, None], True, SOFTWARE, EXACT_FMA), s


@triton.jit
def _pick(bits, hsel, BH: tl.constexpr):
    """[BT, BH] int32 (non-negative) and [NCH] head indices -> [BT, NCH]: bits[t, hsel[c]] (0 past BH)."""
    h = tl.arange(0, BH)
    m = hsel[None, :, None] == h[None, None, :]
    return tl.max(tl.where(m, bits[:, None, :], 0), axis=2)


@triton.jit
def _chunk_store(x_ptr, xrow, s, c_ptr, crow, in_range, T_OK, D: tl.constexpr, BT: tl.constexpr, BH: tl.constexpr,
                 H: tl.constexpr, NCH: tl.constexpr, SOFTWARE: tl.constexpr, EXACT_FMA: tl.constexpr):
    """Each token's inline row of H*(D+4) bytes as 16-byte chunks: data re-read per byte (L1), scales
    broadcast to chunks by a one-hot max."""
    W: tl.constexpr = D + 4
    c = tl.arange(0, NCH)
    j = tl.arange(0, 16)
    f = (c * 16)[:, None] + j[None, :]  # [NCH, 16]
    h_lo = (c * 16) // W
    h = f // W
    pos = f - h * W
    is_hi = h > h_lo[:, None]
    r = _reciprocal(s, True)
    sb = s.to(tl.int32, bitcast=True)
    rb = r.to(tl.int32, bitcast=True)
    r_lo = _pick(rb, h_lo, BH).to(tl.float32, bitcast=True)
    r_hi = _pick(rb, h_lo + 1, BH).to(tl.float32, bitcast=True)
    s_lo = _pick(sb, h_lo, BH)
    s_hi = _pick(sb, h_lo + 1, BH)
    rl = tl.where(is_hi[None, :, :], r_hi[:, :, None], r_lo[:, :, None])
    sl = tl.where(is_hi[None, :, :], s_hi[:, :, None], s_lo[:, :, None]).to(tl.uint32, bitcast=True)
    data = (pos < D) & (h < H)
    xo = (h * D + tl.minimum(pos, D - 1)).to(tl.int64)
    x = tl.load(x_ptr + xrow[:, None, None] + xo[None, :, :], mask=T_OK[:, None, None] & data[None, :, :], other=0.0)
    y = x.to(tl.float32) * rl
    if SOFTWARE:
        byte = _e4m3_sw(y, True, False, False, False)
    else:
        byte = _e4m3_hw(y, True, False)
    sh = (tl.maximum(pos - D, 0) * 8).to(tl.uint32)
    sbyte = ((sl >> sh[None, :, :]) & 0xFF).to(tl.uint8)
    out = tl.where(data[None, :, :], byte, sbyte)
    rows = tl.multiple_of(crow, 16)
    tl.store(c_ptr + rows[:, None, None] + f[None, :, :].to(tl.int64), out,
             mask=in_range[:, None, None] & (f < H * W)[None, :, :])


@triton.jit
def _store_tile(byte, s, c_ptr, s_ptr, crow, srow, h64, d64, mask, writes, INLINE: tl.constexpr, D: tl.constexpr,
                CA: tl.constexpr, F32S: tl.constexpr, STREAM: tl.constexpr, NOSCALE: tl.constexpr = False):
    """A tile's bytes where `mask` and each head's scale where `writes`: inline at D..D+3 of the head's D + 4
    bytes (4-byte stores at most; F32S: one fp32 store), else to the separate scale cache."""
    W: tl.constexpr = D + 4 if INLINE else D
    CM: tl.constexpr = ".cs" if STREAM else ""
    rows = tl.multiple_of(crow, CA)
    tl.store(c_ptr + rows[:, None, None] + (h64 * W)[None, :, None] + d64[None, None, :], byte, mask=mask,
             cache_modifier=CM)
    if NOSCALE:
        pass
    elif INLINE and F32S:
        at = c_ptr + rows[:, None] + (h64 * W + D)[None, :]
        tl.store(at.to(tl.pointer_type(tl.float32)), s, mask=writes, cache_modifier=CM)
    elif INLINE:
        j = tl.arange(0, 4)
        bits = s.to(tl.uint32, bitcast=True)
        b = ((bits[:, :, None] >> (j * 8).to(tl.uint32)[None, None, :]) & 0xFF).to(tl.uint8)
        at = c_ptr + rows[:, None, None] + (h64 * W + D)[None, :, None] + j.to(tl.int64)[None, None, :]
        tl.store(at, b, mask=writes[:, :, None] & (j < 4)[None, None, :], cache_modifier=CM)
    else:
        tl.store(s_ptr + srow[:, None] + h64[None, :], s, mask=writes, cache_modifier=CM)


@triton.jit
def _input_tile(t, T, H: tl.constexpr, D: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr):
    """A block of tokens `t`'s contiguous [T, H, D] input tile: (h64, d64, inside mask, each token's row offset,
    each element's offset)."""
    h64, d64 = tl.arange(0, BH).to(tl.int64), tl.arange(0, BD).to(tl.int64)
    inside = (t < T)[:, None, None] & (h64 < H)[None, :, None] & (d64 < D)[None, None, :]
    xrow = tl.multiple_of(t.to(tl.int64) * (H * D), 16)
    return h64, d64, inside, xrow, xrow[:, None, None] + (h64 * D)[None, :, None] + d64[None, None, :]


@triton.jit
def pth_probe(k_ptr, v_ptr, kc_ptr, vc_ptr, loc_ptr, ks_ptr, vs_ptr, T, page_size, num_slots, sp, so, ssp, sso,
              H: tl.constexpr, D: tl.constexpr, INLINE: tl.constexpr, CHUNK: tl.constexpr, LEAN: tl.constexpr,
              KV: tl.constexpr, SOFTWARE: tl.constexpr, EXACT_FMA: tl.constexpr,
              FV: tl.constexpr, FF: tl.constexpr, NB: tl.constexpr, NBYTES: tl.constexpr,
              BT: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, CA: tl.constexpr,
              F32S: tl.constexpr, STREAM: tl.constexpr, ABL: tl.constexpr):
    """One program a [BT, BH, BD] tile of K and of V (KV = 0), or of one of them (KV = 1: program_id(1)
    picks K or V); H, D and the layout are constexprs (the kernel's are runtime values)."""
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    h64, d64, inside, xrow, xoff = _input_tile(t, T, H, D, BH, BD)
    EP: tl.constexpr = "evict_first" if STREAM else ""
    if KV == 1:
        which = tl.program_id(1)
        if which == 0:
            x_ptr = k_ptr
            c_ptr = kc_ptr
            s_ptr = ks_ptr
        else:
            x_ptr = v_ptr
            c_ptr = vc_ptr
            s_ptr = vs_ptr
        xs = [tl.load(x_ptr + xoff, mask=inside, other=0.0, eviction_policy=EP)]
        cs = [c_ptr]
        ss = [s_ptr]
        xps = [x_ptr]
    else:
        xs = [tl.load(k_ptr + xoff, mask=inside, other=0.0, eviction_policy=EP),
              tl.load(v_ptr + xoff, mask=inside, other=0.0, eviction_policy=EP)]
        cs = [kc_ptr, vc_ptr]
        ss = [ks_ptr, vs_ptr]
        xps = [k_ptr, v_ptr]
    # The slot lookup after the loads, as in the kernel: its division branches, and no load moves above it.
    in_range, page, offset = token_slots(loc_ptr, t, 1, T, num_slots, page_size)
    writes = in_range[:, None] & (h64 < H)[None, :]
    mask = inside & in_range[:, None, None]
    crow = page * sp + offset * so
    srow = page * ssp + offset * sso
    for i in tl.static_range(len(xs)):
        byte, s = _quant(xs[i], LEAN, SOFTWARE, EXACT_FMA, FV, FF, NB, ABL)
        if CHUNK:
            _chunk_store(xps[i], xrow, s, cs[i], crow, in_range, t < T, D, BT, BH, H,
                         NBYTES // 16, SOFTWARE, EXACT_FMA)
        else:
            _store_tile(byte, s, cs[i], ss[i], crow, srow, h64, d64, mask, writes, INLINE, D, CA, F32S, STREAM,
                        ABL == 3)


@triton.jit
def _load_blk(k_ptr, v_ptr, loc_ptr, tb, T, H: tl.constexpr, D: tl.constexpr,
              BT: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr):
    t = tb * BT + tl.arange(0, BT)
    _, _, inside, _, xoff = _input_tile(t, T, H, D, BH, BD)
    loc = tl.load(loc_ptr + t.to(tl.int64), mask=t < T, other=-1).to(tl.int64)
    return tl.load(k_ptr + xoff, mask=inside, other=0.0), tl.load(v_ptr + xoff, mask=inside, other=0.0), loc


@triton.jit
def _write_kv(xk, xv, kc_ptr, vc_ptr, ks_ptr, vs_ptr, crow, srow, h64, d64, mask, writes, LEAN: tl.constexpr,
              SOFTWARE: tl.constexpr, EXACT_FMA: tl.constexpr, FV: tl.constexpr, FF: tl.constexpr, NB: tl.constexpr,
              INLINE: tl.constexpr, D: tl.constexpr, CA: tl.constexpr, F32S: tl.constexpr):
    """Quantize and store a block's K tile, then its V tile (the looping variants' body)."""
    for i in tl.static_range(2):
        x = xk if i == 0 else xv
        c_ptr = kc_ptr if i == 0 else vc_ptr
        s_ptr = ks_ptr if i == 0 else vs_ptr
        byte, s = _quant(x, LEAN, SOFTWARE, EXACT_FMA, FV, FF, NB)
        _store_tile(byte, s, c_ptr, s_ptr, crow, srow, h64, d64, mask, writes, INLINE, D, CA, F32S, False)


@triton.jit
def pth_persist(k_ptr, v_ptr, kc_ptr, vc_ptr, loc_ptr, ks_ptr, vs_ptr, T, page_size, num_slots, sp, so, ssp, sso,
                H: tl.constexpr, D: tl.constexpr, INLINE: tl.constexpr, LEAN: tl.constexpr,
                SOFTWARE: tl.constexpr, EXACT_FMA: tl.constexpr,
                FV: tl.constexpr, FF: tl.constexpr, NB: tl.constexpr, NBYTES: tl.constexpr,
                BT: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, CA: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    nblk = tl.cdiv(T, BT)
    h = tl.arange(0, BH)
    d = tl.arange(0, BD)
    h64, d64 = h.to(tl.int64), d.to(tl.int64)
    xk, xv, loc = _load_blk(k_ptr, v_ptr, loc_ptr, pid, T, H, D, BT, BH, BD)
    for tb in range(pid, nblk, nprog):
        xk_n, xv_n, loc_n = _load_blk(k_ptr, v_ptr, loc_ptr, tb + nprog, T, H, D, BT, BH, BD)
        t = tb * BT + tl.arange(0, BT)
        in_range, page, offset = slot_parts(loc, t, T, num_slots, page_size)
        writes = in_range[:, None] & (h < H)[None, :]
        mask = writes[:, :, None] & (d < D)[None, None, :]
        crow = page * sp + offset * so
        srow = page * ssp + offset * sso
        _write_kv(xk, xv, kc_ptr, vc_ptr, ks_ptr, vs_ptr, crow, srow, h64, d64, mask, writes, LEAN, SOFTWARE,
                  EXACT_FMA, FV, FF, NB, INLINE, D, CA, False)
        xk, xv, loc = xk_n, xv_n, loc_n


@triton.jit
def pth_pipe(k_ptr, v_ptr, kc_ptr, vc_ptr, loc_ptr, ks_ptr, vs_ptr, T, page_size, num_slots, sp, so, ssp, sso,
             H: tl.constexpr, D: tl.constexpr, INLINE: tl.constexpr, LEAN: tl.constexpr,
             SOFTWARE: tl.constexpr, EXACT_FMA: tl.constexpr,
             FV: tl.constexpr, FF: tl.constexpr, NB: tl.constexpr, NBYTES: tl.constexpr,
             BT: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, CA: tl.constexpr,
             F32S: tl.constexpr, STAGES: tl.constexpr):
    nblk = tl.cdiv(T, BT)
    for tb in tl.range(tl.program_id(0), nblk, tl.num_programs(0), num_stages=STAGES):
        t = tb * BT + tl.arange(0, BT)
        h64, d64, inside, _, xoff = _input_tile(t, T, H, D, BH, BD)
        xk = tl.load(k_ptr + xoff, mask=inside, other=0.0)
        xv = tl.load(v_ptr + xoff, mask=inside, other=0.0)
        in_range, page, offset = token_slots(loc_ptr, t, 1, T, num_slots, page_size)
        writes = in_range[:, None] & (h64 < H)[None, :]
        mask = inside & in_range[:, None, None]
        crow = page * sp + offset * so
        srow = page * ssp + offset * sso
        _write_kv(xk, xv, kc_ptr, vc_ptr, ks_ptr, vs_ptr, crow, srow, h64, d64, mask, writes, LEAN, SOFTWARE,
                  EXACT_FMA, FV, FF, NB, INLINE, D, CA, F32S)


@triton.jit
def pth_ceiling(k_ptr, v_ptr, kc_ptr, vc_ptr, loc_ptr, T, page_size, num_slots, sp, so,
                HD: tl.constexpr, ROW: tl.constexpr, NX: tl.constexpr, NR: tl.constexpr, BT: tl.constexpr):
    """The inline layout's ceiling: each token's K and V rows (HD bf16 each) read, and ROW = H * (D + 4) bytes
    written to its slot row as 16-byte stores (a slot row's start is 16-byte aligned for the shapes timed),
    each byte a function of the row's sum so that the loads are not dropped. No amax, no scale, no encoding:
    what is left is the traffic and the slot rows' alignment to the 32-byte sectors."""
    t = tl.program_id(0) * BT + tl.arange(0, BT)
    j = tl.arange(0, NX)
    xoff = t.to(tl.int64)[:, None] * HD + j[None, :]
    inside = (t < T)[:, None] & (j < HD)[None, :]
    in_range, page, offset = token_slots(loc_ptr, t, 1, T, num_slots, page_size)
    crow = tl.multiple_of(page * sp + offset * so, 16)
    r = tl.arange(0, NR)
    keep = in_range[:, None] & (r < ROW)[None, :]
    xps = [k_ptr, v_ptr]
    cps = [kc_ptr, vc_ptr]
    for i in tl.static_range(2):
        x = tl.load(xps[i] + xoff, mask=inside, other=0.0)
        s = tl.sum(x.to(tl.float32), axis=1).to(tl.int32, bitcast=True)
        tl.store(cps[i] + crow[:, None] + r[None, :], ((r[None, :] + s[:, None]) & 0xFF).to(tl.uint8), mask=keep)


@triton.jit
def pth_ceiling_flat(k_ptr, v_ptr, kc_ptr, vc_ptr, loc_ptr, T, page_size, num_slots, sp, so,
                     HD: tl.constexpr, CHUNKS: tl.constexpr, BT: tl.constexpr, NI: tl.constexpr,
                     NO: tl.constexpr):
    """`pth_ceiling` without its padding: a program's BT tokens are read as one flat run of 16-byte vectors
    (NI of them) and written as one flat run of 16-byte chunks (NO), CHUNKS to a slot row, so nearly every
    lane moves bytes whatever the row's width."""
    t0 = tl.program_id(0) * BT
    i = tl.arange(0, NI)
    e = tl.arange(0, 8)
    flat = i[:, None] * 8 + e[None, :]
    xoff = t0.to(tl.int64) * HD + flat
    xin = (flat < BT * HD) & (t0.to(tl.int64) * HD + flat < T.to(tl.int64) * HD)
    c = tl.arange(0, NO)
    in_range, page, offset = token_slots(loc_ptr, t0 + c // CHUNKS, 1, T, num_slots, page_size)
    at = tl.multiple_of(page * sp + offset * so + (c % CHUNKS) * 16, 16)
    b = tl.arange(0, 16)
    keep = ((c < BT * CHUNKS) & in_range)[:, None]
    xps = [k_ptr, v_ptr]
    cps = [kc_ptr, vc_ptr]
    for j in tl.static_range(2):
        x = tl.load(xps[j] + xoff, mask=xin, other=0.0)
        s = tl.sum(tl.sum(x.to(tl.float32), axis=1), axis=0).to(tl.int32, bitcast=True)
        byte = ((c[:, None] * 16 + b[None, :] + s) & 0xFF).to(tl.uint8)
        tl.store(cps[j] + at[:, None] + b[None, :], byte, mask=keep)


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def launch_variant(a: dict, *, chunk: bool = False, lean: bool = False, kv: int = 0, persist: int = 0,
                   f32s: bool = False, stream: bool = False, abl: int = 0, pipe: tuple[int, int] | None = None,
                   ceil: str = "", flat: bool = False, elements: int = 2048, warps: int = 4,
                   software: bool = False) -> object:
    """One launch of a variant on `make_arguments`' tensors; returns Triton's compiled kernel."""
    t, h, d = a["k"].shape
    if ceil:
        kc, vc = a["k_cache"].view(torch.uint8), a["v_cache"].view(torch.uint8)
        if kc.stride(1) % 16:  # both ceilings store 16 bytes at once from each slot row's start
            raise ValueError(f"ceil: an inline slot row of H * (D + 4) = {kc.stride(1)} bytes, expected a multiple "
                             "of 16")
        loc = a["cache_loc"] if ceil == "random" else a.setdefault("in_order", torch.arange(t, device=kc.device))
        if flat:
            chunks = kc.stride(1) // 16
            bt = max(1, elements // 8 // chunks)
            return pth_ceiling_flat[(triton.cdiv(t, bt),)](
                a["k"], a["v"], kc, vc, loc, t, PAGE, kc.shape[0] * PAGE, kc.stride(0), kc.stride(1), HD=h * d,
                CHUNKS=chunks, BT=bt, NI=_pow2(bt * h * d // 8), NO=_pow2(bt * chunks), num_warps=warps)
        bt = max(1, elements // _pow2(h * d))
        return pth_ceiling[(triton.cdiv(t, bt),)](a["k"], a["v"], kc, vc, loc, t, PAGE, kc.shape[0] * PAGE,
                                                  kc.stride(0), kc.stride(1), HD=h * d, ROW=kc.stride(1),
                                                  NX=_pow2(h * d), NR=_pow2(kc.stride(1)), BT=bt, num_warps=warps)
    inline = "k_scale_cache" not in a
    bd, bh = _pow2(d), _pow2(h)
    bt = max(2, elements // (bd * bh))
    kc, vc = a["k_cache"].view(torch.uint8), a["v_cache"].view(torch.uint8)
    ks, vs = (a["cache_loc"], a["cache_loc"]) if inline else (a["k_scale_cache"], a["v_scale_cache"])
    ssp, sso = (0, 0) if inline else (ks.stride(0), ks.stride(1))
    common = (a["k"], a["v"], kc, vc, a["cache_loc"], ks, vs, t, PAGE, kc.shape[0] * PAGE, kc.stride(0),
              kc.stride(1), ssp, sso)
    consts = dict(H=h, D=d, INLINE=inline, LEAN=lean, SOFTWARE=software, EXACT_FMA=fma_is_exact(), FV=FV, FF=FF,
                  NB=NB_, NBYTES=_pow2(h * (d + 4)), BT=bt, BH=bh, BD=bd, CA=4 if inline else 16, num_warps=warps)
    sms = torch.cuda.get_device_properties(a["k"].device).multi_processor_count if a["k"].is_cuda else 1
    if pipe:
        return pth_pipe[(min(triton.cdiv(t, bt), sms * pipe[0]),)](*common, F32S=f32s, STAGES=pipe[1], **consts)
    if persist:
        return pth_persist[(min(triton.cdiv(t, bt), sms * persist),)](*common, **consts)
    return pth_probe[(triton.cdiv(t, bt), 2 if kv else 1)](*common, CHUNK=chunk, KV=kv, F32S=f32s, STREAM=stream,
                                                            ABL=abl, **consts)


def make_arguments(t: int, h: int, d: int, inline: bool, device: torch.device, seed: int = 0) -> dict:
    """Seeded call arguments: random bf16 K/V (with an all-zero, a NaN, an inf and a subnormal head when
    T > 3), a random permutation of the cache's slots (the last token padding when T > 3), zeroed caches."""
    g = torch.Generator(device=device).manual_seed(seed)
    pages = -(-t // PAGE)
    width = d + 4 if inline else d
    a = dict(k=torch.randn(t, h, d, generator=g, device=device).to(torch.bfloat16),
             v=torch.randn(t, h, d, generator=g, device=device).to(torch.bfloat16),
             k_cache=torch.zeros(pages, PAGE, h, width, dtype=torch.uint8, device=device),
             v_cache=torch.zeros(pages, PAGE, h, width, dtype=torch.uint8, device=device),
             cache_loc=torch.randperm(pages * PAGE, generator=g, device=device)[:t])
    if t > 3:
        a["k"][0, 0] = 0
        a["k"][1, 0, 3] = float("nan")
        a["v"][2, 0, 5] = float("inf")
        a["v"][3, 0] = 1e-39
        a["cache_loc"][t - 1] = -1
    if not inline:
        a["k_scale_cache"] = torch.zeros(pages, PAGE, h, dtype=torch.float32, device=device)
        a["v_scale_cache"] = torch.zeros(pages, PAGE, h, dtype=torch.float32, device=device)
    return a


def launch_kernel(a: dict, software: bool = False) -> None:
    """The kernel's own launch (kernel/per_token_head_kernel.py) on the same tensors."""
    plan = make_pth_plan(a["k"], a["v"], a["k_cache"], a["v_cache"], a["cache_loc"], None, None, PAGE,
                         per_token_head=True, k_scale_cache=a.get("k_scale_cache"),
                         v_scale_cache=a.get("v_scale_cache"))
    launch_per_token_head(plan, "software" if software else "hardware")


def _inline_only(name: str) -> bool:
    return bool(VARIANTS[name].get("chunk") or VARIANTS[name].get("ceil"))


def _outputs(a: dict) -> list[torch.Tensor]:
    return [a[n].view(torch.uint8).clone() for n in OUTPUTS if n in a]


def mismatches(device: torch.device, shapes: list[tuple[int, int, int]], software: bool,
               variants: list[str]) -> list[str]:
    """Each (variant, shape, layout) whose bytes differ from the kernel's, as 'name TxHxD layout'."""
    bad = []
    for t, h, d in shapes:
        for inline in (True, False):
            a = make_arguments(t, h, d, inline, device)
            launch_kernel(a, software)
            want = _outputs(a)
            for name in variants:
                if _inline_only(name) and not inline or VARIANTS[name].get("abl") or VARIANTS[name].get("ceil"):
                    continue
                for n in OUTPUTS:
                    if n in a:
                        a[n].zero_()
                launch_variant(a, software=software, **VARIANTS[name])
                if not all(torch.equal(x, y) for x, y in zip(want, _outputs(a))):
                    bad.append(f"{name} {t}x{h}x{d} {'inline' if inline else 'separate'}")
    return bad


def _time(args, variants: list[str]) -> None:
    from tools.bench import graph_replay_us, rotation

    dev = torch.device("cuda")
    t = 32768
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; T = {t}")
    for h, d in args.shapes:
        for inline in (True, False):
            torch.cuda.empty_cache()
            nbytes = t * h * d * 3 * 2 + t * h * 4 * 2  # bf16 in, fp8 out, K and V, and the fp32 scales
            n = rotation(nbytes)
            sets = [make_arguments(t, h, d, inline, dev, seed=i) for i in range(n)]
            src = [torch.empty(nbytes // 2, dtype=torch.uint8, device=dev) for _ in range(n)]
            dst = [torch.empty_like(x) for x in src]
            copy = graph_replay_us(lambda i, src=src, dst=dst: dst[i].copy_(src[i]), n, args.rep_ms)
            layout = "inline" if inline else "separate"
            us = graph_replay_us(lambda i, sets=sets: launch_kernel(sets[i]), n, args.rep_ms)
            print(f"{h}x{d} {layout:<8} {'kernel':<26}{us:8.2f} us {100 * copy / us:6.1f} % (copy {copy:.2f} us)")
            for name in variants:
                if _inline_only(name) and not inline:
                    continue
                for e in args.tiles:
                    for w in args.warps:
                        opts = dict(VARIANTS[name], elements=e, warps=w)
                        compiled = launch_variant(sets[0], **opts)
                        us = graph_replay_us(lambda i, o=opts, sets=sets: launch_variant(sets[i], **o), n, args.rep_ms)
                        print(f"{h}x{d} {layout:<8} {f'{name}({e}x{w})':<26}{us:8.2f} us {100 * copy / us:6.1f} % "
                              f"regs {getattr(compiled, 'n_regs', '?')} spills {getattr(compiled, 'n_spills', '?')}",
                              flush=True)


def main(argv: list[str] | None = None) -> int:
    p = parser("pth_probe", __doc__)
    p.add_argument("--tiles", type=lambda s: [int(x) for x in comma_list()(s)], default=[2048, 4096],
                   help="tile elements")
    p.add_argument("--warps", type=lambda s: [int(x) for x in comma_list()(s)], default=[4, 8])
    p.add_argument("--variants", type=comma_list(VARIANTS), default=",".join(VARIANTS))
    p.add_argument("--shapes", type=lambda s: [tuple(int(n) for n in x.split("x")) for x in comma_list()(s)],
                   default="8x128,4x256", help="H x D")
    p.add_argument("--rep-ms", type=float, default=20.0)
    args = p.parse_args(argv)
    variants = list(args.variants)
    cuda = torch.cuda.is_available() and not interpreted()
    if not cuda and not interpreted():
        print("python -m tools.pth_probe needs CUDA, or TRITON_INTERPRET=1 for the bit-checks alone", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    shapes = [(37, 8, 128), (300, 4, 256), (65, 8, 64), (33, 2, 128)] if cuda else [(9, 8, 128), (7, 2, 256)]
    bad = mismatches(device, shapes, not cuda, variants)
    print("bit-checks: " + ("every variant matches the kernel" if not bad else "MISMATCH " + "; ".join(bad)))
    if cuda:
        _time(args, variants)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
