"""The reproduction tools: failure files, `tools.repro`, `--impl` from any file, `tools.identify`.

These test the machinery a red CI run relies on, end to end: a property fails, its shrunk Case is
written as JSON, the replay rebuilds the same tensors and prints the same report, and the
identifier names the recipe an implementation computes.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conformance.artifacts import FORMAT, load_case
from conformance.harness import check_case
from conformance.impls import FUSED_SPEC, Implementation, from_spec, load_callable, test_device
from kernel import RECIPES
from kernel.backend import hardware_cast_available
from strategies.case import Case, Override
from tools import identify, repro

ROOT = Path(__file__).resolve().parents[1]
BROKEN = f"{ROOT / 'examples' / 'broken_impl.py'}:broken_fp8_set_kv_buffer"
BF16_656 = 0x4424  # 656.0: past 464, so `unfused-nan` wants NaN where the broken write saturates


def _overflow_case() -> Case:
    """One token whose K holds 656.0: the broken demo write gives 0x7E where unfused-nan says 0x7F."""
    return Case(num_tokens=1, num_heads=1, head_dim=16, page_size=3, num_pages=1, cache_loc=(1,),
                recipe="unfused-nan", seed=7, overrides=(Override("k", 5, BF16_656, "past 464"),))


def _replay(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    args = repro._parser().parse_args(list(argv))
    return repro.replay(args.case, args, out=out), out.getvalue()


@pytest.fixture
def failures(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KVFP8_FAILURES", str(tmp_path / "failures"))
    return tmp_path / "failures"


def _saved_file(failures: Path) -> Path:
    files = list(failures.glob("*.json"))
    assert len(files) == 1, f"expected one failure file, found {files}"
    return files[0]


def test_failure_file_holds_everything_and_replays_the_same_report(failures):
    case, impl = _overflow_case(), from_spec(BROKEN)
    with pytest.raises(AssertionError) as info:
        check_case(case, impl, torch.device("cpu"))
    path = _saved_file(failures)
    message = str(info.value)
    assert f"failure case saved: {path}" in message and f"python -m tools.repro {path}" in message, message
    loaded, record = load_case(path)
    assert loaded == case
    assert record["impl"]["spec"] == BROKEN and record["impl"]["kwargs"] == {}
    assert record["test"].endswith("test_failure_file_holds_everything_and_replays_the_same_report")
    assert {"torch", "triton", "hypothesis", "backend", "gpu"} <= set(record["environment"])
    assert "k_cache[" in record["report"] and "expected 0x7F" in record["report"], record["report"]

    rc, out = _replay(str(path), "--device", "cpu")
    assert rc == 1, out
    assert record["report"] in out and "the same as the recorded one" in out, out


def test_replay_options_choose_impl_recipe_and_count(failures):
    with pytest.raises(AssertionError):
        check_case(_overflow_case(), from_spec(BROKEN), torch.device("cpu"))
    path = str(_saved_file(failures))
    # The broken write saturates, which is what `unfused` asks for: held to it, the case passes.
    rc, out = _replay(path, "--recipe", "unfused", "--device", "cpu")
    assert rc == 0 and "PASS" in out, out
    rc, out = _replay(path, "--impl", FUSED_SPEC, "--encoder", "software", "--device", test_device().type)
    assert rc == 0 and "PASS" in out, out
    rc, out = _replay(path, "-n", "0", "--device", "cpu")
    assert rc == 1 and "1 of" in out and "first 0:" in out, out


@pytest.mark.skipif(hardware_cast_available(torch.device("cuda")) if torch.cuda.is_available() else False,
                    reason="this machine has the hardware cast: a hardware case replays on it unchanged")
def test_hardware_case_replays_on_the_software_encoder_and_says_so(tmp_path):
    record = {"format": FORMAT, "case": _overflow_case().to_dict(), "report": "recorded on a GPU",
              "impl": {"name": "fused-hardware", "spec": FUSED_SPEC, "kwargs": {"encoder": "hardware"}},
              "environment": {"gpu": "NVIDIA H200"}}
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(record))
    rc, out = _replay(str(path))
    assert rc == 0, out
    assert "failed on the hardware e4m3 encoder (NVIDIA H200)" in out, out
    assert "{'encoder': 'software'}" in out and "specific to the hardware cast" in out, out
    assert repro.main([str(path), "--encoder", "hardware"]) == 2  # no hardware cast here: usage error


def test_format_1_file_is_refused_with_the_reason(tmp_path, capsys):
    """Format 1 seeded values with torch's CPU generator; rebuilding them now would give other bytes."""
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": 1, "case": _overflow_case().to_dict()}))
    assert repro.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert "format-1" in err and "cannot be rebuilt" in err, err


def test_impl_from_a_file_anywhere(tmp_path, monkeypatch):
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "helper.py").write_text("from kernel import naive_fp8_set_kv_buffer as write\n")
    (folder / "impl.py").write_text("from helper import write\n\ndef fn(*args, **kwargs):\n"
                                    "    write(*args, **kwargs)\n")
    monkeypatch.chdir(tmp_path)  # a relative spec resolves against the working directory
    impl = from_spec("x/impl.py:fn")
    assert impl.spec == f"{folder / 'impl.py'}:fn"
    check_case(_overflow_case(), impl, torch.device("cpu"))  # the reference itself: bit-exact
    with pytest.raises(ValueError, match="no callable named 'nope'"):
        load_callable(f"{folder / 'impl.py'}:nope")
    with pytest.raises(ValueError, match="no such file"):
        load_callable(f"{folder / 'missing.py'}:fn")


def test_an_impl_that_raises_fails_its_case_with_the_error(failures):
    def crashes(*args, **kwargs):
        raise RuntimeError("kernel failed to compile: out of registers")

    with pytest.raises(AssertionError) as info:
        check_case(_overflow_case(), Implementation("crashes", crashes), torch.device("cpu"))
    assert "crashes raised RuntimeError: kernel failed to compile: out of registers" in str(info.value)
    assert "failure case saved" in str(info.value)


def test_red_pytest_run_writes_one_case_that_replays(tmp_path):
    """A whole red run, as CI sees it: the path and the replay command are in pytest's output."""
    env = {**os.environ, "KVFP8_FAILURES": str(tmp_path / "failures"), "HYPOTHESIS_PROFILE": "ci",
           "KVFP8_HYPOTHESIS_DB": str(tmp_path / "db")}
    env.pop("PYTEST_XDIST_WORKER", None)
    env["OMP_NUM_THREADS"] = "1"  # one process on a busy machine: no intra-op thread spin
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "conformance/test_bit_exact.py",
         "--impl", BROKEN, "--recipe", "unfused-nan"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    path = _saved_file(tmp_path / "failures")
    assert f"failure case saved: {path}" in out and f"python -m tools.repro {path}" in out, out
    assert "kvfp8 failure cases" in out, out  # the terminal summary lists it again
    case, record = load_case(path)
    assert case.recipe == "unfused-nan", "--recipe did not reach the strategy"
    rc, replayed = _replay(str(path), "--device", "cpu")
    assert rc == 1 and "the same as the recorded one" in replayed, replayed


# -- identify ----------------------------------------------------------------------------------
# CPU CI sweeps one dtype (quick: 2 interpreted calls a recipe); CUDA sweeps everything.

@pytest.mark.parametrize("recipe", list(RECIPES))
def test_identify_names_the_recipe_the_fused_kernel_is_forced_to(recipe):
    impl = from_spec(FUSED_SPEC, {"encoder": "software", "recipe": recipe})
    res = identify.identify(impl, identify.sweep_points(["bfloat16"], full=False), test_device())
    assert not res.errors, res.errors
    assert res.matches() == [recipe], {r: res.count(r) for r in RECIPES}


def test_identify_says_how_the_broken_demo_deviates():
    res = identify.identify(from_spec(BROKEN), identify.sweep_points(["bfloat16", "float16"], full=False),
                            torch.device("cpu"))
    out = io.StringIO()
    identify.report(res, from_spec(BROKEN), torch.device("cpu"), 3, out=out)
    text = out.getvalue()
    assert res.matches() == [] and res.closest() == "divide", text
    # Its only deviation from `divide`: torch keeps a negative NaN's sign, the contract drops it.
    assert "NaN sign" in text and "expected 0x7F (nan) actual 0xFF (nan)" in text, text


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the full sweep is a CUDA-runner test")
@pytest.mark.parametrize("encoder", ["hardware", "software"])
def test_identify_full_sweep_on_cuda(encoder):
    device = torch.device("cuda")
    if encoder == "hardware" and not hardware_cast_available(device):
        pytest.skip("the hardware e4m3 cast needs sm_89 or newer")
    points = identify.sweep_points(["bfloat16", "float16"], full=True)
    for recipe in RECIPES:
        impl = from_spec(FUSED_SPEC, {"encoder": encoder, "recipe": recipe})
        res = identify.identify(impl, points, device)
        out = io.StringIO()
        identify.report(res, impl, device, 8, out=out)
        assert res.matches() == [recipe], out.getvalue()
