"""A conformance report for any implementation: `python -m tools.conformance path/to/file.py:fn`
(or `make conformance IMPL=...`). docs/conformance.md explains the report and its JSON schema.

1. Identify the recipe once (unless given, or the implementation is told recipe=), as --recipe auto does.
2. One pytest run, in a subprocess, of the capability probes (conformance/capability_probes.py) and
   every property family, held to that recipe, bounded (conformance.session) and derandomized (the
   `ci` Hypothesis profile unless $HYPOTHESIS_PROFILE says otherwise), with a fresh failure-file
   folder; conformance.diagnosis.recorder classifies each failure as it happens.
3. Group the findings into defects, copy each one's smallest Case next to the report, and write
   <out>/<name>.md and <out>/<name>.json (out: --out, else $OUT, else reports/conformance); print
   the markdown. Exit status: 0 when there is no defect, 1 when there is, 2 on a usage error or a run
   that could not report (a collection error, pytest's own error).

The fidelity and repro families test the reference and this repository's tools, not an
implementation, so they are not part of a report.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import kernel  # noqa: F401  (picks the Triton interpreter when there is no CUDA, before triton loads)
from conformance.conventions import CONVENTIONS, get_convention
from conformance.diagnosis import report as reporting
from conformance.diagnosis.capabilities import ROWS, argument_rows
from conformance.diagnosis.fresh import replayer
from conformance.impls import FUSED_SPEC, _split, from_spec, test_device
from kernel.backend import ENCODER_ENV, describe, interpreted, resolve_encoder
from kernel.recipe import PTH_RECIPES
from tools._cli import ENCODERS, RECIPE_NAMES, comma_list, out_dir, parser

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("capabilities", "bit_exact", "isolation", "equivalence", "per_head", "per_token_head", "e5m2", "fnuz",
            "errors", "overlap", "ties", "exhaustive", "graphs", "bigcache", "devices", "compile", "repeat")
# They test the reference and the tools, not an implementation.
NOT_IMPL_FAMILIES = ("fidelity", "per_token_head_fidelity", "repro")
BUDGET_S = {"cuda": 600, "cpu": 1200}
# Kept back from the budget: stopping a cut pytest run (SIGTERM, then SIGKILL after up to 20 s) and
# the report itself, which took a few seconds on the H200 and the CPU (docs/results/h200-2026-12-03-e.md).
RESERVE_S = 25


def family_file(family: str) -> str:
    return "conformance/capability_probes.py" if family == "capabilities" else f"conformance/test_{family}.py"


def report_name(spec: str, encoder: str | None) -> str:
    """A file name for the implementation: <file stem or module>.<function>[-<encoder>]."""
    target, attr = _split(spec)
    stem = Path(target).stem if target.endswith(".py") or "/" in target or os.sep in target else target
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{stem}.{attr}" + (f"-{encoder}" if encoder else ""))


def _parser() -> argparse.ArgumentParser:
    p = parser("conformance", __doc__)
    p.add_argument("impl", help="module:function or path/to/file.py:function (kernel:fused_fp8_set_kv_buffer for "
                                "this repository's kernel)")
    p.add_argument("--convention", choices=sorted(CONVENTIONS), help="how to call it (default: from its signature)")
    p.add_argument("--recipe", default="auto", choices=["auto", *RECIPE_NAMES, *sorted(PTH_RECIPES)],
                   help="the recipe to hold it to; auto (default): identify it (an implementation told recipe= "
                        "is held to every recipe)")
    p.add_argument("--sweep", choices=("quick", "full"),
                   help="--recipe auto's identification sweep: quick (4 scales, the CPU default) or full (15 scales "
                        "in each scale kind, the CUDA default)")
    p.add_argument("--encoder", choices=ENCODERS, help="the fused kernel's e4m3 encoder (kvfp8 only)")
    p.add_argument("--out", help="folder for <name>.md, <name>.json and <name>/ (default $OUT, else "
                                 "reports/conformance)")
    p.add_argument("--examples", type=int, help="at most this many examples a property (external "
                                                "implementations are bounded anyway: conformance.session)")
    p.add_argument("--probe-examples", type=int, help="examples a capability row (default 4 on the CPU, 6 on CUDA)")
    p.add_argument("--families", help=f"comma-separated, from {','.join(FAMILIES)} (default: all)")
    p.add_argument("--budget", type=float, help="seconds for the whole run (default 600 on CUDA, 1200 on the CPU); "
                                                "tests not finished by then are reported as not run")
    p.add_argument("--jobs", default="auto", help="pytest-xdist workers (default auto; 0: no xdist, so a crash of "
                                                  "the implementation ends the whole run)")
    p.add_argument("--quiet", action="store_true", help="do not print the markdown")
    return p


def _impl_name_and_kwargs(args: argparse.Namespace):
    convention = get_convention(args.convention) if args.convention else None
    impl = from_spec(args.impl, {}, convention)
    if args.encoder:
        if not impl.is_ours:
            raise ValueError(f"--encoder is the fused kernel's keyword ({FUSED_SPEC}), not {args.impl}'s")
        resolve_encoder(args.encoder, test_device())  # raises where the hardware cast is missing
        os.environ[ENCODER_ENV] = args.encoder  # the kernel reads it when no encoder= is passed
    return impl


def _families(text: str | None) -> list[str]:
    if not text:
        return list(FAMILIES)
    chosen = list(comma_list()(text))
    bad = [f for f in chosen if f not in FAMILIES]
    if bad:
        raise ValueError(f"unknown families {bad}; choose from {', '.join(FAMILIES)}")
    return chosen


def run_pytest(cmd: list[str], env: dict[str, str], log: Path, timeout: float) -> tuple[int | None, float]:
    """Run pytest in its own process group; on timeout stop the whole group. Returns (rc or None, seconds)."""
    started = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = None
    return rc, time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    started = time.perf_counter()
    try:
        impl = _impl_name_and_kwargs(args)
        families = _families(args.families)
    except (ValueError, ImportError, OSError, SyntaxError) as exc:
        print(f"tools.conformance: {exc}", file=sys.stderr)
        return 2
    device = test_device()
    budget = args.budget or BUDGET_S[device.type]
    name = report_name(args.impl, args.encoder)
    out = Path(args.out) if args.out else out_dir("reports/conformance")
    cases_dir = out / name
    cases_dir.mkdir(parents=True, exist_ok=True)
    for old in [*cases_dir.glob("*.json"), *cases_dir.glob("records.jsonl")]:  # the previous report's
        old.unlink()

    from conformance.session import _hold  # the same identification as --recipe auto
    print(f"tools.conformance: {impl.name} ({impl.convention.name} convention) on {device} ({describe()})",
          flush=True)
    held, note = _hold(impl, args.recipe, args.sweep == "full" if args.sweep else None)
    stack = impl.convention.stack_note(held)
    if stack:
        note += f"; {stack}"
    print(f"tools.conformance: recipe {held or 'every recipe'}: {note}", flush=True)

    work = Path(tempfile.mkdtemp(prefix="kvfp8-conformance-"))
    records, failures, log = work / "records.jsonl", work / "failures", cases_dir / "pytest.log"
    # --durations: the log says where the run's time went (the slowest tests, shrinking included).
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conformance.diagnosis.recorder",
           "--durations=25", "--kvfp8-record", str(records), "--impl", args.impl]
    if args.convention:
        cmd += ["--convention", args.convention]
    if held:
        cmd += ["--recipe", held]
    if args.examples:
        cmd += ["--kvfp8-examples", str(args.examples)]
    xdist = importlib.util.find_spec("xdist") is not None
    if xdist and args.jobs != "0":  # even one worker: a crash then ends that worker, and the report says so
        cmd += ["-n", args.jobs]
    cmd += [family_file(f) for f in families]
    env = {**os.environ, "KVFP8_FAILURES": str(failures), "PYTHONPATH": str(ROOT)}
    env.setdefault("HYPOTHESIS_PROFILE", "ci")  # derandomized: the same run gives the same report
    if args.probe_examples:
        env["KVFP8_PROBE_EXAMPLES"] = str(args.probe_examples)
    env.pop("PYTEST_XDIST_WORKER", None)
    remaining = budget - (time.perf_counter() - started) - RESERVE_S
    print(f"tools.conformance: {len(families)} families, {remaining:.0f} s left of a {budget:.0f} s budget; "
          f"log {log}", flush=True)
    rc, seconds = run_pytest(cmd, env, log, remaining)

    text = log.read_text(errors="replace") if log.exists() else ""
    cuts = [f"families {', '.join(NOT_IMPL_FAMILIES)} left out (they test the reference and the tools)"]
    if set(families) != set(FAMILIES):
        cuts.append("not selected: " + ", ".join(f for f in FAMILIES if f not in families))
    cuts += [line.split(":", 1)[1].strip() for line in text.splitlines()
             if line.startswith("kvfp8: bounded for an external implementation:")][:1]
    if rc is None:
        cuts.append(f"the pytest run stopped at the budget after {seconds:.0f} s: unfinished tests are 'not run'")
    base = {"env": {"HYPOTHESIS_PROFILE": env["HYPOTHESIS_PROFILE"]}, "args": " ".join(
        shlex.quote(a) for a in cmd[cmd.index("--impl"):cmd.index("--impl") + 2] +
        (["--convention", args.convention] if args.convention else []) + (["--recipe", held] if held else []))}
    if args.encoder:
        base["env"][ENCODER_ENV] = args.encoder
    from conformance.artifacts import environment
    backend = describe()
    if not impl.is_ours and interpreted():  # conformance.impls.from_spec gave its Triton casts the GPU's rounding
        backend += ("; its Triton casts to fp8 and bf16 as a GPU makes them (round to nearest even, satfinite; the "
                    "interpreter's own do not: conformance/interpreter_casts.py)")
    env_info = {**environment(), "device": str(device), "backend": backend}
    examples = (f"{args.probe_examples or ('6 on CUDA' if device.type == 'cuda' else 4)} a capability row; "
                f"properties: {args.examples or 'the profile'}"
                f"{' (bounded for an external implementation)' if not impl.is_ours else ''}; Hypothesis profile "
                f"{env['HYPOTHESIS_PROFILE']}")
    meta = {
        "impl": {"name": impl.name, "spec": args.impl, "resolved": impl.spec, "convention": impl.convention.name,
                 "kwargs": impl.kwargs, "encoder": args.encoder if impl.is_ours else None},
        "recipe": {"option": args.recipe, "held": held, "note": note},
        "environment": env_info,
        "run": {"families": families, "examples": examples, "cuts": cuts, "seconds": 0.0, "pytest_seconds":
                round(seconds, 1), "pytest_exit": rc, "budget_s": budget, "command": shlex.join(cmd)},
    }
    result = reporting.build(meta, reporting.read_records(records), ROWS, argument_rows(), cases_dir, failures,
                             base, set(families), replayer(base["env"]))
    if args.encoder:  # the run chose the encoder through $KVFP8_ENCODER: say so in the copied cases too
        _pin_encoder(cases_dir, args.encoder)
    if records.exists():  # every test's outcome and findings, for a closer look
        shutil.copyfile(records, cases_dir / "records.jsonl")
    shutil.rmtree(work, ignore_errors=True)  # the chosen cases were copied next to the report
    result["run"]["seconds"] = round(time.perf_counter() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    md = reporting.markdown(result)
    (out / f"{name}.md").write_text(md)
    if not args.quiet:
        print(md)
    print(f"tools.conformance: wrote {out / name}.md and .json ({result['verdict']}; {result['run']['seconds']:.0f} s)")
    collect_errors = [r for r in reporting.read_records(records) if r.get("when") == "collect"]
    if rc not in (None, 0, 1) or collect_errors:
        print(f"tools.conformance: the pytest run did not complete (exit {rc}); see {log}", file=sys.stderr)
        print("\n".join(text.splitlines()[-30:]), file=sys.stderr)
        return 2
    return 0 if result["verdict"] == "conforms" else 1  # an incomplete run is not a pass


def _pin_encoder(folder: Path, encoder: str) -> None:
    """The run chose the fused kernel's encoder through $KVFP8_ENCODER; name it in each copied case,
    so that tools.repro replays it on the same encoder."""
    for path in folder.glob("*.json"):
        record = json.loads(path.read_text())
        if record.get("impl", {}).get("spec") == FUSED_SPEC:
            record["impl"].setdefault("kwargs", {})["encoder"] = encoder
            path.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
