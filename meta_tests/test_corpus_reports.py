"""`make conformance` on part of the defect corpus (examples/defects/): each report names exactly the catalogue's
defects outside the argument contract, by effect and trigger: one for a one-defect file, two for a pair, none
for a control. tools.corpus's quick mode, as on every machine; the whole corpus is `python -m tools.corpus`
(CI's nightly lane runs it on CUDA, and docs/results/corpus.md holds its latest scores).

CI's share: both torch controls, two pairs and four one-defect files of different classes (about 30 s each on
one core). The same code judges every entry; a file is chosen here for its class, not for passing.
"""

from __future__ import annotations

import pytest

from tools import corpus

pytestmark = pytest.mark.long  # one report a test, each tens of seconds

CI_SHARE = ("torch_vllm.py", "torch_sglang.py", "torch_vllm_pair_padding_wraps_zero_sign.py",
            "torch_sglang_pair_nan_sign_2d_raises.py", "torch_vllm_key_div_inplace.py",
            "torch_vllm_tensor0d_double_rounding.py", "torch_sglang_uint8_value_cast.py",
            "torch_vllm_empty_batch_raises.py")
CAT = corpus.load_catalogue()
ENTRIES = [e for e in CAT.CATALOGUE if e["file"] in CI_SHARE]


def test_the_share_is_in_the_catalogue():
    assert len(ENTRIES) == len(CI_SHARE), sorted(set(CI_SHARE) - {e["file"] for e in ENTRIES})


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e["file"])
def test_report_names_exactly_the_catalogued_defects(entry, tmp_path):
    # On the CPU on a CUDA machine too: torch's ops can compute other recipes on CUDA (docs/facts.md); the
    # catalogue's recipes are the CPU's for the torch files.
    row = corpus.run_entry(entry, CAT, tmp_path, "quick", "1", interpreted=True,
                           extra_env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
    assert row["verdict"] == "exact", row
    assert row["recipe"] == entry["recipe"], row
