"""The capability table's rows: one input class each, and how a row's cell is decided.

A probe row is a plain Case (contiguous [T, H, D] input, 4-D fp8 cache, int64 cache_loc, H and D
powers of two, no padding, no special values, the convention's usual scale kind) changed in one
way: the input class. `probe` draws a few of them with Hypothesis (derandomized, so a report is
reproducible), runs each through the reference and the implementation, classifies any difference
(conformance.diagnosis.classify) and raises one exception type per kind of defect, so that Hypothesis shrinks
each distinct defect to its own smallest Case (report_multiple_bugs). The pytest test that runs the
probes is conformance/capability_probes.py; `make test` does not collect it (tools.conformance names it).

Other rows are decided by property tests of the run (CUDA graphs per scale kind, caches above 2**31
bytes, and each argument-error class of conformance/test_errors.py): `tests` names them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from conformance.diagnosis.classify import (
    ALONE_MUTATIONS,
    ALONE_TEST,
    SAVED,
    Finding,
    case_size,
    classify_result,
    excerpt_of,
    narrow,
    run_case,
)
from conformance.impls import Implementation, Inexpressible
from strategies._cache import sampled
from strategies.case import SCALE_KINDS, Case, Override, Scale
from strategies.fp import f32
from strategies.layouts import strided_layouts
from strategies.locations import INT_MAX, INT_MIN, padded_rows
from strategies.scales import scale_values

Draw = Callable[[st.SearchStrategy], object]
KIND_TITLES = {"none": "None", "float": "a Python float", "tensor0d": "a 0-d tensor", "tensor1": "a 1-element tensor"}
PROBE_TEST = "conformance/capability_probes.py::test_capability"


@dataclass(frozen=True)
class InputClass:
    """One row: an id that stays the same between reports, the text shown, and how it is decided."""

    id: str
    title: str
    transform: Callable[[Case, Draw], Case] | None = None  # probe rows: the plain Case -> one of this class
    tests: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = ()  # (module, test, params) deciding it
    group: str = "input classes"
    needs: str = ""  # "cuda": decided by tests that only run on CUDA
    examples: int | None = None  # probe rows: at most this many examples (default: the run's)
    shrink: bool = True  # probe rows: whether Hypothesis shrinks a failure (the diagnosis minimizes anyway)
    facts: dict = field(default_factory=dict, compare=False, hash=False)


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def plain_cases(impl: Implementation, device: torch.device) -> st.SearchStrategy[Case]:
    """The plain Cases every probe row starts from (T >= 1; H, D powers of two, D >= 8)."""
    kind = impl.convention.plain_scale_kind
    space: dict = dict(contiguous=True, input_ranks=(3,), cache_ranks=(4,), cache_dtypes=("float8_e4m3fn",),
                       loc_dtypes=("int64",), input_dtypes=("bfloat16", "float16"), scale_kinds=(kind,),
                       padding=False, max_overrides=0, checked=False, allow_out_of_range=False)
    if device.type == "cuda":
        space["size"] = "large"
    else:  # the interpreter's cost is per program instance: keep probes small
        space.update(max_tokens=6, max_heads=4, max_dim=128)
    return impl.cases(**space).filter(lambda c: c.num_tokens > 0).map(
        lambda c: c.replace(num_heads=_pow2_floor(c.num_heads), head_dim=max(8, _pow2_floor(c.head_dim))))


# -- the transforms ---------------------------------------------------------------------------------

def _not_pow2(case: Case, draw: Draw) -> Case:
    return case.replace(num_heads=draw(sampled((3, 5, 6))), head_dim=draw(sampled((80, 24, 96, 72, 100))))


def _paged(case: Case, draw: Draw) -> Case:
    page = draw(sampled((16, 3)))
    return case.replace(page_size=page, num_pages=-(-case.num_slots // page))


def _tokens(case: Case, draw: Draw) -> list[int]:
    return draw(st.lists(st.integers(0, case.num_tokens - 1), min_size=1, max_size=case.num_tokens, unique=True))


def _padding(case: Case, draw: Draw) -> Case:
    """Some tokens' slots made negative: half the time in one run of at least four slots, its first and last
    kept and tokens inside it padded ((4, -1, 6, 7): a kernel that takes a batch, or a tile of four tokens, for
    one run from its endpoints writes the padded token to slot 5), else any tokens of the plain Case. Shrinks to
    the run."""
    tokens, pages = case.num_tokens, case.num_pages
    if not draw(st.booleans(), label="padding_anywhere"):  # the run first: Hypothesis's simplest example
        tokens = max(tokens, 4)
        pages = max(pages, -(-tokens // case.page_size))
        start = draw(st.integers(0, pages * case.page_size - tokens))
        loc = [start + i for i in range(tokens)]
        pads = draw(st.lists(st.integers(1, tokens - 2), min_size=1, max_size=tokens - 2, unique=True))
    else:
        loc, pads = list(case.cache_loc), _tokens(case, draw)
    for t in pads:
        loc[t] = draw(sampled((-1, -2, -1000, INT_MIN[case.loc_dtype])))
    return case.replace(num_tokens=tokens, num_pages=pages, cache_loc=tuple(loc))


def _padded_keys(case: Case, draw: Draw) -> Case:
    """K and V one to eight rows longer than cache_loc (a batch padded to a captured graph's size)."""
    return case.replace(padded_rows=draw(padded_rows(), label="padded_rows"))


#: Tokens of the many-tokens row: 512 + 16, the tile tail of sglang#15522, past every power-of-two tile or
#: chunk from 32 to 512 by 16 tokens (the properties draw T <= 16 on the CPU).
MANY_TOKENS = 528


def _many_tokens(case: Case, draw: Draw) -> Case:
    """MANY_TOKENS tokens at consecutive slots from a drawn one (wrapping), H <= 2 and D <= 16: the
    interpreter's cost is per program instance and per element."""
    t = MANY_TOKENS
    pages = -(-(t + draw(st.integers(0, 16))) // case.page_size)
    n = pages * case.page_size
    start = draw(st.integers(0, n - 1))
    return case.replace(num_tokens=t, num_heads=min(case.num_heads, 2), head_dim=min(case.head_dim, 16),
                        num_pages=pages, cache_loc=tuple((start + i) % n for i in range(t)))


#: H of the many-heads row: the KV heads of multi-head-attention models (Llama-2-13B's 40), past a head table
#: or tile sized for grouped-query ones (8 or 16).
MANY_HEADS = (40, 64)


def _many_heads(case: Case, draw: Draw) -> Case:
    """H from MANY_HEADS, with T <= 4 and D <= 32: the interpreter's cost is per program instance and per
    element."""
    t = min(case.num_tokens, 4)
    return case.replace(num_tokens=t, num_heads=draw(sampled(MANY_HEADS)), head_dim=min(case.head_dim, 32),
                        cache_loc=case.cache_loc[:t])


def _out_of_range(case: Case, draw: Draw) -> Case:
    loc = list(case.cache_loc)
    n = case.num_slots
    for t in _tokens(case, draw):
        loc[t] = draw(sampled((n, n + 1, n + case.page_size, INT_MAX[case.loc_dtype])))
    return case.replace(cache_loc=tuple(loc), checked=False)


def _strided_inputs(case: Case, draw: Draw) -> Case:
    return case.replace(k_layout=draw(strided_layouts(3, "k_layout", gaps=True)),
                        v_layout=draw(strided_layouts(3, "v_layout", gaps=True)), loc_step=draw(sampled((2, 3))))


def _strided_caches(case: Case, draw: Draw) -> Case:
    return case.replace(k_cache_layout=draw(strided_layouts(4, "k_cache_layout")),
                        v_cache_layout=draw(strided_layouts(4, "v_cache_layout")))


_SIGN = {"bfloat16": 0x8000, "float16": 0x8000, "float32": 0x80000000}
_INF = {"bfloat16": 0x7F80, "float16": 0x7C00, "float32": 0x7F800000}
_QUIET = {"bfloat16": 0x40, "float16": 0x200, "float32": 0x400000}


def _float16(case: Case, draw: Draw) -> Case:
    """float16 input with 512 values a token: a defect of float16 alone that touches one value in two
    thousand (a quotient rounded to float16 before the e4m3 rounding) shows in a few tokens."""
    return case.replace(input_dtype="float16", num_heads=4, head_dim=128)


def _special_values(case: Case, draw: Draw) -> Case:
    """±0, ±inf and NaN of both signs in K and V, at drawn positions (the seeded values around them
    already reach e4m3's subnormals and values past ±448)."""
    dt = case.input_dtype
    specials = (("+0", 0), ("-0", _SIGN[dt]), ("+inf", _INF[dt]), ("-inf", _INF[dt] | _SIGN[dt]),
                ("+nan", _INF[dt] | _QUIET[dt]), ("-nan", _INF[dt] | _QUIET[dt] | _SIGN[dt]))
    n = case.num_tokens * case.num_heads * case.head_dim
    first = draw(st.integers(0, max(0, n - len(specials))))
    return case.replace(overrides=tuple(Override(t, (first + i) % n, bits, label)
                                        for t in "kv" for i, (label, bits) in enumerate(specials)))


#: A scale-kind row's values: non-dyadic first (where the recipes, and the kinds' roundings, differ), then any.
KIND_VALUES = st.one_of(sampled((0.3, 0.7, 1 / 3, 0.1, 1.7, 41.5, 0.0123)).map(f32), scale_values())


def _scale(which: str, kind: str) -> Callable[[Case, Draw], Case]:
    def transform(case: Case, draw: Draw) -> Case:
        value = 1.0 if kind == "none" else draw(KIND_VALUES)
        return case.replace(**{which: Scale(kind, value)})
    return transform


def _empty(case: Case, draw: Draw) -> Case:
    return case.replace(num_tokens=0, cache_loc=(), overrides=())


def _set(**changes: object) -> Callable[[Case, Draw], Case]:
    return lambda case, draw: case.replace(**changes)


def _graph_tests(kind: str) -> tuple:
    tests = [("test_graphs", name, (("scale_kind", kind),))
             for name in ("test_capture_and_replay", "test_replay_new_contents")]
    if kind == "float":
        tests.append(("test_graphs", "test_float_scale_is_captured", ()))
    return tuple(tests)


def _rows() -> list[InputClass]:
    rows = [
        InputClass("baseline", "plain call: contiguous [T, H, D] input, 4-D fp8 cache, int64 cache_loc, H and D "
                               "powers of two", lambda c, d: c),
        InputClass("not-pow2", "H and D not powers of two", _not_pow2),
        InputClass("input-2d", "2-D input [T, H*D]", _set(input_rank=2)),
        InputClass("cache-3d", "3-D cache [slots, H, D]", _set(cache_rank=3)),
        InputClass("cache-4d", "4-D cache [pages, page_size, H, D], page_size > 1", _paged),
        InputClass("cache-uint8", "uint8 cache (fp8 bits as bytes)", _set(cache_dtype="uint8")),
        InputClass("loc-int32", "int32 cache_loc", _set(loc_dtype="int32")),
        InputClass("loc-int64", "int64 cache_loc", _set(loc_dtype="int64")),
        InputClass("input-fp32", "float32 input", _set(input_dtype="float32")),
        InputClass("input-fp16", "float16 input, four heads of 128 dims a token", _float16),
        InputClass("padding", "padding: negative cache_loc entries", _padding),
        InputClass("padded-keys", "keys padded past cache_loc's end (CUDA-graph padding: T is cache_loc's length, "
                                  "vllm#13922)", _padded_keys),
        InputClass("out-of-range", "out-of-range slots (cache_loc >= num_slots, checked=False)", _out_of_range),
        InputClass("strided-inputs", "strided inputs (and a strided cache_loc)", _strided_inputs),
        InputClass("strided-caches", "strided or padded caches", _strided_caches),
        InputClass("special-values", "special values: ±0, ±inf, NaN of both signs, past ±448", _special_values),
    ]
    for which in ("k_scale", "v_scale"):
        other = "v_scale" if which == "k_scale" else "k_scale"
        for kind in SCALE_KINDS:
            rows.append(InputClass(f"{which}-{kind}", f"{which} {KIND_TITLES[kind]} ({other} as in the plain call)",
                                   _scale(which, kind)))
    rows.append(InputClass("empty", "T = 0 (an empty batch)", _empty))
    rows.append(InputClass("many-tokens", f"T = {MANY_TOKENS} (past tiles and chunks of 32 to 512 tokens)",
                           _many_tokens, examples=2, shrink=False))
    rows.append(InputClass("many-heads", f"H = {' or '.join(map(str, MANY_HEADS))} (multi-head attention's KV heads, "
                           "past a head table or tile of 8 or 16)", _many_heads, examples=2))
    rows.append(InputClass("per-head-scales", "per-head scales: a [H] float32 k_scale or v_scale (vllm#30141)",
                           tests=(("test_per_head", "*", ()),)))
    # Decided by the properties that hold an implementation to e5m2 bytes; they skip (not applicable) for one
    # that declines e5m2 caches or cannot be told them, and for one that accepts them without reading their
    # dtype, whose argument-contract test (ALONE_TEST) then decides the row.
    rows.append(InputClass("e5m2-caches", "e5m2 caches: float8_e5m2, or uint8 with cache_dtype='fp8_e5m2' (vLLM's "
                           "kv_cache_dtype='fp8_e5m2')",
                           tests=tuple(("test_e5m2", t, ()) for t in ("test_e5m2_is_bit_exact", "test_e5m2_edges",
                                                                     "test_e5m2_capture_and_replay", ALONE_TEST))))
    # Likewise for e4m3fnuz (ROCm MI300's e4m3): decided by test_fnuz's bit-exact properties.
    rows.append(InputClass("format-alias", "kv_cache_dtype \"fp8_e4m3\", vLLM's other name for \"fp8\"",
                           _set(format_alias=True)))
    rows.append(InputClass("fnuz-caches", "e4m3fnuz caches: float8_e4m3fnuz, or uint8 with "
                           "cache_dtype='fp8_e4m3fnuz' (vLLM on ROCm MI300)",
                           tests=tuple(("test_fnuz", t, ()) for t in ("test_fnuz_is_bit_exact", "test_fnuz_edges",
                                                                     ALONE_TEST))))
    for layout, where in (("inline", "inline after each head's bytes (head_dim + 4)"),
                          ("separate", "in float32 scale caches [pages, page_size, H]")):
        rows.append(InputClass(f"per-token-head-{layout}", f"dynamic per-(token, head) scales stored {where} "
                               "(vLLM's fp8_per_token_head, vllm#38378)",
                               tests=(("test_per_token_head", "test_per_token_head_is_bit_exact",
                                       (("layout", layout),)),)))
    for kind in SCALE_KINDS:
        rows.append(InputClass(f"graph-{kind}", f"CUDA-graph capture and replay, scales {KIND_TITLES[kind]}",
                               tests=_graph_tests(kind), needs="cuda"))
    rows.append(InputClass("bigcache", "caches above 2**31 bytes", tests=(("test_bigcache", "*", ()),), needs="cuda"))
    return rows


ROWS = _rows()
PROBE_ROWS = [r for r in ROWS if r.transform is not None]


def argument_rows() -> list[InputClass]:
    """One row per argument-error class of conformance/test_errors.py, and one per float8 cache format beyond
    e4m3 given with no format argument (ALONE_TEST)."""
    from conformance.test_errors import MUTATIONS
    return [*(InputClass(f"arg-{m.name}", m.name, group="argument contract",
                         tests=(("test_errors", "test_invalid_argument_raises_and_writes_nothing",
                                 (("mutation", m.name), ("target", "impl"))),))
              for m in MUTATIONS),
            *(InputClass(f"arg-{module.removeprefix('test_')}-alone", f"{mutation}: written in its format or refused",
                         group="argument contract", tests=((module, ALONE_TEST, ()),))
              for module, mutation in ALONE_MUTATIONS.items())]


# -- the probes ------------------------------------------------------------------------------------

class ProbeFailure(AssertionError):
    """A probe found a defect; `kvfp8_findings` holds the findings (dicts) for the report."""


_FAILURE_TYPES: dict[tuple[str, ...], type[ProbeFailure]] = {}
#: The most sets of defects one row reports apart. A kernel whose every byte is wrong in its own way (bytes
#: added to the slot's old ones) gave 40 to 48 sets a row, each shrunk and then diagnosed (about 150 s a row on
#: the CPU); past this many, a row's new sets are reported with its last one (the diagnosis replays each anyway).
ROW_FAILURE_TYPES = 4
_ROW_KEYS: dict[str, list[tuple[str, ...]]] = {}


def _failure_type(keys: tuple[str, ...], row: str = "") -> type[ProbeFailure]:
    """One exception type per set of defects, so that Hypothesis reports (and shrinks) each apart; at most
    ROW_FAILURE_TYPES a row."""
    seen = _ROW_KEYS.setdefault(row, [])
    if keys not in seen:
        if len(seen) >= ROW_FAILURE_TYPES:
            keys = seen[-1]
        else:
            seen.append(keys)
    if keys not in _FAILURE_TYPES:
        _FAILURE_TYPES[keys] = type("ProbeFailure", (ProbeFailure,), {"keys": keys})
    return _FAILURE_TYPES[keys]


def row_cases(row: InputClass, impl: Implementation, device: torch.device) -> st.SearchStrategy[Case]:
    base = plain_cases(impl, device)

    @st.composite
    def cases(draw: st.DrawFn) -> Case:
        return row.transform(draw(base), draw)
    return cases()


def _fail(impl: Implementation, row: InputClass, case: Case, findings: list[Finding], report: str | None) -> None:
    from conformance.artifacts import save_failure
    report = report or "\n".join(f.title for f in findings)
    saved = save_failure(case, impl, report)
    m = SAVED.search(saved)
    for f in findings:
        f.case_file, f.case_size = (m.group(1) if m else None), case_size(case)
        f.excerpt = f.excerpt or excerpt_of(report)
    keys = tuple(sorted({f.key for f in findings}))
    failure = _failure_type(keys, f"{impl.spec or impl.name}:{row.id}")
    exc = failure(f"{impl.name}: {row.title}: {'; '.join(f.title for f in findings)}\n{report}\n{saved}".rstrip())
    exc.kvfp8_findings = [f.to_dict() for f in findings]
    raise exc


def probe(row: InputClass, impl: Implementation, device: torch.device, examples: int) -> None:
    """Run `examples` Cases of the row; raise ProbeFailure(s) for the defects found, each shrunk."""
    strategy = row_cases(row, impl, device)
    examples = min(examples, row.examples or examples)

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None, report_multiple_bugs=True,
              phases=(Phase.generate, Phase.shrink) if row.shrink else (Phase.generate,),
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(case=strategy)
    def run(case: Case) -> None:
        reason = impl.convention.why_not(case)
        if reason:
            raise Inexpressible(reason)
        findings, report = probe_findings(case, impl, device)
        if findings:
            _fail(impl, row, case, findings, report)

    run()


def probe_findings(case: Case, impl: Implementation, device: torch.device) -> tuple[list[Finding], str | None]:
    """One Case of a probe: its findings, narrowed as a failing property's are (a tiny scale's zeros
    read alike under several explanations), and the byte-diff report."""
    expected, actual, error, before, report = run_case(case, impl, device)
    findings = classify_result(case, expected, actual, error, before)
    narrow(case, impl, device, findings)
    return findings, report


def default_examples(device: torch.device) -> int:
    return 6 if device.type == "cuda" else 4
