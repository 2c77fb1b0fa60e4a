"""The run's implementations, their conventions and recipes, and the budget for other people's kernels.

A pytest plugin (conftest.py loads it). `--impl` names an implementation to test instead of this
repository's kernel; `--convention` overrides the convention its signature declares; `--recipe`
holds it to one recipe, or `auto` (the default with --impl): identify the recipe first
(conformance.diagnosis.identification), print it in the header, and hold the implementation to it, or to the
closest when none matches. An implementation told `recipe=` (kvfp8) is held to every recipe.

The sweep runs once, in the xdist controller, and reaches the workers through `workerinput`.

Another team's kernel may compile a new variant for every shape and stride, so an external run is
bounded: fewer examples a property, a shrink budget, and a per-test timeout (pytest-timeout, when
installed). The header prints what was cut.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import pytest
import torch
from hypothesis import settings
from hypothesis.internal.conjecture import engine

from conformance import harness
from conformance.artifacts import failures_dir
from conformance.conventions import CONVENTIONS, get_convention
from conformance.impls import IMPL_ENV, Implementation, selected_implementations, test_device
from kernel import RECIPES
from kernel.backend import describe
from kernel.recipe import PTH_RECIPES

#: Examples a property for an external implementation (this repository's kernel keeps the profile's).
EXTERNAL_EXAMPLES = {"cuda": 20, "cpu": 10}
# Hypothesis's own shrink deadline (engine.MAX_SHRINKING_SECONDS, 300 by default). The diagnosis minimizes
# a failing Case by experiment anyway (ablation), and a failing test's shrinking is most of its time: at 30 s,
# a kernel that failed 42 tests took 230 s on the H200 (docs/results/h200-2026-12-04-c.md). tools.corpus's
# quick mode cuts it further ($KVFP8_SHRINK_SECONDS).
SHRINK_SECONDS = int(os.environ.get("KVFP8_SHRINK_SECONDS", "10"))
TEST_TIMEOUT_S = 240  # per test, a backstop against a hung implementation (pytest-timeout)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--impl", default=None,
                     help="module:function or path/to/file.py:function to test instead of the fused kernel "
                          f"(also ${IMPL_ENV})")
    parser.addoption("--convention", default=None, choices=sorted(CONVENTIONS),
                     help="how to call --impl (default: detected from its signature; docs/conventions.md)")
    parser.addoption("--recipe", default=None, choices=sorted(RECIPES) + sorted(PTH_RECIPES) + ["auto"],
                     help="hold the implementation to this recipe; auto (the default with --impl): identify it "
                          "first. An implementation that takes recipe= is held to every recipe by default")


def _hold(impl: Implementation, option: str | None, full: bool | None = None) -> tuple[str | None, str]:
    """The recipe impl is held to, and how it was chosen; `full`: the full sweep (default: on CUDA)."""
    from conformance.diagnosis.identification import identify_robustly, sweep_points
    if option and option != "auto":
        return option, "given with --recipe"
    if impl.convention.told_recipe:
        return None, "every recipe, passed as recipe= (kvfp8 convention)"
    device = test_device()
    if not impl.convention.static:  # a dynamic per-(token, head) write: one of kernel.recipe.PTH_RECIPES
        from conformance.diagnosis.pth_identification import identify_per_token_head
        return identify_per_token_head(impl, device)
    started = time.perf_counter()
    full = device.type == "cuda" if full is None else full
    recipe, note = identify_robustly(impl, sweep_points(["bfloat16", "float16"], full, convention=impl.convention),
                                     device)
    return recipe, f"{note}; sweep took {time.perf_counter() - started:.1f} s"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "argument_contract: this project's stricter argument checks "
                                       "(deselect with -m 'not argument_contract')")
    profile = config.getoption("hypothesis_profile", None)
    if profile:  # before _bound reads it, whichever plugin configures first
        settings.load_profile(profile)
    config._kvfp8_started = time.time()  # failure files newer than this are this run's
    harness.RUNNER = "xdist-worker" if hasattr(config, "workerinput") else "pytest"
    try:  # a bad --impl is a usage error, said once, not a collection error per module
        name = config.getoption("convention") or os.environ.get("KVFP8_CONVENTION")
        impls = selected_implementations(config.getoption("impl"), get_convention(name) if name else None)
    except (ValueError, ImportError, OSError, SyntaxError) as exc:
        raise pytest.UsageError(f"--impl / ${IMPL_ENV}: {type(exc).__name__}: {exc}") from exc
    # auto matters only for an implementation that is not told the recipe, which only --impl brings.
    option = config.getoption("recipe") or "auto"
    held = getattr(config, "workerinput", {}).get("kvfp8_held")
    held = json.loads(held) if held else {i.name: _hold(i, option) for i in impls}
    config._kvfp8_held = json.dumps(held)
    config._kvfp8_impls = [dataclasses.replace(i, recipe=held[i.name][0], recipe_note=held[i.name][1])
                           for i in impls]
    config._kvfp8_cuts = _bound(config) if not all(i.is_ours for i in impls) else []


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: hand the identified recipes to each worker, so the sweep runs once."""
    node.workerinput["kvfp8_held"] = node.config._kvfp8_held


def _bound(config: pytest.Config) -> list[str]:
    """Bound the run for an external implementation; returns what was cut, for the header."""
    current, name = settings(), settings._current_profile
    examples = EXTERNAL_EXAMPLES[test_device().type]
    cuts = []
    if current.max_examples > examples:
        settings.register_profile("external", parent=current, max_examples=examples)
        settings.load_profile("external")
        cuts.append(f"{examples} examples a property (profile {name}: {current.max_examples}; graph "
                    "properties a fifth of that, at least 10)")
    engine.MAX_SHRINKING_SECONDS = SHRINK_SECONDS  # Hypothesis's own shrink deadline, per failing test
    cuts.append(f"shrinking at most {SHRINK_SECONDS} s a failure")
    if config.pluginmanager.hasplugin("timeout"):
        cuts.append(f"{TEST_TIMEOUT_S} s a test (pytest-timeout)")
    return cuts


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config._kvfp8_cuts and config.pluginmanager.hasplugin("timeout"):
        # Under xdist a hung test's worker is killed and replaced ("crashed"); alone, the test fails.
        method = "thread" if hasattr(config, "workerinput") else "signal"
        for item in items:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S, method=method))


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """A CUDA context the implementation broke (an illegal address noticed only after the test, in a
    graph replay, say) must not fail the next test: end this process, blaming the test that did it."""
    if torch.cuda.is_initialized() and harness.cuda_context_lost(test_device()):
        message = (f"the CUDA context was lost during {item.nodeid}: an implementation error (an illegal memory "
                   "access); this process cannot run another test")
        print(message, file=sys.stderr, flush=True)
        if harness.RUNNER == "xdist-worker":
            os._exit(70)  # xdist reports this test as crashed and starts a fresh worker
        pytest.exit(message, returncode=1)


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"kvfp8: backend {describe()}; hypothesis profile {settings().max_examples} examples "
             f"({settings._current_profile}); database {'on' if settings().database else 'off'}; "
             f"failure files in {failures_dir()}"]
    for impl in config._kvfp8_impls:
        lines.append(f"kvfp8: implementation {impl.name} ({impl.convention.name} convention); recipe "
                     f"{impl.recipe or 'every recipe'}: {impl.recipe_note}")
    if config._kvfp8_cuts:
        lines.append("kvfp8: bounded for an external implementation: " + "; ".join(config._kvfp8_cuts))
    return lines


def held_recipes(impls: list[Implementation]) -> list[str]:
    """Every recipe some implementation of the run is held to, in kernel.RECIPES order."""
    return [r for r in RECIPES if any(i.recipe in (None, r) for i in impls)]


def _parametrized_by_test(metafunc: pytest.Metafunc, name: str) -> bool:
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        if name in ([n.strip() for n in names.split(",")] if isinstance(names, str) else names):
            return True
    return False


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    impls = metafunc.config._kvfp8_impls
    if "impl" in metafunc.fixturenames:
        # session scope, so that fixtures derived from it (recipes) are not reset between examples
        metafunc.parametrize("impl", impls, ids=[i.name for i in impls], scope="session")
    if "recipe" in metafunc.fixturenames and not _parametrized_by_test(metafunc, "recipe"):
        recipes = held_recipes(impls)
        if not recipes:  # every implementation of the run writes dynamic per-(token, head) scales only
            why = "; ".join(i.convention.dynamic_only for i in impls if not i.convention.static) or "no recipe held"
            recipes = [pytest.param(None, marks=pytest.mark.skip(reason=why), id="no-static-recipe")]
        metafunc.parametrize("recipe", recipes)


def held_lines(impls: list[Implementation]) -> list[str]:
    """What each implementation was held to, in one line each (the header says it too, but -q hides it)."""
    return [f"kvfp8: held {i.name} to " + (f"recipe {i.recipe} ({i.recipe_note})" if i.recipe else i.recipe_note
                                           if i.recipe_note.startswith("every recipe") else
                                           f"every recipe ({i.recipe_note})") for i in impls]


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Say which recipe each implementation was held to (visible under -q, unlike the header); list the
    failure files this run wrote (by xdist workers too), with the replay command."""
    for line in held_lines(getattr(config, "_kvfp8_impls", [])):
        terminalreporter.write_line(line)
    folder = failures_dir()
    started = getattr(config, "_kvfp8_started", time.time())
    new = sorted(p for p in folder.glob("*.json") if p.stat().st_mtime >= started - 1) if folder.is_dir() else []
    if new:
        terminalreporter.section("kvfp8 failure cases (replay: python -m tools.repro FILE)")
        for path in new:
            terminalreporter.write_line(f"python -m tools.repro {path}")


@pytest.fixture(scope="session")
def device():
    return test_device()


@pytest.fixture(scope="session")
def recipes(impl: Implementation) -> tuple[str, ...]:
    """The recipes impl is held to: its one recipe, or every recipe (it is told each case's)."""
    return (impl.recipe,) if impl.recipe else tuple(RECIPES)
