"""The defect corpus's catalogue: one entry per file of examples/defects/, as plain data.

Each base (a conformant implementation) has a control (the base itself, no defect) and variants that carry
exactly one defect (or two independent ones, the pairs). An entry says what a conformance report of the file
should find outside the argument contract (`validation:*` keys are the argument contract, not listed here):

- `file`, `function`: what to give `make conformance IMPL=examples/defects/<file>:<function>`.
- `convention`: "sglang" or "vllm" (the function's signature declares it).
- `base`: the control this file varies; `recipe`: the recipe the file should be identified as.
- `defects`: (effect, trigger) pairs, empty for a control. The effect is the report's vocabulary
  (`scale:inverted`, `padding:wraps-to-end`, `raises:TypeError`, ...). The trigger is the set of input
  dimensions (joined by `+`) whose return to the plain call makes the failure vanish, K and V symmetric, or
  `plain` when the plain call fails already. The plain call is that of conformance/diagnosis/ablation.py:
  contiguous [T, H, D] bf16 input, a contiguous 4-D float8_e4m3fn cache (page size 16), an int64 cache_loc
  without padding, out-of-range or shared slots, H and D powers of two, both scales 1.0 of the convention's
  usual kind, ordinary values (e4m3 numbers). Value dimensions (`values`: other input values; `scale-value`: a
  scale other than 1.0; `special-values`: ±0, ±inf, NaN, ties, past ±448) are named where a defect needs them;
  a value effect's report key leaves them out (tools/corpus.py, `expected_key`).
- `needs`: "cpu" when the defects show on a CPU (torch; Triton under its interpreter); "cuda" when one needs a
  GPU (32-bit offsets past 2**31 bytes, an approximate division, a host sync under CUDA-graph capture).
- `causes`: how many independent defects (0: control, 1, 2: a pair).
- `cpu_effects`: effects that read otherwise under Triton's interpreter (a compile error there is an
  InterpreterError).
- `models`: the real bug it models; `title`, `note`: in words.

`python -m examples.defects.catalogue --markdown` (or `python examples/defects/catalogue.py --markdown`)
prints the table of examples/defects/README.md; without `--markdown`, one tab-separated line an entry (spec,
needs, expected keys) for a shell loop; `--needs cpu` keeps the entries a CPU can run.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

Entry = dict[str, Any]

#: base -> (convention, function, recipe)
BASES: dict[str, tuple[str, str, str]] = {
    "torch_vllm": ("vllm", "reshape_and_cache_flash", "divide"),
    "torch_sglang": ("sglang", "fused_fp8_set_kv_buffer", "single"),
    "triton_sglang": ("sglang", "fused_fp8_set_kv_buffer", "single"),
    "triton_vllm": ("vllm", "reshape_and_cache_flash", "divide"),
}


def _entry(file: str, title: str, defects: tuple[tuple[str, str], ...], models: str, needs: str = "cpu",
           note: str = "", cpu_effects: dict[str, str] | None = None, causes: int | None = None,
           opt_in: str = "") -> Entry:
    """One catalogue entry; convention, function and recipe follow from the base (the file's prefix).

    `opt_in`: a convention the report is run under (`--convention`), one the signature does not declare (vLLM's
    `vllm-padded-keys`).

    `causes`: the independent defects (0 control, 1, 2 a pair); by default one per (effect, trigger).
    """
    base = next(b for b in sorted(BASES, key=len, reverse=True) if file == f"{b}.py" or file.startswith(f"{b}_"))
    convention, function, recipe = BASES[base]
    return {"file": file, "function": function, "convention": convention, "base": base, "recipe": recipe,
            "defects": defects, "needs": needs, "models": models, "title": title, "note": note,
            "cpu_effects": dict(cpu_effects or {}), "causes": len(defects) if causes is None else causes,
            "opt_in": opt_in}


CATALOGUE: list[Entry] = [
    # -- torch_vllm: the control, then its variants ------------------------------------------------------------
    _entry("torch_vllm.py", "control (no defect)", (), "the control: no defect"),
    _entry("torch_vllm_padding_wraps.py", "padding wraps to the end of the cache",
           (("padding:wraps-to-end", "padding"),),
           "vllm#43810 (padding slot -1 through `slot // block_size` wrote the last slot)",
           note="the IndexError of entries below -num_slots is the same cause (a report lists it with this "
                "defect)"),
    _entry("torch_vllm_tile_tail.py", "the head_dim tail past the last tile of 32 is never written",
           (("wrong-slot:unwritten", "dim-not-multiple:32"),),
           "sglang#15522 (a tile straddling a boundary not a multiple of the block); XPU-Forces/mojo_opset#266",
           note="written after the diagnosis was settled; its report was read only then"),
    _entry("torch_vllm_oob_clamped.py", "out-of-range slots clamped to the last slot",
           (("out-of-range:written", "out-of-range"),),
           "no issue of its own; related: vllm#13922 (slot_mapping longer than the key: entries that name "
           "no slot of this call)"),
    _entry("torch_vllm_scale_multiplied.py", "the scale is applied in the wrong direction",
           (("scale:inverted", "scale-value"),),
           "vllm-xpu-kernels#475, sglang#18818 (scale handling: the scale's direction)"),
    _entry("torch_vllm_v_with_k_scale.py", "V is written with K's scale",
           (("scale:swapped", "scales-differ"),),
           "sglang#26852 (scale handling: one cache's scale used for the other)"),
    _entry("torch_vllm_v_with_k_input_strides.py", "V's input is read with K's strides",
           (("strides:other-input", "input-layouts-differ"),),
           "flashinfer#527, ROCm/aiter#3492 (strides: one tensor's strides used for another)"),
    _entry("torch_vllm_caches_swapped.py", "the K and V caches are swapped",
           (("kv-mixed:caches-swapped", "plain"),),
           "LMCache#2494/#2495 (a block-first vs K/V-first layout mismatch between writer and reader)"),
    _entry("torch_vllm_page_stride_from_shape.py", "the page stride is computed from the shape",
           (("strides:cache-page-stride", "strided-cache"),),
           "ROCm/aiter#3492 (a hard-coded block stride, wrong for `unbind()` views)"),
    _entry("torch_vllm_zero_sign.py", "drops the sign of -0",
           (("zero-sign:plus", "special-values"),),
           "no issue of its own: a hand-written encoder's sign test"),
    _entry("torch_vllm_tensor0d_double_rounding.py", "a 0-d scale double-rounds through the input dtype",
           (("rounding:unfused-tensor0d", "scale-kind:tensor0d"),),
           "triton#11753 (rounding through an intermediate format); the 0-d-tensor `div_` rounding of "
           "docs/facts.md"),
    _entry("torch_vllm_empty_batch_raises.py", "raises on an empty batch",
           (("raises:IndexError", "empty-batch"),),
           "no issue of its own: an empty batch (T = 0) not special-cased"),
    _entry("torch_vllm_item_sync.py", "reads the scale with .item() (a host sync)",
           (("graph:sync", "plain"),),
           "flashinfer#3740, vllm#25513 (a host sync breaks CUDA-graph capture)",
           needs="cuda",
           note="CUDA only: .item() is a host sync only where the scale lives on a GPU"),
    _entry("torch_vllm_key_div_inplace.py", "divides the caller's float32 key in place",
           (("input-modified", "input-float32+scale-value"),),
           "SGLang's unfused write, `k.div_(k_scale)` on the caller's tensor (examples/sglang_unfused.py)",
           note="it modifies k and v (one cause, one key); only a scale other than 1.0 changes a value"),
    _entry("torch_vllm_pair_padding_wraps_zero_sign.py", "padding wraps to the end; -0 loses its sign",
           (("padding:wraps-to-end", "padding"), ("zero-sign:plus", "special-values")),
           "vllm#43810; a hand-written encoder's sign test"),
    _entry("torch_vllm_pair_oob_clamped_v_with_k_scale.py",
           "out-of-range slots clamped to the last slot; V written with K's scale",
           (("out-of-range:written", "out-of-range"), ("scale:swapped", "scales-differ")),
           "related: vllm#13922; sglang#26852"),
    # -- torch_sglang: the control, then its variants ----------------------------------------------------------
    _entry("torch_sglang.py", "control (no defect)", (), "the control: no defect"),
    _entry("torch_sglang_dim_tail.py", "a head's last D % 8 dims are not written",
           (("wrong-slot:unwritten", "dim-not-multiple:8"),),
           "sglang#15522 (a tile straddling a boundary that is not a multiple of the block), "
           "XPU-Forces/mojo_opset#266"),
    _entry("torch_sglang_padding_slot0.py", "padding writes slot 0",
           (("padding:slot-0", "padding"),),
           "sglang#32477, vllm#43810 (padding entries written to a real slot)"),
    _entry("torch_sglang_uint8_value_cast.py", "a uint8 cache gets converted values, not the fp8 bits",
           (("storage:value-cast", "cache-uint8"),),
           "vllm-xpu-kernels#475, LMCache#4064 (storage dtype: a uint8 cache holding fp8 bits)"),
    _entry("torch_sglang_rounds_toward_zero.py", "rounds toward zero",
           (("rounds-toward-zero", "values"),),
           "triton#11753 (an fp8 conversion that does not round to nearest-even)"),
    _entry("torch_sglang_fp16_double_rounding.py", "fp16 input double-rounds through fp16",
           (("rounding:unfused", "input-float16"),),
           "triton#11753 (rounding through an intermediate format), for one input dtype only"),
    _entry("torch_sglang_chunk_rows_from_zero.py", "past 256 tokens, each chunk quantizes the first chunk's rows",
           (("wrong-slot:tokens-moved", "tokens-above:256"),),
           "sglang#15522 (a tile straddling a boundary that is not a multiple of the block: 528 = 512 + 16)",
           note="written blind by a helper (held-out batch eleven); only the many-tokens row shows it on the CPU"),
    _entry("torch_sglang_flush_to_zero.py", "flushes e4m3 subnormal results to zero",
           (("flush-to-zero", "values"),),
           "no issue of its own: an encoder without e4m3 subnormals (FTZ)"),
    _entry("torch_sglang_nan_sign.py", "keeps the sign of a negative NaN",
           (("encoding:nan-sign", "special-values"),),
           "no issue of its own: torch's own cast keeps a NaN's sign (examples/sglang_unfused.py)"),
    _entry("torch_sglang_nan_past_464.py", "NaN past ±464 instead of saturating",
           (("encoding:nan-past-448", "values"),),
           "pytorch#178817 (overflow: the cast gives NaN past 464 instead of saturating)"),
    _entry("torch_sglang_int32_loc_raises.py", "raises on an int32 cache_loc",
           (("raises:TypeError", "loc-int32"),),
           "no issue of its own: an index dtype SGLang passes, refused"),
    _entry("torch_sglang_2d_input_raises.py", "raises on a 2-D input",
           (("raises:ValueError", "input-2d"),),
           "no issue of its own: SGLang's [T, H*D] input layout, refused"),
    _entry("torch_sglang_tensor0d_scale_ignored.py", "a 0-d tensor scale is ignored",
           (("scale:ignored", "scale-kind:tensor0d"),),
           "sglang#26852, vllm-xpu-kernels#475 (scale handling: a scale of one kind dropped)"),
    _entry("torch_sglang_loc_inplace.py", "rewrites the caller's cache_loc in place",
           (("input-modified", "out-of-range"),),
           "SGLang's and vLLM's in-place rewrites of caller tensors (an int64 `.long()` is no copy)"),
    _entry("torch_sglang_pair_nan_sign_2d_raises.py", "NaN keeps its sign; raises on a 2-D input",
           (("encoding:nan-sign", "special-values"), ("raises:ValueError", "input-2d")),
           "torch's NaN sign (examples/sglang_unfused.py); a refused input layout"),
    _entry("torch_sglang_pair_value_cast_oob_wraps.py",
           "a uint8 cache gets converted values; out-of-range slots wrap around",
           (("storage:value-cast", "cache-uint8"), ("out-of-range:written", "out-of-range")),
           "vllm-xpu-kernels#475, LMCache#4064; related: vllm#13922"),
    # -- triton_sglang: the control, then its variants ---------------------------------------------------------
    _entry("triton_sglang.py", "control (no defect)", (), "the control: no defect"),
    _entry("triton_sglang_offsets_32bit.py", "32-bit cache offsets",
           (("big-cache:wrong-offsets", "big-cache"),),
           "vllm#1486, sglang#39948 (32-bit offsets into a KV cache above 2**31 bytes)",
           needs="cuda",
           note="CUDA only: a cache above 2**31 bytes; an offset that wraps may also fault (a crash)"),
    _entry("triton_sglang_cache_strides_ignored.py", "ignores the caches' strides",
           (("strides:cache-ignored", "strided-cache"),),
           "flashinfer#527, ROCm/aiter#3492 (strides: a contiguous cache assumed)"),
    _entry("triton_sglang_loc_stride_ignored.py", "ignores cache_loc's stride",
           (("strides:cache-loc-ignored", "strided-loc"),),
           "flashinfer#527, ROCm/aiter#3492 (strides: an index tensor's stride assumed 1)"),
    _entry("triton_sglang_dim_pow2_only.py", "head_dim must be a power of two",
           (("raises:CompilationError", "dim-not-pow2"),),
           "sglang#15522 (tile tails: a head_dim that is not a power of two)",
           cpu_effects={"raises:CompilationError": "raises:InterpreterError"},
           note="under the interpreter the exception is InterpreterError"),
    _entry("triton_sglang_3d_cache_raises.py", "raises on a 3-D cache",
           (("raises:ValueError", "cache-3d"),),
           "no issue of its own: SGLang's [S, H, D] cache layout, refused"),
    _entry("triton_sglang_float_scale_ignored.py", "a Python float scale is ignored",
           (("scale:ignored", "scale-kind:float"),),
           "sglang#26852, sglang#18818 (scale handling: float scales dropped)"),
    _entry("triton_sglang_pair_loc_stride_uint8_raises.py", "ignores cache_loc's stride; raises on a uint8 cache",
           (("strides:cache-loc-ignored", "strided-loc"), ("raises:TypeError", "cache-uint8")),
           "flashinfer#527, ROCm/aiter#3492; LMCache#4064 (uint8 caches)"),
    _entry("triton_sglang_pair_heads_pow2_float_scale.py",
           "the number of heads must be a power of two; a float scale is ignored",
           (("raises:CompilationError", "heads-not-pow2"), ("scale:ignored", "scale-kind:float")),
           "sglang#15522; sglang#26852",
           cpu_effects={"raises:CompilationError": "raises:InterpreterError"},
           note="under the interpreter the exception is InterpreterError"),
    # -- triton_vllm: the control, then its variants -----------------------------------------------------------
    _entry("triton_vllm.py", "control (no defect)", (), "the control: no defect"),
    _entry("triton_vllm_v_with_k_strides.py", "writes V with K's cache strides",
           (("strides:other-cache", "cache-layouts-differ"),),
           "flashinfer#527, ROCm/aiter#3492 (strides: one cache's strides used for both)"),
    _entry("triton_vllm_input_strides_ignored.py", "reads inputs ignoring their strides",
           (("strides:inputs-ignored", "strided-input"),),
           "flashinfer#527, ROCm/aiter#3492 (strides: inputs assumed contiguous)"),
    _entry("triton_vllm_approx_division.py", "approximate division",
           (("approximate-division", "special-values"),),
           "vLLM's triton_reshape_and_cache_flash (`x / scale`: approximate arithmetic)",
           needs="cuda",
           note="CUDA only, and only where x / s lies within an ulp or two of an e4m3 rounding tie. A sweep"
                " of every positive bf16 at 4,007 scales on an H200 found two such inputs, both at the tie "
                "between e4m3's largest subnormal and smallest normal (meta_tests/test_defect_corpus.py, "
                "APPROX_INPUTS); drawn values practically never hit one, values built to be ties do "
                "(`special-values`: ties). On an H200 Triton's `/` agrees with `single`'s x * (1/s) on all "
                "but 16 of 7,864,320 bytes of the identification sweep (zeros at a subnormal scale, where "
                "single's 1/s is inf and divide's quotient is 0), so the sweep alone cannot tell it from "
                "single: it approximates the division, as `single` approximates it with an IEEE reciprocal"),
    _entry("triton_vllm_heads_assert.py", "asserts head-contiguous caches",
           (("raises:AssertionError", "strided-cache"),),
           "vLLM's triton_reshape_and_cache_flash (\"only continous heads are supported\")"),
    _entry("triton_vllm_oob_wraps.py", "out-of-range slots wrap around",
           (("out-of-range:written", "out-of-range"),),
           "no issue of its own: ring-buffer slot arithmetic; related: vllm#13922"),
    _entry("triton_vllm_grid_from_keys.py", "the grid sized by the keys, not slot_mapping (keys padded past it)",
           (("overrun:rows", "padded-keys"),), "vllm#13922 (fixing vllm#13418)", opt_in="vllm-padded-keys"),
    _entry("triton_vllm_pair_other_strides_inputs_ignored.py",
           "V written with K's cache strides; inputs' head and dim strides ignored",
           (("strides:other-cache", "cache-layouts-differ"), ("strides:inputs-heads-ignored", "strided-input")),
           "flashinfer#527, ROCm/aiter#3492"),
]


def controls() -> list[Entry]:
    return [e for e in CATALOGUE if not e["defects"]]


def singles() -> list[Entry]:
    return [e for e in CATALOGUE if e["causes"] == 1]


def pairs() -> list[Entry]:
    return [e for e in CATALOGUE if e["causes"] == 2]


def effects(entry: Entry, interpreted: bool = False) -> tuple[tuple[str, str], ...]:
    """The entry's (effect, trigger) pairs, as they read compiled or (interpreted=True) under Triton's interpreter."""
    if not interpreted:
        return entry["defects"]
    return tuple((entry["cpu_effects"].get(effect, effect), trigger) for effect, trigger in entry["defects"])


def spec(entry: Entry) -> str:
    """`examples/defects/<file>:<function>`, relative to the repository root."""
    return f"examples/defects/{entry['file']}:{entry['function']}"


def markdown(catalogue: list[Entry] | None = None) -> str:
    """The catalogue as a markdown table."""
    rows = ["| file | base | convention | recipe | expected defects (effect@trigger) | needs | models |",
            "|---|---|---|---|---|---|---|"]
    for e in catalogue or CATALOGUE:
        keys = ", ".join(f"`{effect}@{trigger}`" for effect, trigger in e["defects"]) or "none (control)"
        if e["cpu_effects"]:
            keys += " (interpreter: " + ", ".join(f"`{v}`" for v in e["cpu_effects"].values()) + ")"
        convention = f"{e['convention']} (run as `--convention {e['opt_in']}`)" if e["opt_in"] else e["convention"]
        rows.append(f"| `{e['file']}` | {e['base']} | {convention} | {e['recipe']} | {keys} | {e['needs']} "
                    f"| {e['models']} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the catalogue as a markdown table")
    parser.add_argument("--needs", choices=("cpu", "cuda"),
                        help="only the entries this machine can run: cpu (the CPU ones), cuda (all)")
    args = parser.parse_args(argv)
    entries = [e for e in CATALOGUE if args.needs != "cpu" or e["needs"] == "cpu"]
    if args.markdown:
        print(markdown(entries))
    else:  # one line an entry: spec, needs, expected keys (tab-separated, for a shell loop)
        for e in entries:
            keys = " ".join(f"{effect}@{trigger}" for effect, trigger in e["defects"]) or "-"
            print(f"{spec(e)}\t{e['needs']}\t{keys}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
