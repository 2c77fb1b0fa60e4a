"""`make conformance` on part of the defect corpus (examples/defects/): each report names exactly the catalogue's
defects outside the argument contract, by effect and trigger: one for a one-defect file, two for a pair, none
for a control. tools.corpus's quick mode, as on every machine; the whole corpus is `python -m tools.corpus`
(CI's nightly lane runs it on CUDA, and docs/results/corpus.md holds its latest scores).

CI's share: both torch controls, two pairs and four one-defect files of different classes (about 30 s each on
one core), on the CPU only. The same code judges every entry; a file is chosen here for its class,
not for passing.
"""

from __future__ import annotations

import json

import pytest
import torch

from tools import corpus

CI_SHARE = ("torch_vllm.py", "torch_sglang.py", "torch_vllm_pair_padding_wraps_zero_sign.py",
            "torch_sglang_pair_nan_sign_2d_raises.py", "torch_vllm_key_div_inplace.py",
            "torch_vllm_tensor0d_double_rounding.py", "torch_sglang_uint8_value_cast.py",
            "torch_vllm_empty_batch_raises.py")
# CPU reports (CUDA hidden, torch's CPU ops): the run make test does without CUDA. A CUDA runner skips them
# rather than repeat that CPU work beside its GPU tests (55 s for one pair on an H100, docs/results/
# h100-2026-12-06.md); the nightly runs the whole corpus on CUDA.
CPU_ONLY = "a CPU report with CUDA hidden: make test without CUDA (the CPU CI) runs it; here it would repeat that run"
CAT = corpus.load_catalogue()
ENTRIES = [e for e in CAT.CATALOGUE if e["file"] in CI_SHARE]


def test_the_share_is_in_the_catalogue():
    assert len(ENTRIES) == len(CI_SHARE), sorted(set(CI_SHARE) - {e["file"] for e in ENTRIES})


@pytest.mark.parametrize("returncode, stderr", [(-2, ""), (1, "Traceback ...\nKeyboardInterrupt\n")])
def test_a_report_stopped_from_outside_leaves_no_row(monkeypatch, tmp_path, returncode, stderr):
    """A time limit's SIGINT stops the reports in flight: they get no row, so --skip-from runs them again."""
    import subprocess

    monkeypatch.setattr(corpus.subprocess, "run", lambda args, **_: subprocess.CompletedProcess(args, returncode,
                                                                                              "", stderr))
    row = corpus.run_entry(ENTRIES[0], CAT, tmp_path, "quick", "1", interpreted=True)
    assert row.get("interrupted"), row


@pytest.mark.long  # one report a test, each tens of seconds
@pytest.mark.skipif(torch.cuda.is_available(), reason=CPU_ONLY)
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["file"])
def test_report_names_exactly_the_catalogued_defects(entry, tmp_path):
    # On the CPU on a CUDA machine too: torch's ops can compute other recipes on CUDA (docs/facts.md); the
    # catalogue's recipes are the CPU's for the torch files.
    row = corpus.run_entry(entry, CAT, tmp_path, "quick", "1", interpreted=True,
                           extra_env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    assert row["verdict"] == "exact", row
    assert row["recipe"] == entry["recipe"], row


def test_longest_first_starts_the_slowest_saved_entries_first(monkeypatch, tmp_path):
    """--longest-first orders the run by saved seconds, an entry never timed first; --skip-from still drops."""
    files = [e["file"] for e in CAT.CATALOGUE[:4]]
    saved = tmp_path / "rows.jsonl"
    saved.write_text("".join(json.dumps({"file": f, "seconds": s}) + "\n" for f, s in zip(files[1:], (5.0, 50.0, 9.0))))
    skipped = tmp_path / "done.jsonl"
    skipped.write_text(json.dumps({"file": files[3], "seconds": 1.0}) + "\n")
    started = []
    monkeypatch.setattr(corpus, "run_entry", lambda entry, *_: started.append(entry["file"]) or
                        {"file": entry["file"], "interrupted": True})
    monkeypatch.setattr(corpus, "totals", lambda rows: {})
    monkeypatch.setattr(corpus, "publish", lambda *_: 0)
    corpus.main(["--needs", "cuda", "--only", ",".join(files), "--out", str(tmp_path / "out"),
                 "--longest-first", str(saved), "--skip-from", str(skipped)])
    assert started == [files[0], files[2], files[1]], started
