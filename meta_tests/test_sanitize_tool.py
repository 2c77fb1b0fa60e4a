"""tools.sanitize: the verdict it draws from a compute-sanitizer log, and the command it runs."""

from __future__ import annotations

import pytest

from tools.sanitize import KERNEL_FILTER, error_counts, sanitizer_command, sanitizer_env, verdict

CLEAN_MEMCHECK = "========= COMPUTE-SANITIZER\n24 passed in 158.86s\n========= ERROR SUMMARY: 0 errors\n"
CLEAN_RACECHECK = "12 passed in 21.04s\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"


@pytest.mark.parametrize("log", [CLEAN_MEMCHECK, CLEAN_RACECHECK])
def test_a_clean_log_with_passing_tests_is_clean(log: str):
    assert verdict(0, log) == "", f"clean log judged dirty: {verdict(0, log)!r}"


@pytest.mark.parametrize("rc, log, why", [
    (99, "========= Invalid __global__ read of size 2 bytes\n========= ERROR SUMMARY: 3 errors\n", "errors"),
    (0, CLEAN_MEMCHECK + "========= ERROR SUMMARY: 1 error\n", "errors"),  # one sanitized process of two
    (1, CLEAN_MEMCHECK, "exit 1"),  # the tests failed though the sanitizer saw nothing
    (0, "24 passed in 1.00s\n", "no sanitizer summary"),  # it never ran under the sanitizer
    (None, CLEAN_MEMCHECK, "timed out"),
])
def test_anything_else_is_a_failure_that_says_why(rc, log: str, why: str):
    problem = verdict(rc, log)
    assert why in problem, f"exit {rc}: expected a verdict mentioning {why!r}, got {problem!r}"


def test_error_counts_reads_every_summary():
    log = "ERROR SUMMARY: 0 errors\nRACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)\n"
    assert error_counts(log) == [0, 2], f"counts from {log!r}: {error_counts(log)}"


def test_only_the_fused_kernel_is_instrumented_and_the_caching_allocator_is_off():
    cmd = sanitizer_command("memcheck", ["python", "-m", "pytest"])
    assert cmd[:3] == ["compute-sanitizer", "--tool", "memcheck"], cmd
    assert cmd[cmd.index("--kernel-name") + 1] == KERNEL_FILTER == "kns=fp8_kv_write", cmd
    assert cmd[-3:] == ["python", "-m", "pytest"], cmd
    env = sanitizer_env({"PATH": "/usr/bin"})
    assert env == {"PATH": "/usr/bin", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, env
