"""The tools' command-line convention (tools/_cli.py) and every tool's parser following it."""

from __future__ import annotations

import argparse
import importlib
import pkgutil

import pytest
import torch

import kernel
import tools
from conformance.impls import ENCODERS
from tools import _cli

TOOL_MODULES = sorted(m.name for m in pkgutil.iter_modules(tools.__path__) if not m.name.startswith("_"))


def test_comma_list_splits_strips_and_drops_empties():
    assert _cli.comma_list()(" a, b,,c ,") == ("a", "b", "c")
    assert _cli.comma_list()("") == ()
    assert _cli.comma_list(["x", "y"])("y,x") == ("y", "x")


def test_comma_list_names_the_unknown_choice():
    with pytest.raises(argparse.ArgumentTypeError, match="bogus") as info:
        _cli.comma_list(["x", "y"])("x,bogus")
    assert "x, y" in str(info.value)


def test_comma_list_error_through_argparse(capsys):
    p = _cli.parser("demo", "Demo.\n\nMore.")
    p.add_argument("--items", type=_cli.comma_list(["a", "b"]))
    assert p.parse_args(["--items", "b,a"]).items == ("b", "a")
    with pytest.raises(SystemExit) as info:
        p.parse_args(["--items", "a,zzz"])
    assert info.value.code == 2
    assert "zzz" in capsys.readouterr().err


def test_parser_prog_and_description():
    p = _cli.parser("demo", "First paragraph\nstill first.\n\nSecond paragraph.")
    assert p.prog == "python -m tools.demo"
    assert p.description == "First paragraph\nstill first."


def test_out_dir_honours_OUT(monkeypatch, tmp_path):
    target = tmp_path / "out" / "nested"
    monkeypatch.setenv("OUT", str(target))
    assert _cli.out_dir() == target and target.is_dir()
    monkeypatch.delenv("OUT")
    monkeypatch.chdir(tmp_path)
    assert _cli.out_dir("here") == tmp_path.joinpath("here").relative_to(tmp_path) and (tmp_path / "here").is_dir()
    assert not _cli.out_dir(tmp_path / "dry", create=False).exists()


def test_constants():
    assert sorted(kernel.RECIPES) == _cli.RECIPE_NAMES
    assert tuple(ENCODERS) == tuple(_cli.ENCODERS)


@pytest.mark.parametrize("name", TOOL_MODULES)
def test_every_tool_parser_has_its_prog(name, capsys):
    module = importlib.import_module(f"tools.{name}")
    if not hasattr(module, "main"):
        pytest.skip(f"tools.{name} has no main")
    with pytest.raises(SystemExit) as info:
        module.main(["--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m tools.{name} "), name


def test_repro_accepts_mismatches_and_n():
    from tools import repro

    assert repro._parser().parse_args(["f.json", "--mismatches", "3"]).n == 3
    assert repro._parser().parse_args(["f.json", "-n", "4"]).n == 4


def test_throughput_examples_and_deprecated_n(monkeypatch):
    from tools import throughput

    seen = []
    monkeypatch.setattr(throughput, "draw_cases", lambda n, size: seen.append(n) or [])
    monkeypatch.setattr(throughput, "run_pass", lambda *a: 1.0)
    throughput.main(["--examples", "5", "--size", "small"])
    throughput.main(["-n", "6", "--size", "small"])
    assert seen == [5, 6]


def test_throughput_profile_sums_check_cases_phases():
    """tools.throughput --profile: torch.profiler's top ops, check_case's five phases (each with host
    time), and cProfile's top functions, here over two Cases through the reference."""
    import re

    from conformance import harness
    from conformance.impls import Implementation
    from kernel import naive_fp8_set_kv_buffer
    from strategies.build import Built
    from strategies.case import Case
    from tools import throughput

    build, copy = harness.build, Built.copy
    cases = [Case(num_tokens=t, num_heads=1, head_dim=8, page_size=4, num_pages=1, cache_loc=tuple(range(t)))
             for t in (1, 3)]
    text = throughput.profile_pass(cases, Implementation("reference", naive_fp8_set_kv_buffer, {}),
                                   torch.device("cpu"))
    phases = dict(re.findall(r"^\| (build|copy|reference|implementation|compare) \| (\d+) \|", text, re.M))
    assert set(phases) == {"build", "copy", "reference", "implementation", "compare"}, text
    assert all(int(us) > 0 for us in phases.values()), phases
    assert harness.build is build and Built.copy is copy  # the labels are gone after the pass
    assert "### torch.profiler" in text and "### cProfile" in text
