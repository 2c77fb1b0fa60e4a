"""Defect corpus: examples/defects/triton_vllm.py (recipe `divide`) with ONE defect: the grid is sized by the keys.

Defect: the launch takes T from key.shape[0], not slot_mapping.shape[0]. Under CUDA-graph padding the keys are
longer than slot_mapping, so the programs past its end read slot_mapping past its last entry and write the padded
keys' rows to whatever slots they find there.
Models: vllm#13922 (fixing vllm#13418), reshape_and_cache with keys longer than slot_mapping.
Expected in a conformance report (effect@trigger): `overrun:rows@padded-keys` (a row past the batch written at
the entry after slot_mapping's last).

The changed lines are marked `# DEFECT`; everything else (the convention, the recipe, the layouts handled) is the
control, examples/defects/triton_vllm.py.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

if not torch.cuda.is_available():  # no GPU: run the kernel in Triton's interpreter (read when @triton.jit runs)
    os.environ.setdefault("TRITON_INTERPRET", "1")
_INTERP = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _quantize_store(x_ptr, c_ptr, x_off, c_off, s_ptr, ok, inb, INTERP: tl.constexpr):
    s = tl.load(s_ptr)
    x = tl.load(x_ptr + x_off, mask=inb, other=0.0)
    if x.dtype == tl.bfloat16:  # widen by its bits: exact (the interpreter's bf16 cast mangles subnormals)
        x = (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    y = tl.math.div_rn(x.to(tl.float32), s)  # IEEE x / s
    if INTERP:  # exact RNE onto the e4m3 grid: the interpreter's fp8 cast rounds wrongly
        a = tl.where(tl.abs(y) < 448.0, tl.abs(y), 448.0)  # saturate; inf and NaN -> 448 (NaN fixed below)
        e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)  # binade, subnormals share -6
        big = (((e + 147) << 23) | 0x400000).to(tl.float32, bitcast=True)  # 1.5 * 2**23 * quantum 2**(e-3)
        r = (a + big) - big  # fp32 add rounds to nearest-even at the quantum: exact RNE of a
        rb = r.to(tl.int32, bitcast=True)  # r is on the grid: its fields are the e4m3 fields (subnormal: r*2**9)
        byte = tl.where(r >= 2.0**-6, (((rb >> 23) - 120) << 3) | ((rb >> 20) & 7), (r * 512.0).to(tl.int32))
        byte = byte | ((y.to(tl.int32, bitcast=True) >> 24) & 0x80)  # the sign bit, -0 included
        byte = tl.where(y != y, 0x7F, byte).to(tl.uint8)
    else:  # cvt.rn.satfinite: RNE, saturating, every NaN -> 0x7F
        byte = y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    tl.store(c_ptr + c_off, byte, mask=ok)


@triton.jit
def _reshape_and_cache_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr, num_slots, block_size,
                              s_slot, skt, skh, skd, svt, svh, svd, kcb, kco, kch, kcd, vcb, vco, vch, vcd,
                              H: tl.constexpr, D: tl.constexpr, HP: tl.constexpr, DP: tl.constexpr,
                              INTERP: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t * s_slot).to(tl.int64)
    h = tl.arange(0, HP)[:, None].to(tl.int64)
    d = tl.arange(0, DP)[None, :].to(tl.int64)
    inb = (h < H) & (d < D)  # the tile's tail past H and D
    tile = tl.zeros((HP, DP), tl.int64) + slot  # a tile mask: the interpreter mis-broadcasts a scalar bool
    ok = inb & (tile >= 0) & (tile < num_slots)  # padding and out-of-range entries write nothing
    block, off = slot // block_size, slot % block_size
    _quantize_store(k_ptr + t * skt, kc_ptr, h * skh + d * skd, block * kcb + off * kco + h * kch + d * kcd,
                    ks_ptr, ok, inb, INTERP)
    _quantize_store(v_ptr + t * svt, vc_ptr, h * svh + d * svd, block * vcb + off * vco + h * vch + d * vcd,
                    vs_ptr, ok, inb, INTERP)


def reshape_and_cache_flash(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, slot_mapping: torch.Tensor, kv_cache_dtype: str,
                            k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
    """Write token t's fp8 K and V to slot slot_mapping[t] of the paged caches, in one launch."""
    if kv_cache_dtype not in ("fp8", "fp8_e4m3"):
        raise ValueError(f"kv_cache_dtype must be 'fp8' or 'fp8_e4m3', got {kv_cache_dtype!r}")
    tokens, heads, dim = key.shape  # DEFECT: T from the keys, not slot_mapping (they may be longer)
    if tokens == 0:
        return
    block_size = key_cache.shape[1]
    _reshape_and_cache_kernel[(tokens,)](
        key, value, key_cache.view(torch.uint8), value_cache.view(torch.uint8), slot_mapping, k_scale, v_scale,
        key_cache.shape[0] * block_size, block_size, slot_mapping.stride(0), *key.stride(), *value.stride(),
        *key_cache.stride(), *value_cache.stride(), H=heads, D=dim, HP=triton.next_power_of_2(heads),
        DP=triton.next_power_of_2(dim), INTERP=_INTERP)
