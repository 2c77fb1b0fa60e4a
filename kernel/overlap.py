"""Do two tensors share a byte of memory? Decided exactly from addresses, strides and sizes.

A strided view covers the bytes base + sum(i_k * stride_k) + e, with 0 <= i_k < size_k and
0 <= e < element size. Two views share a byte iff

    sum(i_k * a_k) - sum(j_k * b_k) + (e_a - e_b) = base_b - base_a

has a solution inside those bounds: a bounded linear Diophantine equation. `shares_memory`
first compares byte extents (disjoint extents: no overlap, the common case, a few integer compares),
then solves the equation by depth-first search over the terms in decreasing stride, each term's
value range cut by what the smaller terms can still make up and by their gcd (the bytes within the
elements are a window that the rest must land in). Terms of equal stride
merge into one (their sum takes every value in between), which is what makes the layouts real pools
use cheap: K and V as the two halves of `[P, 2, page, H, D]` share every stride, and the search
refutes them at the first term. A search past `SEARCH_LIMIT` nodes gives up and reports "may
overlap": a false positive for an exotic layout is an error message, a false negative a data race.

Addresses are the truth: two tensors on different storages that alias (DLPack, from_blob) overlap
too. Tensors without storage (fake or meta tensors, while torch.compile traces) cannot be judged;
`data_address` returns None for them and the real call checks again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch._subclasses.fake_tensor import is_fake

SEARCH_LIMIT = 4096


@dataclass(frozen=True)
class Layout:
    """A view's memory shape, independent of where it lies: byte strides and sizes of the dims that
    move (size > 1, stride != 0), the element size, and the byte extent past the base."""

    terms: tuple[tuple[int, int], ...]  # (byte stride, size)
    element_size: int
    extent: int  # bytes from the first to one past the last byte; 0 for an empty view

    @staticmethod
    def of(t: torch.Tensor) -> Layout:
        return _layout(tuple(t.shape), tuple(t.stride()), t.element_size())


@lru_cache(maxsize=1024)
def _layout(shape: tuple[int, ...], stride: tuple[int, ...], element_size: int) -> Layout:
    if 0 in shape:
        return Layout((), element_size, 0)
    terms = tuple((s * element_size, n) for s, n in zip(stride, shape) if n > 1 and s != 0)
    return Layout(terms, element_size, sum(s * (n - 1) for s, n in terms) + element_size)


def data_address(t: torch.Tensor) -> int | None:
    """The tensor's first byte, or None when it has no memory to judge (fake and meta tensors: a
    FakeTensor's data_ptr() is 0, with a warning, in torch 2.13)."""
    if t.device.type == "meta" or is_fake(t):
        return None
    return t.data_ptr()


def shares_memory(a: Layout, base_a: int, b: Layout, base_b: int) -> bool:
    """True when some byte of view a (at base_a) is a byte of view b (at base_b), or when the search
    gives up (see the module docstring)."""
    if not a.extent or not b.extent or base_a + a.extent <= base_b or base_b + b.extent <= base_a:
        return False
    return _solvable(base_b - base_a, a.terms, a.element_size, b.terms, b.element_size)


@lru_cache(maxsize=1024)
def _solvable(delta: int, a_terms: tuple, a_size: int, b_terms: tuple, b_size: int) -> bool:
    # Each stride term: coefficient -> [lo, hi] range of its integer multiplier; equal coefficients
    # merge. The bytes within the two elements leave a window: e_a - e_b in [1 - b_size, a_size - 1].
    ranges: dict[int, list[int]] = {}
    for coef, lo, hi in [(s, 0, n - 1) for s, n in a_terms] + [(s, 1 - n, 0) for s, n in b_terms]:
        r = ranges.setdefault(coef, [0, 0])
        r[0] += lo
        r[1] += hi
    terms = sorted(((c, lo, hi) for c, (lo, hi) in ranges.items()), reverse=True)
    w_lo, w_hi = 1 - b_size, a_size - 1
    # What the terms from position i on, plus the window, can still make up: [low, high]; and the
    # gcd of their coefficients, which the sum minus the window's share must be a multiple of.
    n = len(terms)
    low, high, div = [w_lo] * (n + 1), [w_hi] * (n + 1), [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        c, lo, hi = terms[i]
        low[i], high[i], div[i] = low[i + 1] + c * lo, high[i + 1] + c * hi, math.gcd(div[i + 1], c)
    budget = [SEARCH_LIMIT]

    def search(i: int, rest: int) -> bool:
        budget[0] -= 1
        if budget[0] < 0:
            return True  # gave up: may overlap
        if not low[i] <= rest <= high[i]:
            return False
        if i == n:
            return True  # the rest lies in the window
        if (rest - w_lo) % div[i] > w_hi - w_lo:
            return False  # no multiple of the gcd lands the rest inside the window
        c, lo, hi = terms[i]
        first = max(lo, -((high[i + 1] - rest) // c))  # ceil((rest - high) / c)
        last = min(hi, (rest - low[i + 1]) // c)
        return any(search(i + 1, rest - c * x) for x in range(first, last + 1))

    return search(0, delta)
