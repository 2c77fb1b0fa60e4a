"""tools.sweep_pth_scales: sampled amax patterns match the reference, and a wrong scale byte is named with its
amax. (On CUDA the tool sweeps all 2**31 patterns; docs/results/ holds its runs.)"""

from __future__ import annotations

import torch

from tools import sweep_pth_scales


def test_sampled_amax_patterns_match_the_reference(capsys):
    assert sweep_pth_scales.main(["--chunk-log2", "8", "--sample", "16"]) == 0
    out = capsys.readouterr().out
    assert "per-token-head-vllm: 4096 amax patterns, 0 chunk pairs differ" in out, out


def test_a_wrong_scale_byte_is_named_with_its_amax(monkeypatch, capsys):
    real = sweep_pth_scales.fused_fp8_set_kv_buffer

    def one_scale_off(*args, **kw):
        real(*args, **kw)
        if kw["use_triton"]:
            kw["k_scale_cache"].view(torch.uint8).view(-1)[4 * 8 + 1] ^= 1  # token 1, head 0: bit 8 of its scale
    monkeypatch.setattr(sweep_pth_scales, "fused_fp8_set_kv_buffer", one_scale_off)
    assert sweep_pth_scales.main(["--chunk-log2", "8", "--sample", "2", "--recipes", "per-token-head-vllm"]) == 1
    out = capsys.readouterr().out
    # head 8 of chunk 0 has amax bits 8, a subnormal, so its scale is vLLM's floor, 1e-6 (0x358637bd, little-endian)
    assert "1 chunk pairs differ" in out and "k_scale_cache, amax bits 0x00000008" in out, out
    assert "bd368635 != reference bd378635" in out, out
