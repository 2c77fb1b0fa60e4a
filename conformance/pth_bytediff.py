"""Where a per-token-head write went wrong: each differing element of a whole buffer, located.

A cache byte is named by its view position (page, offset, head, dim) and slot, the token that writes that
slot, and either its input value (dim < head_dim) or which byte of the inline fp32 scale it is; a scale
cache element by (page, offset, head), slot and token. Elements outside the views (gaps, guard bands) are
said to be so. Values are shown as hex bits, expected and actual.
"""

from __future__ import annotations

import torch

from strategies.per_token_head import PTHBuilt

FIRST_N = 8
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """t's bits as integers of its element size (any strides; NaNs compare by their bits)."""
    return t if t.dtype == _INT[t.element_size()] else t.view(_INT[t.element_size()])


def _positions(buffer: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """For each element of buffer, its flat index in view (row-major over view's shape), or -1.
    view lies in buffer's storage, with the same element size (caches: bytes; scale caches: fp32)."""
    pos = torch.full((buffer.numel(),), -1, dtype=torch.int64)
    offset = view.storage_offset() - buffer.storage_offset()
    pos.as_strided(view.shape, view.stride(), offset).copy_(torch.arange(view.numel()).reshape(view.shape))
    return pos


def _token_of(b: PTHBuilt, slot: int) -> str:
    tokens = [t for t, s in enumerate(b.pc.case.cache_loc) if s == slot]
    return f"token={tokens[0]}" if len(tokens) == 1 else (f"tokens={tokens}" if tokens else "no token writes it")


def _where(b: PTHBuilt, name: str, j: int) -> str:
    """View position j of buffer `name` as slot, head (and dim), with its token and input value."""
    case = b.pc.case
    idx, rest = [], j
    for size in reversed(b.call()[name].shape):
        idx.append(rest % size)
        rest //= size
    idx.reverse()
    scale_cache = "scale" in name
    slot_idx, head = (idx[:-1], idx[-1]) if scale_cache else (idx[:-2], idx[-2])
    slot = slot_idx[0] * case.page_size + slot_idx[1] if len(slot_idx) == 2 else slot_idx[0]
    at = f"slot={slot} head={head}"
    if scale_cache:
        return f"{at} (its stored scale): {_token_of(b, slot)}"
    dim = idx[-1]
    if dim >= case.head_dim:
        return f"{at} inline scale byte {dim - case.head_dim}: {_token_of(b, slot)}"
    tokens = [t for t, s in enumerate(case.cache_loc) if s == slot]
    x = (b.built.k if name == "k_cache" else b.built.v).reshape(case.num_tokens, case.num_heads, case.head_dim)
    value = f" input={float(x[tokens[0], head, dim]):.9g}" if tokens else ""
    return f"{at} dim={dim}: {_token_of(b, slot)}{value}"


def differing(expected: PTHBuilt, actual: PTHBuilt) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per whole buffer that differs: (indexes of the differing elements, expected bits, actual bits)."""
    out = {}
    for name, want in expected.buffers.items():
        a, e = bits(actual.buffers[name]).flatten().cpu(), bits(want).flatten().cpu()
        bad = (a != e).nonzero().flatten()
        if bad.numel():
            out[name] = (bad, e, a)
    return out


def located_diff(expected: PTHBuilt, actual: PTHBuilt) -> str | None:
    """The first differing elements of each whole buffer, located; None when all are equal."""
    lines = []
    call = actual.call()
    for name, (bad, e, a) in differing(expected, actual).items():
        got = actual.buffers[name]
        view = call.get(name) if name.endswith("_cache") else None  # inputs and cache_loc: flat indexes
        pos = _positions(got, view) if isinstance(view, torch.Tensor) else None
        lines.append(f"{name}: {bad.numel()} of {e.numel()} elements differ; first {min(FIRST_N, bad.numel())}:")
        width = 2 * got.element_size()
        for i in bad[:FIRST_N].tolist():
            mask = (1 << (8 * got.element_size())) - 1
            where = ""
            if pos is not None:
                j = int(pos[i])
                where = " outside the view (a gap or guard band)" if j < 0 else " at " + _where(actual, name, j)
            lines.append(f"  {name}[{i}] expected 0x{int(e[i]) & mask:0{width}X} actual 0x{int(a[i]) & mask:0{width}X}"
                         f"{where}")
    return "\n".join(lines) or None



def _slot_rows(b: PTHBuilt, name: str, data_only: bool = False) -> torch.Tensor:
    """A cache's view as one row of bytes a slot: [num_slots, H * (D or D + 4)]; `data_only`: the D data bytes of
    each head alone (no inline scale bytes)."""
    case = b.pc.case
    cache = bits(b.call()[name])
    cache = cache.reshape(case.num_slots, case.num_heads, -1)
    return (cache[..., :case.head_dim] if data_only else cache).reshape(case.num_slots, -1).cpu()


#: The fewest bytes whose signs must agree for a row to be read as a token's (a chance agreement of 8 random
#: signs is 1 in 256).
SIGNS = 8


def _same_signs(a: torch.Tensor, e: torch.Tensor) -> bool | None:
    """Whether two rows' bytes agree in sign wherever both hold a nonzero, non-NaN magnitude (a positive scale
    keeps every sign, whatever scale a value defect uses); None with fewer than SIGNS such bytes."""
    both = ((a & 0x7F) != 0) & ((e & 0x7F) != 0) & ((a & 0x7F) != 0x7F) & ((e & 0x7F) != 0x7F)
    if int(both.sum()) < SIGNS:
        return None
    return bool((((a ^ e) & 0x80)[both] == 0).all())


def misplaced(expected: PTHBuilt, actual: PTHBuilt, before: PTHBuilt) -> bool:
    """Whether a cache holds bytes where no token's row belongs (a slot no token names changed), a named slot's
    row left as it was, or another token's row at a named slot: its data bytes' signs are another named slot's
    expected ones and not its own (the signs of its input, whatever scale wrote them). A value defect writes its
    own token's signs, with other magnitudes, at the right slot."""
    case = expected.pc.case
    named = sorted({s for s in case.cache_loc if 0 <= s < case.num_slots})
    for name in ("k_cache", "v_cache"):
        a, old = (_slot_rows(b, name) for b in (actual, before))
        if any(not torch.equal(a[slot], old[slot]) for slot in range(case.num_slots) if slot not in named):
            return True
        whole = _slot_rows(expected, name)
        for slot in named:  # a named row left as it was: not written where it belongs
            if not torch.equal(a[slot], whole[slot]) and torch.equal(a[slot], old[slot]) and a.shape[1] >= SIGNS:
                return True
        e, a = (_slot_rows(b, name, data_only=True) for b in (expected, actual))
        for slot in named:
            if torch.equal(a[slot], e[slot]) or _same_signs(a[slot], e[slot]) is not False:
                continue
            if any(_same_signs(a[slot], e[other]) for other in named if other != slot):
                return True
    return False
