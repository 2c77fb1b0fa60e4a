"""tools.facts: every fact gets a row, and the rows say what the test measures itself (no remembered bytes)."""

from __future__ import annotations

import re

import pytest
import torch

from kernel.backend import interpreted
from tools import facts


def run(capsys, *argv: str) -> dict[str, str]:
    """Run the tool; {row id: measured} from its markdown table."""
    assert facts.main(list(argv)) == 0
    out = capsys.readouterr().out
    assert "torch " + torch.__version__ in out and "triton " in out and "device:" in out, out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert all(len(r) == 3 for r in rows), rows  # no stray pipe inside a cell
    return {r[0][2:]: r[2][:-2] for r in rows[1:]}


def test_helpers():
    x = facts.fp32_from_bits([0x7FC00000, 0xFFC00000, 0x80000000, 0x3F800000])
    assert facts.bits(x) == [0x7FC00000, 0xFFC00000, 0x80000000, 0x3F800000]
    assert facts.count_differences(x, facts.fp32_from_bits([0xFFC00001, 0x7F800001, 0, 0x3F800000])) == 1
    assert facts.all_patterns(torch.bfloat16).view(torch.int16).unique().numel() == 2**16
    assert facts.hashed_fp32(64).isfinite().all()
    with pytest.raises(SystemExit):
        facts.parse_args(["--only", "div,bogus"])


def test_cast_and_nan_rows_match_torch_here(capsys):
    rows = run(capsys, "--only", "cast,nan", "--device", "cpu")
    assert [k for k in rows if k.startswith("cast/")] == [f"cast/{v}" for v in facts.CAST_VALUES]
    assert [k for k in rows if k.startswith("nan/bf16/")] == [f"nan/bf16/{v}" for v in facts.FP32_BITS]
    for v in facts.CAST_VALUES:
        byte = facts.bits(facts.fp32_value(v).to(torch.float8_e4m3fn))[0]
        assert f"1-D x1024: 0x{byte:02X}" in rows[f"cast/{v}"], (v, rows[f"cast/{v}"])
    for v in facts.FP32_BITS:
        half = facts.bits(facts.fp32_value(v).reshape(()).to(torch.bfloat16))[0]
        assert rows[f"nan/bf16/{v}"].startswith(f"0-d: 0x{half:04X};"), (v, rows[f"nan/bf16/{v}"])


def test_div_rows_name_the_formulas_with_zero_differences(capsys):
    rows = run(capsys, "--only", "div", "--device", "cpu", "--scale", "0.7")
    assert len(rows) == len(facts.DTYPES) * 3, rows
    for key, measured in rows.items():
        counts = {name: int(n.replace(",", "")) for name, n in re.findall(r"(x\S+): ([\d,]+)", measured)}
        assert set(counts) == {"x*(1/s)", "x/s", "x/in(s)"}, measured
        zero = [name for name, n in counts.items() if n == 0] or ["none"]
        assert measured.startswith(f"matches {' = '.join(zero)};"), (key, measured)


def test_triton_rows(capsys):
    rows = run(capsys, "--only", "triton", "--values", "4096")
    if not interpreted():
        assert list(rows) == ["triton"] and "not measured" in rows["triton"], rows
        return
    for v in facts.E4M3_EXAMPLES:
        want = facts.rne_e4m3(torch.tensor([v], dtype=torch.float32)).item()
        assert f"RNE gives 0x{want:02X}" in rows[f"triton/e4m3/{v!r}"], rows
    assert {"triton/e4m3/count", "triton/bf16/count", "triton/fp16/count", "triton/fma"} <= set(rows), rows


def test_e5m2_rows_match_torch_here(capsys):
    rows = run(capsys, "--only", "e5m2", "--device", "cpu")
    assert [k for k in rows if "/all" not in k] == [f"e5m2/{v}" for v in facts.E5M2_CAST_VALUES]
    for v in facts.E5M2_CAST_VALUES:
        byte = facts.bits(facts.fp32_value(v).to(torch.float8_e5m2))[0]
        assert f"1-D x1024: 0x{byte:02X}" in rows[f"e5m2/{v}"], (v, rows[f"e5m2/{v}"])
    assert {f"e5m2/{d}/all" for d in facts.DTYPES} <= set(rows), rows


def test_fnuz_rows_match_torch_here(capsys):
    rows = run(capsys, "--only", "fnuz", "--device", "cpu")
    assert [k for k in rows if "/all" not in k] == [f"fnuz/{v}" for v in facts.FNUZ_CAST_VALUES]
    for v in facts.FNUZ_CAST_VALUES:
        byte = facts.bits(facts.fp32_value(v).to(torch.float8_e4m3fnuz))[0]
        assert f"1-D x1024: 0x{byte:02X}" in rows[f"fnuz/{v}"], (v, rows[f"fnuz/{v}"])
    assert {f"fnuz/{d}/all" for d in facts.DTYPES} <= set(rows), rows
