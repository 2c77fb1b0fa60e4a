"""conformance.database: every combination of environment variables builds, without any network."""

from __future__ import annotations

import sys
import types
from datetime import datetime, timezone
from pathlib import Path
from zipfile import ZipFile

import pytest
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    GitHubArtifactDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)

from conformance.database import DEFAULT_ARTIFACT, DEFAULT_DIR, example_database

WORKFLOW = Path(__file__).resolve().parent.parent / ".github" / "workflows" / "gpu.yml"


class FakeRedis:
    """Stands in for redis.Redis: from_url builds a client and never connects."""

    def __init__(self, url: str) -> None:
        self.url = url

    @classmethod
    def from_url(cls, url: str) -> FakeRedis:
        return cls(url)


@pytest.fixture
def fake_redis(monkeypatch):
    module = types.ModuleType("redis")
    module.Redis = FakeRedis
    monkeypatch.setitem(sys.modules, "redis", module)
    saved = sys.modules.pop("hypothesis.extra.redis", None)  # so that it imports the fake
    yield
    sys.modules.pop("hypothesis.extra.redis", None)
    if saved is not None:
        sys.modules["hypothesis.extra.redis"] = saved


def _parts(db):
    return list(db._wrapped) if isinstance(db, MultiplexedDatabase) else [db]


def test_default_is_the_local_directory():
    db = example_database({})
    assert isinstance(db, DirectoryBasedExampleDatabase), db
    assert db == DirectoryBasedExampleDatabase(DEFAULT_DIR)


def test_directory_from_the_environment(tmp_path):
    db = example_database({"KVFP8_HYPOTHESIS_DB": str(tmp_path / "db")})
    assert db == DirectoryBasedExampleDatabase(tmp_path / "db")


def test_github_is_read_only_and_multiplexed_with_local(tmp_path):
    db = example_database({"KVFP8_HYPOTHESIS_DB": str(tmp_path), "KVFP8_GITHUB_DB": "acme/kvfp8",
                           "PYTEST_XDIST_WORKER": "gw2"})
    local, shared = _parts(db)
    assert local == DirectoryBasedExampleDatabase(tmp_path)
    assert isinstance(shared, ReadOnlyDatabase), shared
    gh = shared._wrapped
    assert isinstance(gh, GitHubArtifactDatabase), gh
    assert (gh.owner, gh.repo, gh.artifact_name) == ("acme", "kvfp8", DEFAULT_ARTIFACT)
    assert gh.path.parts[-2:] == (DEFAULT_ARTIFACT, "gw2"), f"one download cache per worker: {gh.path}"
    assert not gh._initialized, "construction must not download"
    shared.save(b"k", b"v")  # a no-op, never GitHubArtifactDatabase's RuntimeError


def test_github_artifact_name_override():
    db = example_database({"KVFP8_GITHUB_DB": "acme/kvfp8", "KVFP8_GITHUB_DB_ARTIFACT": "nightly-db"})
    assert _parts(db)[1]._wrapped.artifact_name == "nightly-db"


@pytest.mark.parametrize("spec", ["acme", "acme/", "/kvfp8", "acme/kvfp8/extra"])
def test_github_spec_must_be_owner_slash_repo(spec: str):
    with pytest.raises(ValueError, match="owner/repo"):
        example_database({"KVFP8_GITHUB_DB": spec})


def test_redis_missing_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # import redis raises ImportError
    monkeypatch.delitem(sys.modules, "hypothesis.extra.redis", raising=False)
    with pytest.raises(ImportError, match="KVFP8_REDIS_DB is set.*pip install redis"):
        example_database({"KVFP8_REDIS_DB": "redis://fleet:6379/0"})


def test_redis_then_github_all_three(fake_redis, tmp_path):
    from hypothesis.extra.redis import RedisExampleDatabase

    db = example_database({"KVFP8_HYPOTHESIS_DB": str(tmp_path), "KVFP8_REDIS_DB": "redis://fleet:6379/0",
                           "KVFP8_GITHUB_DB": "acme/kvfp8"})
    local, fleet, shared = _parts(db)
    assert local == DirectoryBasedExampleDatabase(tmp_path)
    assert isinstance(fleet, RedisExampleDatabase) and fleet.redis.url == "redis://fleet:6379/0", fleet
    assert isinstance(shared, ReadOnlyDatabase), shared


def test_equal_environments_give_equal_databases(tmp_path):
    # HypoFuzz fuzzes only tests whose database equals settings().database
    env = {"KVFP8_HYPOTHESIS_DB": str(tmp_path), "KVFP8_GITHUB_DB": "acme/kvfp8"}
    assert example_database(env) == example_database(env)


def test_the_workflow_uploads_the_artifact_the_database_reads():
    text = WORKFLOW.read_text()
    assert f"name: {DEFAULT_ARTIFACT}\n" in text, f"{WORKFLOW.name} must upload the database as {DEFAULT_ARTIFACT}"


def test_an_artifact_laid_out_like_gpu_ci_uploads_it_replays(tmp_path, monkeypatch):
    """upload-artifact zips the contents of ci-out/hypothesis-db/ (a DirectoryBasedExampleDatabase);
    a fresh zip in the download cache (no network) must yield what CI saved."""
    ci = DirectoryBasedExampleDatabase(tmp_path / "hypothesis-db")
    ci.save(b"test-key", b"failing-example")
    monkeypatch.chdir(tmp_path)  # the download cache is .hypothesis/github-artifacts/... under the cwd
    db = example_database({"KVFP8_HYPOTHESIS_DB": str(tmp_path / "local"), "KVFP8_GITHUB_DB": "acme/kvfp8"})
    gh = _parts(db)[1]._wrapped
    gh.path.mkdir(parents=True)
    stamp = datetime.now(timezone.utc).isoformat().replace(":", "_")  # Hypothesis's cache file name
    with ZipFile(gh.path / f"{stamp}.zip", "w") as zf:
        for f in (tmp_path / "hypothesis-db").rglob("*"):
            if f.is_file():
                zf.write(f, f.relative_to(tmp_path / "hypothesis-db").as_posix())
    assert list(db.fetch(b"test-key")) == [b"failing-example"]
    db.delete(b"test-key", b"failing-example")  # deletes locally; the artifact keeps it
    assert list(db.fetch(b"test-key")) == [b"failing-example"]
