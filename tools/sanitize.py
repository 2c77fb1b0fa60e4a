"""Run conformance properties under compute-sanitizer (memcheck, racecheck); any error fails.

    python -m tools.sanitize [--tool memcheck,racecheck] [--profile ci] [--timeout S] [--dry-run] [TEST ...]

Only the fused kernel is instrumented (`--kernel-name kns=fp8_kv_write`): torch's own kernels (the
reference, the case builder, the byte diff) are not the product, and instrumenting each of their
launches made a ci-sized test many times slower (docs/results/kernel-design-2026-12-02.md). The
caching allocator is off, so memcheck
sees every tensor's true bounds (inside a cached 2 MiB segment, a read past a tensor's end is not
an error). Logs go to $OUT/sanitize-<tool>.log (else reports/). Exit status 0 only when pytest
passed and every sanitizer summary in the log reports 0 errors; the last lines of each log and a
one-line verdict are printed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tools._cli import comma_list, out_dir, parser

ROOT = Path(__file__).resolve().parent.parent
KERNEL_FILTER = "kns=fp8_kv_write"
TESTS = {
    "memcheck": ["conformance/test_bit_exact.py", "conformance/test_isolation.py"],
    # racecheck looks for shared-memory hazards: the plain bit-exact property exercises every tile.
    "racecheck": ["conformance/test_bit_exact.py"],
}
SUMMARY = re.compile(r"(?:ERROR|RACECHECK) SUMMARY: (\d+)")


def sanitizer_command(tool: str, argv: list[str]) -> list[str]:
    """`argv` under compute-sanitizer's `tool`, instrumenting only the fused kernel."""
    return ["compute-sanitizer", "--tool", tool, "--kernel-name", KERNEL_FILTER,
            "--error-exitcode", "99", "--print-limit", "50", *argv]


def sanitizer_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a sanitized run needs: no caching allocator, so bounds are the tensors' own."""
    env = dict(os.environ if base is None else base)
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    return env


def error_counts(log: str) -> list[int]:
    """The error (or hazard) count of every sanitizer summary in a log, one per sanitized process."""
    return [int(n) for n in SUMMARY.findall(log)]


def verdict(rc: int | None, log: str) -> str:
    """Empty when the run is clean; otherwise why not."""
    counts = error_counts(log)
    if rc is None:
        return "timed out"
    if not counts:
        return f"no sanitizer summary in the log (exit {rc})"
    if any(counts):
        return f"sanitizer reported errors: {counts}"
    if rc != 0:
        return f"exit {rc} (the tests failed; 99 would be sanitizer errors)"
    return ""


def tool_command(tool: str, tests: list[str]) -> list[str]:
    """pytest over `tests`, one process, under compute-sanitizer's `tool`."""
    return sanitizer_command(tool, [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                    "-p", "no:xdist", *tests])


def run_tool(tool: str, tests: list[str], profile: str, timeout: float, out: Path) -> bool:
    cmd = tool_command(tool, tests)
    env = sanitizer_env()
    env["HYPOTHESIS_PROFILE"] = profile
    log_path = out / f"sanitize-{tool}.log"
    print(f"== {' '.join(cmd)}\n   profile {profile}, timeout {timeout:.0f} s, log {log_path}", flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
        rc, log = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        rc = None
        log = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
    log_path.write_text(log)
    print("\n".join(log.rstrip().splitlines()[-15:]))
    problem = verdict(rc, log)
    print(f"-- {tool}: {'clean' if not problem else 'FAILED: ' + problem}", flush=True)
    return not problem


def main(argv: list[str] | None = None) -> int:
    p = parser("sanitize", __doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tool", type=comma_list(TESTS), default="memcheck,racecheck",
                   help="comma-separated: memcheck, racecheck")
    p.add_argument("--profile", default="ci", help="Hypothesis profile for the sanitized run")
    p.add_argument("--timeout", type=float, default=540.0, help="seconds per tool")
    p.add_argument("tests", nargs="*", help="test modules (default: per tool, see TESTS)")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit (no CUDA needed)")
    args = p.parse_args(argv)
    if args.dry_run:
        for tool in args.tool:
            print(f"HYPOTHESIS_PROFILE={args.profile} PYTORCH_NO_CUDA_MEMORY_CACHING=1 "
                  f"{' '.join(tool_command(tool, args.tests or TESTS[tool]))}")
        return 0
    if shutil.which("compute-sanitizer") is None:
        print("tools.sanitize: needs CUDA (compute-sanitizer, from the CUDA toolkit, is not on PATH)",
              file=sys.stderr)
        return 2
    out = out_dir(ROOT / "reports")
    results = {tool: run_tool(tool, args.tests or TESTS[tool], args.profile, args.timeout, out)
               for tool in args.tool}
    print("SANITIZE " + ("PASSED: " if all(results.values()) else "FAILED: ")
          + ", ".join(f"{t} {'clean' if ok else 'failed'}" for t, ok in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
