"""The defect corpus (examples/defects/): its catalogue is consistent, and each catalogued defect is real and
singular, shown cheaply, without the report machinery.

- The catalogue: every file exists and its function has its convention's exact signature; every base has a
  control; there are enough single defects and pairs; every docstring names its defects; every variant is its
  base with a small change; the README holds the catalogue's table.
- Real and singular: each file runs on tiny hand-picked Cases (T <= 3, H <= 3, D <= 16): the plain Case, and the
  plain Case with one input dimension changed (TRIGGERS). A defect fails exactly the Cases of its trigger, the
  way its effect says (wrong bytes, a raise of its type, a modified input); every other Case passes, and a
  control passes them all. The plain Case here holds seeded values and scales of 0.3, so a defect whose trigger
  is only value dimensions (`values`, `scale-value`) or `plain` fails it. Defects that need a GPU (a host sync
  under graph capture, caches past 2**31 bytes, an approximate division) have CUDA-only tests.

`expected_report_keys(entry)` is not a test: it gives the keys a conformance report of the entry should list
(tools/corpus.py compares reports with the catalogue by its own `expected_key`, which also leaves the value
dimensions out of a value effect's key).
"""

from __future__ import annotations

import ast
import difflib
import functools
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from conformance.conventions import get_convention
from conformance.harness import ConformanceFailure, check_case, execute
from conformance.impls import Implementation, from_spec
from conformance.impls import test_device as _test_device  # not collected as a test
from examples.defects import catalogue as cat
from strategies.build import build
from strategies.case import Case, Layout, Override, Scale

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "examples" / "defects"
DEVICE = _test_device()
INTERPRETED = DEVICE.type == "cpu"  # Triton files run under the interpreter
CUDA = pytest.mark.skipif(DEVICE.type != "cuda", reason="needs CUDA")

SIGNATURES = {  # the exact signatures of the conventions, as (name, default) pairs
    "sglang": (("k", None), ("v", None), ("k_cache", None), ("v_cache", None), ("cache_loc", None),
               ("k_scale", None), ("v_scale", None), ("page_size", 16), ("use_triton", True)),
    "vllm": (("key", None), ("value", None), ("key_cache", None), ("value_cache", None), ("slot_mapping", None),
             ("kv_cache_dtype", None), ("k_scale", None), ("v_scale", None)),
}
_NO_DEFAULT = {"sglang": ("k", "v", "k_cache", "v_cache", "cache_loc"), "vllm": tuple(n for n, _ in SIGNATURES["vllm"])}

#: The report's vocabulary (docs/conformance.md; the lead may still rename some).
EFFECTS = re.compile(
    r"rounding:(unfused|unfused-nan|unfused-tensor0d|unfused-tensor1|single|divide)|scale:(ignored|swapped|inverted)"
    r"|flush-to-zero|rounds-toward-zero|approximate-division|off-by-one-ulp"
    r"|encoding:(nan-sign|nan-past-448|saturates)|zero-sign:(plus|minus)"
    r"|strides:(inputs-ignored|inputs-heads-ignored|cache-loc-ignored|other-cache|other-input|cache-ignored"
    r"|cache-page-stride|cache-inner-stride)|kv-mixed:(caches-swapped|inputs-swapped|k-for-v|v-for-k)"
    r"|padding:(wraps-to-end|slot-0)|out-of-range:written|storage:value-cast|raises:\w+|crash|graph:sync"
    r"|overrun:(tile|rows)|subnormal-grid:-?\d+|subnormal-shift|subnormal-path|exponent-bias:\d+|input-modified|big-cache:wrong-offsets|wrong-bytes:unexplained|wrong-slot:(unwritten|unexplained|tokens-moved)")
TRIGGER_WORDS = {"plain", "strided-input", "input-layouts-differ", "strided-loc", "strided-cache",
                 "cache-layouts-differ", "cache-uint8", "cache-3d", "input-2d", "input-float16", "input-float32",
                 "loc-int32", "heads-not-pow2", "dim-not-pow2", "dim-not-multiple:8", "dim-not-multiple:32",
                 "page-size", "scale-kind:none", "scale-kind:float", "scale-kind:tensor0d",
                 "scale-kind:tensor1", "scale-value", "scales-differ", "special-values", "padding", "out-of-range",
                 "duplicate-slots", "big-cache", "empty-batch", "many-tokens", "tokens-above:256", "values",
                 "padded-keys"}
#: Dimensions the plain Case here holds already (seeded values, a non-dyadic scale): a trigger made of these
#: alone fails the plain Case. (The report's plain call has ordinary values and scales 1.0.)
HELD_BY_PLAIN = {"plain", "values", "scale-value", "dim-not-multiple:32"}  # D = 16 is no multiple of 32

#: Effects only a GPU shows: their entries get the CUDA-only tests below, and the CPU matrix treats them as absent.
CUDA_ONLY_EFFECTS = {"graph:sync", "big-cache:wrong-offsets", "approximate-division"}

# -- the Cases ------------------------------------------------------------------------------------------------

SCALE = 0.3  # non-dyadic: every recipe, and every wrong use of a scale, gives other bytes
_SPECIALS = (("+0", 0x0000), ("-0", 0x8000), ("+inf", 0x7F80), ("-inf", 0xFF80), ("+nan", 0x7FC0),
             ("-nan", 0xFFC0))  # bfloat16 bits


def plain_case(recipe: str) -> Case:
    """The plain call: contiguous bf16 [T, H, D] input, 4-D fp8 cache (page_size 4), int64 cache_loc naming
    slot 0 among others (the controls' slot-0 trick is exercised), H and D powers of two, both scales
    1-element tensors of one non-dyadic value."""
    return Case(num_tokens=3, num_heads=2, head_dim=16, page_size=4, num_pages=2, cache_loc=(5, 0, 2),
                k_scale=Scale("tensor1", SCALE), v_scale=Scale("tensor1", SCALE), seed=11, recipe=recipe)


def _both_scales(kind: str) -> Callable[[Case], Case]:
    value = 1.0 if kind == "none" else SCALE
    return lambda c: c.replace(k_scale=Scale(kind, value), v_scale=Scale(kind, value))


_PADDED_DIM = Layout((0, 1, 2, 3), (0, 0, 0, 4))  # a cache whose heads are not contiguous (dim padded)
#: trigger -> the plain Case with that one input dimension changed.
TRIGGERS: dict[str, Callable[[Case], Case]] = {
    "plain": lambda c: c,
    "padding": lambda c: c.replace(cache_loc=(5, -1, 2)),  # slot 0 not named: a write there is the padding's
    "out-of-range": lambda c: c.replace(cache_loc=(5, 9, 2)),  # 8 slots
    "padded-keys": lambda c: c.replace(padded_rows=2),  # vLLM's CUDA-graph padding: keys past slot_mapping's end
    "scales-differ": lambda c: c.replace(v_scale=Scale("tensor1", 0.7)),
    "special-values": lambda c: c.replace(overrides=tuple(Override(t, 3 + i, bits, label) for t in "kv"
                                                          for i, (label, bits) in enumerate(_SPECIALS))),
    "scale-kind:none": _both_scales("none"),
    "scale-kind:float": _both_scales("float"),
    "scale-kind:tensor0d": _both_scales("tensor0d"),
    "input-float16": lambda c: c.replace(input_dtype="float16"),
    "input-float32": lambda c: c.replace(input_dtype="float32"),
    "cache-uint8": lambda c: c.replace(cache_dtype="uint8"),
    "loc-int32": lambda c: c.replace(loc_dtype="int32"),
    "input-2d": lambda c: c.replace(input_rank=2),
    "cache-3d": lambda c: c.replace(cache_rank=3),
    "page-size": lambda c: c.replace(page_size=3, num_pages=3),
    "strided-input": lambda c: c.replace(k_layout=Layout((0, 1, 2), (0, 0, 3)), v_layout=Layout((1, 0, 2), (0, 1, 2))),
    "input-layouts-differ": lambda c: c.replace(v_layout=Layout((0, 1, 2), (0, 1, 0))),  # V's heads padded
    "strided-loc": lambda c: c.replace(loc_step=2),
    "strided-cache": lambda c: c.replace(k_cache_layout=_PADDED_DIM, v_cache_layout=_PADDED_DIM),
    "cache-layouts-differ": lambda c: c.replace(v_cache_layout=Layout((0, 1, 2, 3), (0, 1, 0, 0))),
    "heads-not-pow2": lambda c: c.replace(num_heads=3),
    "dim-not-pow2": lambda c: c.replace(head_dim=12),
    "dim-not-multiple:8": lambda c: c.replace(head_dim=20),
    "empty-batch": lambda c: c.replace(num_tokens=0, cache_loc=()),
    "tokens-above:256": lambda c: c.replace(num_tokens=257, num_pages=65, cache_loc=tuple(range(1, 258))),
}
#: Triggers whose Case is costly under Triton's interpreter (a program per token): a Triton file runs them only
#: when one of its own defects needs them.
COSTLY = {"tokens-above:256"}
#: A defect of this trigger may show in these other triggers' Cases too (their Case holds the trigger's change:
#: caches laid out differently are strided caches; the strided-input Case has inputs laid out differently; D of 12
#: and of 20 are neither powers of two nor multiples of 8).
MAY_ALSO_FAIL = {"strided-cache": {"cache-layouts-differ"}, "strided-input": {"input-layouts-differ"},
                 "input-layouts-differ": {"strided-input"}, "dim-not-multiple:8": {"dim-not-pow2"},
                 "dim-not-pow2": {"dim-not-multiple:8"},
                 # a defect of a few rare inputs shows among 257 tokens' seeded values by chance (an approximate
                 # division met a tie there on an H100)
                 "special-values": {"tokens-above:256"}}

# -- running a file on a Case ---------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _failures_in_tmp(tmp_path, monkeypatch):
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path / "failures"))


def implementation(entry: cat.Entry) -> Implementation:
    """The entry's file in its catalogued convention (an opt-in one where it names it)."""
    return _loaded(cat.spec(entry), entry["opt_in"])


@functools.cache
def _loaded(spec: str, convention: str) -> Implementation:
    return from_spec(str(ROOT / spec), convention=get_convention(convention) if convention else None)


def modified_inputs(impl: Implementation, case: Case) -> list[str]:
    """The inputs (k, v, cache_loc, scale tensors) whose buffers a call changed."""
    built = build(case, DEVICE)
    before = built.snapshot()
    execute(impl, built)
    return [name for name, old in before.items() if name not in ("k_cache", "v_cache")
            and not torch.equal(old.reshape(-1).view(torch.uint8), built.buffers[name].reshape(-1).view(torch.uint8))]


def outcome(impl: Implementation, case: Case) -> str:
    """'' when the call conforms on the Case; else 'bytes', 'raises:<Type>' or 'input-modified:<names>'."""
    try:
        check_case(case, impl, DEVICE)
    except ConformanceFailure as exc:
        name = type(exc).__name__  # ConformanceFailure[bytes] or ConformanceFailure[<exception type>]
        kind = name[name.find("[") + 1:-1] if "[" in name else "bytes"
        return "bytes" if kind == "bytes" else f"raises:{kind}"
    changed = modified_inputs(impl, case)
    return f"input-modified:{','.join(changed)}" if changed else ""


def expected_outcome(effects: list[str]) -> str:
    """What `outcome` gives for a Case that shows these effects (one trigger's): 'input-modified' stands for
    any 'input-modified:<names>'."""
    raises = [e for e in effects if e.startswith("raises:")]
    if raises:
        return raises[0]
    if all(e == "input-modified" for e in effects):
        return "input-modified"
    return "bytes"


def case_dims(trigger: str) -> tuple[str, ...]:
    """The dimensions of a trigger that the plain Case here does not hold: what its Case changes."""
    return tuple(sorted(t for t in trigger.split("+") if t not in HELD_BY_PLAIN))


def triggered(plain: Case, dims: tuple[str, ...]) -> Case:
    for dim in dims:
        plain = TRIGGERS[dim](plain)
    return plain


def visible_defects(entry: cat.Entry) -> tuple[tuple[str, str], ...]:
    """The entry's (effect, trigger) pairs that tiny Cases show on this device."""
    return tuple((e, t) for e, t in cat.effects(entry, interpreted=INTERPRETED) if e not in CUDA_ONLY_EFFECTS)


def expected_report_keys(entry: cat.Entry, interpreted: bool = False) -> set[str]:
    """NOT YET ENABLED (no test calls it): the `effect@trigger` keys a conformance report of the entry should
    list outside the argument contract, as the catalogue spells them. For comparing a report's keys (less its
    `validation:*` ones) with the catalogue: precision and recall of the report over the corpus."""
    return {f"{effect}@{trigger}" for effect, trigger in cat.effects(entry, interpreted)}


def _id(entry: cat.Entry) -> str:
    return entry["file"].removesuffix(".py")


def _is_triton(entry: cat.Entry) -> bool:
    return entry["base"].startswith("triton")


def _matrix_params() -> list:
    """Every entry; Triton files on CUDA compile a kernel per Case: marked slow there."""
    slow = DEVICE.type == "cuda"
    return [pytest.param(e, id=_id(e), marks=[pytest.mark.slow] if slow and _is_triton(e) else [])
            for e in cat.CATALOGUE]


# -- the catalogue ----------------------------------------------------------------------------------------------


def _docstring(entry: cat.Entry) -> str:
    return ast.get_docstring(ast.parse((CORPUS / entry["file"]).read_text())) or ""


@pytest.mark.parametrize("entry", cat.CATALOGUE, ids=_id)
def test_file_has_its_conventions_exact_signature(entry):
    impl = _loaded(cat.spec(entry), "")  # as its signature declares
    assert impl.convention.name == entry["convention"]
    params = inspect.signature(impl.fn).parameters
    got = tuple((n, None if p.default is inspect.Parameter.empty else p.default) for n, p in params.items())
    assert got == SIGNATURES[entry["convention"]], f"{entry['file']}: {inspect.signature(impl.fn)}"
    assert all(p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params.values())
    assert all(params[n].default is inspect.Parameter.empty for n in _NO_DEFAULT[entry["convention"]])
    assert cat.BASES[entry["base"]] == (entry["convention"], entry["function"], entry["recipe"])


def test_catalogue_covers_the_corpus():
    files = {e["file"] for e in cat.CATALOGUE}
    assert len(files) == len(cat.CATALOGUE), "a file catalogued twice"
    on_disk = {p.name for p in CORPUS.glob("*.py")} - {"catalogue.py"}
    assert on_disk == files, f"not catalogued: {sorted(on_disk - files)}; missing: {sorted(files - on_disk)}"
    assert {e["base"] for e in cat.controls()} == set(cat.BASES), "every base has a control"
    assert all(e["file"] == f"{e['base']}.py" for e in cat.controls())
    singles, pairs = cat.singles(), cat.pairs()
    assert len(singles) >= 24 and len(pairs) >= 6, (len(singles), len(pairs))
    assert len(cat.controls()) + len(singles) + len(pairs) == len(cat.CATALOGUE)
    for group in (singles, pairs):
        assert {e["convention"] for e in group} == {"sglang", "vllm"}
        assert {_is_triton(e) for e in group} == {True, False}  # torch and Triton
    for e in pairs:
        assert len({t for _, t in e["defects"]}) == 2, f"{e['file']}: a pair's defects need different triggers"
    for e in cat.CATALOGUE:
        assert e["needs"] in ("cpu", "cuda")
        assert e["models"], e["file"]
        for effect, trigger in e["defects"]:
            assert EFFECTS.fullmatch(effect), f"{e['file']}: effect {effect!r} not in the report's vocabulary"
            unknown = set(trigger.split("+")) - TRIGGER_WORDS
            assert not unknown, f"{e['file']}: trigger {trigger!r}: {unknown} not in the report's vocabulary"
        if any(effect in CUDA_ONLY_EFFECTS for effect, _ in e["defects"]):
            assert e["needs"] == "cuda", e["file"]


def test_readme_holds_the_catalogue_table():
    assert cat.markdown() in (CORPUS / "README.md").read_text(), \
        "regenerate the table: python -m examples.defects.catalogue --markdown"


@pytest.mark.parametrize("entry", cat.CATALOGUE, ids=_id)
def test_docstring_names_the_defect(entry):
    doc = _docstring(entry)
    if not entry["defects"]:
        assert doc.startswith(f"Control (base `{entry['base']}`)"), doc[:80]
        assert "DEFECT" not in (CORPUS / entry["file"]).read_text()
        return
    count = "ONE defect" if entry["causes"] == 1 else "TWO independent defects"
    assert f"examples/defects/{entry['base']}.py (recipe `{entry['recipe']}`) with {count}" in doc, doc[:200]
    flat = " ".join(doc.split())
    for key in sorted(expected_report_keys(entry)):
        assert f"`{key}`" in flat, f"{entry['file']}: the docstring does not name {key}"
    assert " ".join(entry["models"].split()) in flat, f"{entry['file']}: the docstring does not say what it models"


def _code(path: Path) -> list[str]:
    """The file's lines after its module docstring."""
    text = path.read_text()
    return text.splitlines()[ast.parse(text).body[0].end_lineno:]


@pytest.mark.parametrize("entry", [e for e in cat.CATALOGUE if e["defects"]], ids=_id)
def test_variant_is_its_base_with_a_small_change(entry):
    base, variant = _code(CORPUS / f"{entry['base']}.py"), _code(CORPUS / entry["file"])
    changed = [line for line in difflib.unified_diff(base, variant, n=0, lineterm="")
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert 0 < len(changed) <= 12, "\n".join(changed)
    markers = [line for line in changed if line.startswith("+") and "# DEFECT" in line]
    assert len(markers) >= entry["causes"], f"{entry['file']}: mark each changed place with `# DEFECT`"


# -- real and singular --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", _matrix_params())
def test_defect_shows_exactly_under_its_trigger(entry):
    """Each Case of TRIGGERS (and each multi-dimension trigger's Case) through the file: the defects fail
    exactly the Cases of their triggers, as their effects say; everything else (the plain call included)
    passes. A control passes every Case. A defect of the plain Case fails it (and so nearly every Case)."""
    impl = implementation(entry)
    plain = plain_case(entry["recipe"])
    by_dims: dict[tuple[str, ...], list[str]] = {}
    for effect, trigger in visible_defects(entry):
        by_dims.setdefault(case_dims(trigger), []).append(effect)
    if () in by_dims:  # it fails the plain Case here, so (nearly) every Case
        want = expected_outcome(by_dims[()])
        got = outcome(impl, plain)
        assert got.startswith(want), f"{entry['file']}: the plain Case gave {got or 'a pass'!r}, expected {want!r}"
        return
    own = {d for dims in by_dims for d in dims}
    # a defect tiny Cases are not held to (CUDA_ONLY_EFFECTS) may still show in its trigger's Cases
    unheld = {d for e, t in cat.effects(entry, interpreted=INTERPRETED) if e in CUDA_ONLY_EFFECTS
              for d in case_dims(t)}
    tolerated = unheld.union(*(MAY_ALSO_FAIL.get(d, set()) for d in own | unheld))
    cases = [(dim,) for dim in TRIGGERS if dim not in COSTLY or dim in own or not (INTERPRETED and _is_triton(entry))]
    cases += [dims for dims in by_dims if len(dims) > 1]
    seen, wrong = {}, {}
    for dims in cases:
        case = triggered(plain, dims)
        if impl.convention.why_not(case):
            continue
        got = seen[dims] = outcome(impl, case)
        if dims in by_dims:
            want = expected_outcome(by_dims[dims])
        elif set(dims) & tolerated:
            continue
        else:
            want = ""
        if not (got.startswith(want) if want else got == ""):
            wrong["+".join(dims)] = f"got {got or 'a pass'!r}, expected {want or 'a pass'!r}"
    assert set(by_dims) <= set(seen), f"triggers without a Case here: {set(by_dims) - set(seen)}"
    assert not wrong, f"{entry['file']}: " + "; ".join(f"{t}: {w}" for t, w in wrong.items())


# -- the defects only a GPU shows ---------------------------------------------------------------------------------


def _cuda_entries(effect: str) -> list:
    """The entries with this CUDA-only effect, and the controls of their bases."""
    with_it = [e for e in cat.CATALOGUE if any(x == effect for x, _ in e["defects"])]
    bases = {e["base"] for e in with_it}
    return [pytest.param(e, id=_id(e)) for e in cat.controls() if e["base"] in bases] + \
        [pytest.param(e, id=_id(e)) for e in with_it]


@CUDA
@pytest.mark.parametrize("entry", _cuda_entries("graph:sync") + [pytest.param(e, id=_id(e)) for e in cat.controls()
                                                                if e["base"] != "torch_vllm"])
def test_graph_capture(entry):
    """A control captures and replays in a CUDA graph; a file with a host sync fails the capture."""
    from conformance.test_graphs import captured, check_replay
    impl = implementation(entry)
    case = plain_case(entry["recipe"])
    syncs = any(e == "graph:sync" for e, _ in entry["defects"])
    if syncs:
        with pytest.raises(ConformanceFailure, match="synchroniz|capture"):
            captured(impl, case, DEVICE)
        return
    built, graph, pristine = captured(impl, case, DEVICE)
    graph.replay()
    check_replay(impl, built, pristine, DEVICE, "replay of the captured call")


@CUDA
@pytest.mark.parametrize("entry", _cuda_entries("big-cache:wrong-offsets"))
def test_big_cache(entry, tmp_path):
    """A cache past 2**31 bytes written at its last slots (tools.repro, in a subprocess: a wrapped offset may
    be an illegal address, which ends a process)."""
    from conformance.test_bigcache import _big_case, _need_free
    _need_free(10)
    path = tmp_path / "big.json"
    path.write_text(_big_case("float8_e4m3fn", "int64", 4, entry["recipe"]).to_json())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run([sys.executable, "-m", "tools.repro", str(path), "--impl", str(ROOT / cat.spec(entry))],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    log = done.stdout[-3000:] + done.stderr[-3000:]
    if entry["defects"]:
        assert done.returncode == 1 and "FAIL" in done.stdout, log
    else:
        assert done.returncode == 0, log


#: bf16 inputs and fp32 scales whose IEEE quotient and Triton's approximate `/` (CUDA, sm_90, Triton 3.6) round to
#: different e4m3 bytes: found by sweeping every positive finite bf16 through both divisions at 4,007 scales on an
#: H200, where these two were the only ones. Both sit at the tie 7.5 * 2**-9 between e4m3's largest subnormal and
#: smallest normal: 0x3B90 / 0.3 is just below it in IEEE (0x07) and on it approximately (ties to even: 0x08);
#: 0x3CCC / 1.7 the other way round.
APPROX_INPUTS = ((0x3B90, 0.3), (0x3CCC, 1.7))


@CUDA
@pytest.mark.parametrize("bits, scale", APPROX_INPUTS)
@pytest.mark.parametrize("entry", _cuda_entries("approximate-division"))
def test_approximate_division(entry, bits, scale):
    """The plain call with a few inputs next to an e4m3 rounding tie (and its scale) tells `/` from `div_rn`."""
    case = plain_case(entry["recipe"]).replace(
        k_scale=Scale("tensor1", scale), v_scale=Scale("tensor1", scale),
        overrides=tuple(Override(t, i, bits, "next to an e4m3 tie") for t in "kv" for i in range(4)))
    got = outcome(implementation(entry), case)
    assert got == ("bytes" if entry["defects"] else ""), got
