"""Calling conventions: the suite calls an implementation exactly as its own signature says.

A Convention maps one call, described with this project's argument names (k, v, k_cache, v_cache,
cache_loc, k_scale, v_scale, page_size, recipe, checked), onto the implementation's parameters. It
never passes a keyword the implementation's signature lacks. Cases a convention cannot express (a
2-D input for vLLM, a float scale for vLLM) are never drawn for it; a property that needs one is
skipped with the reason.

- `kvfp8`: this project's call, `recipe=` and `checked=` keywords included.
- `sglang`: `fused_fp8_set_kv_buffer(k, v, k_cache, v_cache, cache_loc, k_scale=None, v_scale=None,
  page_size=16, use_triton=True)`, called positionally with `use_triton` left at its default.
- `vllm`: `reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
  k_scale, v_scale)`: 3-D inputs, 4-D caches, int64 slots, one-element float32 tensor scales;
  kv_cache_dtype "fp8" for an e4m3 call ("fp8_e4m3", its other name, where a Case says format_alias),
  "fp8_e5m2" for an e5m2 one, as vLLM spells them (no fnuz: vLLM's "fp8" means the platform's e4m3).
- `vllm-per-head`: `vllm`, with k_scale/v_scale also [H] float32 tensors (vLLM's per-attention-head scales,
  vllm#30141); opt-in, never detected.
- `vllm-per-token-head`: `fn(key, value, key_cache, value_cache, slot_mapping, *, k_scale_cache,
  v_scale_cache)`: vLLM's dynamic per-(token, head) write, scales to separate scale caches; nothing else.

Another convention is a small adapter function written in one of these (docs/conventions.md).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from strategies.case import LOC_DTYPES, SCALE_KINDS, Case, Scale

#: This project's names for a call's arguments, in the kvfp8 order.
ARGUMENTS = ("k", "v", "k_cache", "v_cache", "cache_loc", "k_scale", "v_scale", "page_size", "recipe", "checked")
POSITIONAL = ARGUMENTS[:8]


@dataclass(frozen=True)
class Convention:
    """How to call an implementation, and which Cases that call can express."""

    name: str
    spelling: Mapping[str, str]  # this project's argument name -> the implementation's
    input_ranks: tuple[int, ...] = (2, 3)
    cache_ranks: tuple[int, ...] = (3, 4)
    loc_dtypes: tuple[str, ...] = LOC_DTYPES
    scale_kinds: tuple[str, ...] = SCALE_KINDS
    # The cache format as a positional argument (vLLM's kv_cache_dtype): its position, and its spelling of each
    # Case.cache_format it has a word for. A Case of another format cannot be expressed.
    format_position: int | None = None
    format_names: tuple[tuple[str, str], ...] = ()
    format_aliases: tuple[tuple[str, str], ...] = ()  # another spelling of a format (Case.format_alias)
    per_head_scales: bool = False  # takes a [H] float32 k_scale / v_scale (conformance/test_per_head.py)
    per_token_head: bool = False  # writes dynamic per-(token, head) scales (conformance/test_per_token_head.py)
    static: bool = True  # writes with given scales (False: per-token-head writes only)
    # Takes keys and values longer than cache_loc, writing cache_loc's tokens alone: vLLM's CUDA-graph padding,
    # where reshape_and_cache_flash's T is slot_mapping.size(0) (vllm#13922; Case.padded_rows)
    padded_keys: bool = False
    # The recipe the serving stack's own kernel for this call computes (kernel/recipe.py), where it has one: a
    # kernel identified as computing another is conformant to that recipe, yet differs from its stack's bytes
    stack_recipe: str | None = None

    def stack_note(self, held: str | None) -> str:
        """What the report says when the identified recipe is not the stack's own ('' when it is, or none)."""
        if not held or not self.stack_recipe or held == self.stack_recipe:
            return ""
        return (f"not the {self.name} stack's own recipe ({self.stack_recipe}): its bytes differ from the stack's "
                f"kernel where the two recipes round apart")

    @property
    def arguments(self) -> frozenset[str]:
        """This project's arguments that the convention can pass."""
        return frozenset(self.spelling)

    @property
    def told_recipe(self) -> bool:
        """True when the implementation is told which recipe to compute (else it computes its own)."""
        return "recipe" in self.spelling

    @property
    def plain_scale_kind(self) -> str:
        """The scale kind of the plain call: a 1-element tensor where the convention takes one."""
        return next(k for k in ("tensor1", "tensor0d", "float", "none") if k in self.scale_kinds)

    @property
    def dynamic_only(self) -> str:
        return f"the {self.name} convention writes dynamic per-(token, head) scales only"

    def format_name(self, cache_format: str) -> str | None:
        """How this convention's format argument spells a Case.cache_format (None: it has no word for it)."""
        return dict(self.format_names).get(cache_format)

    def why_not(self, case: Case) -> str | None:
        """Why `case` cannot be expressed in this convention, or None when it can."""
        if not self.static:
            return self.dynamic_only
        if self.format_position is not None and self.format_name(case.cache_format) is None:
            return f"the {self.name} convention has no kv_cache_dtype for {case.cache_format} caches"
        if case.padded_rows and not self.padded_keys:
            opt_in = (f"; --convention {VLLM_PADDED_KEYS.name} holds a vLLM kernel to keys longer than slot_mapping "
                      "(CUDA-graph padding, vllm#13922)") if self.name.startswith("vllm") else ""
            return f"the {self.name} convention takes one key a cache_loc entry (no keys padded past its end){opt_in}"
        if case.format_alias and case.cache_format not in dict(self.format_aliases):
            return f"the {self.name} convention has no other name for {case.cache_format} caches"
        checks = (("input_rank", self.input_ranks, "{}-D input"), ("cache_rank", self.cache_ranks, "{}-D cache"),
                  ("loc_dtype", self.loc_dtypes, "{} cache_loc"))
        for attr, allowed, what in checks:
            if getattr(case, attr) not in allowed:
                return f"the {self.name} convention cannot express a {what.format(getattr(case, attr))}"
        for name in ("k_scale", "v_scale"):
            kind = getattr(case, name).kind
            if kind not in self.scale_kinds:
                return f"the {self.name} convention cannot express a {kind} {name}"
        return None

    def narrow(self, **space: object) -> dict[str, object]:
        """`strategies.cases` keyword arguments, restricted to what this convention expresses.

        Raises LookupError naming what is left empty when nothing the caller asked for is expressible.
        """
        if not self.static:
            raise LookupError(self.dynamic_only)
        own = {"input_ranks": self.input_ranks, "cache_ranks": self.cache_ranks, "loc_dtypes": self.loc_dtypes,
               "scale_kinds": self.scale_kinds}
        out = dict(space)
        for key, allowed in own.items():
            asked = space.get(key)
            kept = tuple(x for x in (allowed if asked is None else asked) if x in allowed)
            if not kept:
                raise LookupError(f"the {self.name} convention cannot express {key} {tuple(asked)}")
            out[key] = kept
        return out

    def fit(self, case: Case) -> Case:
        """case with each scale this convention cannot pass given as a kind it can, of the same value.

        Every recipe reads a scale's value alone (None is 1.0), so the reference's bytes are unchanged.
        Used by fixed Cases (exhaustive, big caches, argument checks); drawn Cases are narrowed instead.
        """
        def fitted(scale: Scale) -> Scale:
            if scale.kind in self.scale_kinds:
                return scale
            kind = next(k for k in ("tensor1", "tensor0d", "float", "none") if k in self.scale_kinds)
            return Scale(kind, scale.value)
        return case.replace(k_scale=fitted(case.k_scale), v_scale=fitted(case.v_scale))

    def invoke(self, fn: Callable[..., object], call: Mapping[str, object], fixed: Mapping[str, object]) -> None:
        """Call fn with `call` (this project's names) as this convention spells it, plus `fixed` keywords.
        A convention with a format argument says the call's format there (an e5m2 call has "cache_dtype")."""
        args = [call[name] for name in POSITIONAL if name in self.spelling]
        if self.format_position is not None:
            fmt = str(call.get("cache_dtype", "fp8_e4m3"))
            # an e4m3 call names its format only when the Case spells it by its alias (strategies.build)
            alias = dict(self.format_aliases).get(fmt) if "cache_dtype" in call and fmt == "fp8_e4m3" else None
            args.insert(self.format_position, alias or self.format_name(fmt))
        keywords = {self.spelling[n]: call[n] for n in ("recipe", "checked") if n in self.spelling and n in call}
        fn(*args, **keywords, **fixed)

    def invoke_per_token_head(self, fn: Callable[..., object], call: Mapping[str, object],
                              fixed: Mapping[str, object]) -> None:
        """Call fn with a per-token-head call (strategies.per_token_head.PTHBuilt.call()), by keyword:
        the tensors as this convention spells them, the scale caches when the layout is separate, and
        (kvfp8) page_size, checked and the per_token_head mode."""
        names = dict(self.spelling)
        if self.name == "kvfp8":
            names["per_token_head"] = "per_token_head"
        names |= {n: n for n in ("k_scale_cache", "v_scale_cache") if call.get(n) is not None}
        fn(**{names[n]: value for n, value in call.items() if n in names}, **fixed)


KVFP8 = Convention("kvfp8", {n: n for n in ARGUMENTS}, per_head_scales=True, per_token_head=True)
SGLANG = Convention("sglang", {n: n for n in POSITIONAL})
VLLM = Convention(
    "vllm",
    {"k": "key", "v": "value", "k_cache": "key_cache", "v_cache": "value_cache", "cache_loc": "slot_mapping",
     "k_scale": "k_scale", "v_scale": "v_scale"},
    input_ranks=(3,), cache_ranks=(4,), loc_dtypes=("int64",), scale_kinds=("tensor0d", "tensor1"),
    format_position=5, format_names=(("fp8_e4m3", "fp8"), ("fp8_e5m2", "fp8_e5m2")),
    format_aliases=(("fp8_e4m3", "fp8_e4m3"),),
    stack_recipe="divide",  # vLLM's CUDA reshape_and_cache_flash: x / scale (kernel/recipe.py)
)
# vLLM with per-attention-head scales (vllm#30141): the same call, k_scale/v_scale also [H] float32 tensors. Opt-in
# (--convention vllm-per-head): a vLLM kernel without them is not held to them.
VLLM_PER_HEAD = dataclasses.replace(VLLM, name="vllm-per-head", per_head_scales=True)
# vLLM with CUDA-graph padding (vllm#13922): keys and values may be longer than slot_mapping, whose length is the
# batch's T (Case.padded_rows). Opt-in (--convention vllm-padded-keys): a kernel whose caller pads slot_mapping too,
# or never pads, is not held to it.
VLLM_PADDED_KEYS = dataclasses.replace(VLLM, name="vllm-padded-keys", padded_keys=True)
# vLLM's per-token-head write: reshape_and_cache_int8_fp8(key, value, key_cache, value_cache, slot_mapping, *,
# k_scale_cache, v_scale_cache, kv_quant_mode) in vllm/v1/attention/ops/triton_quant_kv/ (vllm#38378): the scales
# go to float32 scale caches [num_blocks, block_size, H]; page_size is the caches' block_size. (vLLM's own
# function also takes kv_quant_mode, its enum: wrap it in an adapter that fixes FP8_PER_TOKEN_HEAD.)
VLLM_PER_TOKEN_HEAD = Convention(
    "vllm-per-token-head",
    {"k": "key", "v": "value", "k_cache": "key_cache", "v_cache": "value_cache", "cache_loc": "slot_mapping"},
    input_ranks=(3,), cache_ranks=(4,), scale_kinds=("none",), per_token_head=True, static=False,
)
CONVENTIONS = {c.name: c for c in (KVFP8, SGLANG, VLLM, VLLM_PER_HEAD, VLLM_PADDED_KEYS, VLLM_PER_TOKEN_HEAD)}

_HEADS = {  # the leading parameter names that identify a convention
    "vllm": ("key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype", "k_scale", "v_scale"),
    "sglang": ("k", "v", "k_cache", "v_cache", "cache_loc", "k_scale", "v_scale", "page_size"),
}


def detect(fn: Callable[..., object]) -> Convention:
    """The convention fn's signature declares: a `recipe` parameter (or `*args, **kwargs`, which take
    anything) is kvfp8; else by parameter names.

    Raises ValueError with the signature when it matches none (pass --convention, or write an adapter).
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cannot read the signature of {fn!r} ({exc}); pass --convention") from exc
    names = tuple(params)
    kinds = {p.kind for p in params.values()}
    if "recipe" in params or {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD} <= kinds:
        return KVFP8
    if names[:5] == _HEADS["vllm"][:5] and {"k_scale_cache", "v_scale_cache"} <= set(names):
        return VLLM_PER_TOKEN_HEAD
    for name, head in _HEADS.items():
        if names[:len(head)] == head:
            return CONVENTIONS[name]
    raise ValueError(f"cannot tell the calling convention of {getattr(fn, '__name__', fn)}{inspect.signature(fn)}: "
                     f"pass --convention {'|'.join(CONVENTIONS)}, or write an adapter function in one of them "
                     "(docs/conventions.md)")


def get_convention(name: str) -> Convention:
    if name not in CONVENTIONS:
        raise ValueError(f"convention must be one of {sorted(CONVENTIONS)}, got {name!r}")
    return CONVENTIONS[name]
