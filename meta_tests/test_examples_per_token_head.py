"""examples/vllm_per_token_head.py, vLLM's per-token-head write in plain torch, matches the reference's
per-token-head-vllm recipe byte for byte: whole caches, whole scale caches (guards included), inputs untouched.

Its convention is `vllm-per-token-head` (keyword-only scale caches, 4-D caches, [T, H, D] inputs), detected from
its signature; `--recipe auto` identifies its recipe, and another recipe's arithmetic as that one. Cases come from
strategies.per_token_head with every special head kind.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

import kernel
from conformance.impls import test_device as _test_device  # not collected as a test
from conformance.test_per_token_head import diff
from examples.vllm_per_token_head import reshape_and_cache
from strategies.case import Layout
from strategies.cases import cases
from strategies.per_token_head import build_pth, pth_cases

DEVICE = _test_device()
ROOT = Path(__file__).resolve().parent.parent


@given(data=st.data())
def test_vllm_per_token_head_example_matches_the_reference(data):
    base = cases(size="small", scale_kinds=("none",), recipes=("single",), allow_out_of_range=True,
                 cache_ranks=(4,), input_ranks=(3,), checked=False)
    pc = data.draw(pth_cases(base, modes=("per-token-head-vllm",), layouts=("separate",)), label="pth_case")
    expected, actual = build_pth(pc, DEVICE), build_pth(pc, DEVICE)
    kernel.naive_fp8_set_kv_buffer(**expected.call())
    b = actual.built
    reshape_and_cache(b.k, b.v, b.k_cache, b.v_cache, b.cache_loc, k_scale_cache=actual.k_scale_cache,
                      v_scale_cache=actual.v_scale_cache)
    report = diff(expected.buffers, actual.buffers)
    assert report is None, f"examples/vllm_per_token_head.py differs from the reference:\n{report}"


def _flashinfer(key, value, key_cache, value_cache, slot_mapping, *, k_scale_cache, v_scale_cache):
    """FlashInfer's arithmetic in vLLM's per-token-head convention (the reference, told that recipe)."""
    kernel.naive_fp8_set_kv_buffer(key, value, key_cache, value_cache, slot_mapping, page_size=key_cache.shape[1],
                                   per_token_head="per-token-head-flashinfer", k_scale_cache=k_scale_cache,
                                   v_scale_cache=v_scale_cache)


def test_the_convention_is_detected_and_the_recipe_identified():
    from conformance.conventions import VLLM_PER_TOKEN_HEAD, detect
    from conformance.diagnosis.pth_identification import identify_per_token_head
    from conformance.impls import Implementation
    assert detect(reshape_and_cache) is VLLM_PER_TOKEN_HEAD and detect(_flashinfer) is VLLM_PER_TOKEN_HEAD
    for fn, recipe in ((reshape_and_cache, "per-token-head-vllm"), (_flashinfer, "per-token-head-flashinfer")):
        held, note = identify_per_token_head(Implementation(fn.__name__, fn, convention=VLLM_PER_TOKEN_HEAD), DEVICE)
        assert (held, note.split(":", 1)[0]) == (recipe, "identified"), (fn.__name__, held, note)


def test_a_per_token_head_failure_is_classified_by_where_its_bytes_are():
    from conformance.diagnosis.classify import _per_token_head
    line = "  {} expected 0x32 actual 0x33 at slot=0 head=0 {}"
    assert _per_token_head(line.format("k_cache[3]", "dim=1: token=0 input=1")).key == "per-token-head:values"
    assert _per_token_head(line.format("k_scale_cache[0]", "(its stored scale): token=0")).key == \
        "per-token-head:scales"
    assert _per_token_head(line.format("v_cache[9]", "dim=0: no token writes it")).key == \
        "per-token-head:writes-outside"
    # scale bytes, and nothing but scale bytes or bytes outside the view, wrong: the scales stored in the wrong
    # place, one cause (held-out batch 57)
    scale = line.format("k_scale_cache[17]", "(its stored scale): token=0")
    assert _per_token_head(scale + "\n  k_scale_cache[18] expected 0x58 actual 0x3F outside the view (a gap or "
                           "guard band)").key == "per-token-head:scales-misplaced"
    assert _per_token_head(line.format("v_cache[402]", "inline scale byte 0: token=0") + "\n" +
                           line.format("v_cache[47]", "(its stored scale): no token writes it")).key == \
        "per-token-head:scales-misplaced"
    # stray bytes only in a separate scale cache are a scale store's, beside wrong data (another cause)
    assert _per_token_head(line.format("k_cache[3]", "dim=1: token=0 input=1") + "\n" +
                           line.format("k_scale_cache[47]", "(its stored scale): no token writes it")).key == \
        "per-token-head:scales-misplaced"
    assert _per_token_head(line.format("k_cache[3]", "dim=1: token=0 input=1") + "\n  k_cache[9] expected 0x58 "
                           "actual 0x3F outside the view (a gap or guard band)").key == "per-token-head:writes-outside"
    # the padding property's call has no slot in range: its bytes are outside however they are located
    # (held-out batch 37: padding that stores its scale at slot 0 was a second defect, `:values`)
    padding = "writes with no slot in range (T=1):\nk_scale_cache: 1 of 33 bytes differ; first: [16] expected " \
              "0x0BB772DB actual 0x4002DB6E"
    assert _per_token_head(padding).key == "per-token-head:writes-outside"


def test_a_per_token_head_failure_file_replays(tmp_path, monkeypatch):
    """A PTHCase survives its JSON, and tools.repro replays the saved call: FAIL (exit 1) for a write with no
    floor on its scale, PASS (exit 0) for the example."""
    from conformance.artifacts import save_failure
    from conformance.impls import from_spec
    from strategies.case import Case
    from strategies.per_token_head import PTHCase
    from tools.repro import main
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path))
    source = (ROOT / "examples" / "vllm_per_token_head.py").read_text()
    broken = tmp_path / "no_floor.py"
    floor = "s = torch.maximum(amax / q_max, torch.full_like(amax, 1e-6))"
    assert floor in source
    broken.write_text(source.replace(floor, "s = amax / q_max"))
    case = Case(num_tokens=2, num_heads=2, head_dim=8, page_size=4, num_pages=2, cache_loc=(1, 6), seed=4,
                recipe="single")
    pc = PTHCase(case, "per-token-head-vllm", "separate", Layout.contiguous(3), Layout.contiguous(3),
                 heads=(("k", 0, 1, "zero"),))
    assert PTHCase.from_dict(pc.to_dict()) == pc
    for spec, status in ((f"{broken}:reshape_and_cache", 1), ("examples/vllm_per_token_head.py:reshape_and_cache", 0)):
        saved = save_failure(case, from_spec(spec), "recorded", final=True, extra={"pth_case": pc.to_dict()})
        path = saved.split("failure case saved: ", 1)[1].split("\n", 1)[0]
        assert main([path]) == status, spec


def test_make_identify_names_the_examples_recipe(capsys):
    from tools.identify import main
    assert main(["examples/vllm_per_token_head.py:reshape_and_cache", "--expect", "per-token-head-vllm"]) == 0
    assert "per-token-head-vllm: identified" in capsys.readouterr().out


def test_wrong_scales_beside_misplaced_ones_of_their_layout_are_one_defect():
    """An inline scale stored through an fp32 pointer lands 4 * D bytes on: outside the view for one head, on
    bytes written after it for several (held-out batch 59). The report saw three keys, misplaced scales under
    `dim-multiple:4` and wrong scales with and without it; they are one defect. Wrong scales in the other
    layout, where nothing landed outside, stay a defect of their own."""
    from conformance.diagnosis.classify import Finding
    from conformance.diagnosis.report import _merge_misplaced_scales

    line = "  k_cache[{}] expected 0x6E actual 0xA7 at slot=0 head=0 {}"
    inline = line.format(320, "inline scale byte 0: token=0")
    outside = "  k_cache[512] expected 0x89 actual 0x6E outside the view (a gap or guard band)"
    separate = "  k_scale_cache[3] expected 0x6E actual 0xA7 at slot=3 head=0 (its stored scale): token=1"

    def group(key: str, excerpt: str) -> list:
        return [("t", Finding("per-token-head", key, "?", excerpt=excerpt))]
    host = "per-token-head:scales-misplaced@dim-multiple:4"
    groups = {host: group(host, inline + "\n" + outside), "per-token-head:scales": group("", inline),
              "per-token-head:scales@dim-multiple:4": group("", inline)}
    _merge_misplaced_scales(groups)
    assert sorted(groups) == [host], sorted(groups)
    groups = {host: group(host, inline + "\n" + outside), "per-token-head:scales": group("", separate)}
    _merge_misplaced_scales(groups)
    assert sorted(groups) == ["per-token-head:scales", host], sorted(groups)
