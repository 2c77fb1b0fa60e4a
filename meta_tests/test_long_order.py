"""conftest's test order: the long tests are dealt to the heads of the chunks pytest-xdist's scheduler first
sends each worker (`load`: a quarter of N / W each; `worksteal`, make test's: N / W each), so no worker starts
with all of them; a module marked long("module") stays whole."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

import conftest


@dataclass(eq=False)
class FakeItem:
    name: str
    module: str
    long: tuple | None = None  # the long mark's args, or None: not long

    def get_closest_marker(self, name: str):
        return pytest.mark.long(*self.long).mark if name == "long" and self.long is not None else None


def _items() -> list[FakeItem]:
    items = [FakeItem(f"t{i}", "plain") for i in range(60)]
    items[10:10] = [FakeItem("report-a", "report", ("module",)), FakeItem("report-b", "report", ("module",))]
    items[40:40] = [FakeItem(f"corpus{i}", "corpus", ()) for i in range(3)]
    return items


def _config(dist: str) -> SimpleNamespace:
    return SimpleNamespace(option=SimpleNamespace(dist=dist))


@pytest.mark.parametrize("dist, share", [("load", 4), ("worksteal", 1)])
def test_long_units_go_to_the_heads_of_the_first_chunks(monkeypatch, dist, share):
    items = _items()
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    conftest.pytest_collection_modifyitems(_config(dist), items)
    chunk = (len(items) // 4) // share  # pytest-xdist's first chunk a worker
    chunks = [items[i * chunk:(i + 1) * chunk] for i in range(4)]
    assert [it.name for it in chunks[0][:2]] == ["report-a", "report-b"]  # one module's run, kept together
    assert [c[0].name for c in chunks[1:]] == ["corpus0", "corpus1", "corpus2"]
    assert sorted(it.name for it in items) == sorted(it.name for it in _items())  # nothing lost or repeated
    plain = [it.name for it in items if it.module == "plain"]
    assert plain == [f"t{i}" for i in range(60)]  # the rest keep their order


def test_without_xdist_the_long_tests_go_first(monkeypatch):
    items = _items()
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    conftest.pytest_collection_modifyitems(_config("no"), items)
    assert [it.name for it in items[:5]] == ["report-a", "report-b", "corpus0", "corpus1", "corpus2"]


@pytest.mark.parametrize("argv, dist", [(["pytest", "-n", "16", "--dist", "worksteal", "-q"], "worksteal"),
                                        (["pytest", "-n", "16", "--dist=worksteal"], "worksteal"),
                                        (["pytest", "-n", "16"], "load")])
def test_a_worker_reads_the_scheduler_from_the_controllers_command_line(monkeypatch, argv, dist):
    """In a worker xdist sets `config.option.dist` to "no"; the order must follow the controller's scheduler."""
    worker = SimpleNamespace(option=SimpleNamespace(dist="no"), workerinput={"mainargv": argv})
    assert conftest.dist_mode(worker) == dist
    items = _items()
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    conftest.pytest_collection_modifyitems(worker, items)
    chunk = (len(items) // 4) // (1 if dist == "worksteal" else 4)
    assert [items[i * chunk].name for i in range(1, 4)] == ["corpus0", "corpus1", "corpus2"]
