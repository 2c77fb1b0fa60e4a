"""tools.fuzz: its plan (hubs, GPUs, processes), its defaults, and the HypoFuzz fixes it applies."""

from __future__ import annotations

import pytest

from tools import fuzz


def test_one_pinned_hub_per_process_on_gpus_round_robin():
    assert fuzz.plan(3, ["4", "6"]) == [(1, {"CUDA_VISIBLE_DEVICES": "4"}), (1, {"CUDA_VISIBLE_DEVICES": "6"}),
                                        (1, {"CUDA_VISIBLE_DEVICES": "4"})]


def test_one_hub_with_every_process_on_the_cpu():
    assert fuzz.plan(8, []) == [(8, {})]


def test_every_property_module_and_nothing_else():
    modules = fuzz.property_modules()
    assert "conformance/test_bit_exact.py" in modules and "conformance/test_isolation.py" in modules
    assert "conformance/test_exhaustive.py" not in modules, "a parametrized sweep, not a property"


def test_defaults_one_process_per_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    monkeypatch.setenv("KVFP8_GPU_COUNT", "4")
    args, pytest_args = fuzz.parse(["--minutes", "5", "--", "-k", "ties"])
    assert (args.processes, args.devices, args.profile) == (4, ["0", "1", "2", "3"], "thorough")
    assert pytest_args[-2:] == ["-k", "ties"] and "conformance/test_ties.py" in pytest_args


def test_defaults_one_process_per_core_under_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KVFP8_GPU_COUNT", "4")
    monkeypatch.setattr(fuzz.os, "cpu_count", lambda: 6)
    args, _ = fuzz.parse([])
    assert (args.processes, args.devices) == (6, [])


def test_the_ci_profile_is_refused(capsys):
    with pytest.raises(SystemExit):
        fuzz.parse(["--profile", "ci"])
    assert "derandomized" in capsys.readouterr().err


def test_hub_environment(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(fuzz.os, "cpu_count", lambda: 16)
    env = fuzz.hub_env("thorough", {"CUDA_VISIBLE_DEVICES": "3"}, 4)
    assert "PYTEST_XDIST_WORKER" not in env
    assert (env["HYPOTHESIS_PROFILE"], env["CUDA_VISIBLE_DEVICES"], env["OMP_NUM_THREADS"]) == ("thorough", "3", "4")


def test_boot_script_compiles():
    compile(fuzz.BOOT, "<boot>", "exec")


def test_hypofuzz_fixes_apply_once():
    pytest.importorskip("hypofuzz")
    import hypofuzz.coverage as coverage
    from hypofuzz.hypofuzz import FuzzTarget
    from hypothesis.internal.conjecture.data import ConjectureData

    fuzz.hypofuzz_compat()
    enter = FuzzTarget._enter_fixtures
    fuzz.hypofuzz_compat()
    assert FuzzTarget._enter_fixtures is enter, "wrapped twice"
    assert coverage.should_trace(str(fuzz.ROOT / "kernel" / "fused.py"))
    assert not coverage.should_trace(str(fuzz.ROOT / "strategies" / "_cache.py"))
    data = ConjectureData.for_choices([])
    data.slice_comments = {None: "comment"}  # HypoFuzz's spelling reaches Hypothesis's
    assert data.span_comments == {None: "comment"}


def test_markdown_summary():
    summary = {"campaign": {"started": "now", "seconds": 100.0, "processes": 2, "devices": [], "profile": "thorough",
                            "hub_restarts": [0]},
               "fuzzed": ["a", "b"], "not_fuzzed": {"c": "skipif"},
               "workers": {"w1" * 8: {"examples": 300, "seconds_in_tests": 90.0, "tests": ["a"]},
                           "w2" * 8: {"examples": 100, "seconds_in_tests": 80.0, "tests": ["a", "b"]}},
               "failures": [{"test": "a", "shrunk": 1, "unshrunk": 2, "found_after_s": 12, "error": "E at f:1",
                             "example": ""}],
               "skipped": [{"test": "c", "error": "Skipped: CUDA only"}], "extra_args": ["--impl", "x.py:f"]}
    text = fuzz.markdown(summary)
    assert "| all (2 at a time) | 400 | 2.00 a process | 2 |" in text, text
    assert "`a` (1 shrunk, 2 unshrunk; first reported 12 s in): E at f:1" in text, text
    assert "Skipped, not failures (HypoFuzz stores a skip like a failing example): `c`" in text, text
    assert "python -m pytest -p no:cacheprovider TEST --impl x.py:f`" in text, text


def test_a_stored_skip_is_not_a_failure():
    assert fuzz._is_skip("Skipped: the custom op wraps this repository's kernel")
    assert fuzz._is_skip("_pytest.outcomes.Skipped: needs CUDA")
    assert not fuzz._is_skip("ConformanceFailure[bytes]: fused-hardware: differs from the reference")
    assert not fuzz._is_skip("")


def test_replay_command_carries_the_database_and_the_campaigns_pytest_args(monkeypatch):
    monkeypatch.setenv("KVFP8_HYPOTHESIS_DB", "/tmp/rare db")
    cmd = fuzz.replay_command("conformance/test_bit_exact.py::test_bit_exact[x-unfused]",
                              ["--impl", "meta_tests/rare_defect_impl.py:fused_fp8_set_kv_buffer"])
    assert cmd == ("KVFP8_HYPOTHESIS_DB='/tmp/rare db' HYPOTHESIS_PROFILE=dev python -m pytest -p no:cacheprovider "
                   "'conformance/test_bit_exact.py::test_bit_exact[x-unfused]' "
                   "--impl meta_tests/rare_defect_impl.py:fused_fp8_set_kv_buffer")
