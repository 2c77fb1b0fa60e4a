"""The Hypothesis example database of the suite, built from environment variables (docs/database.md).

    KVFP8_HYPOTHESIS_DB          local directory (default .hypothesis/examples): read and written
    KVFP8_GITHUB_DB=owner/repo   also replay the database GPU CI uploaded (read-only; GITHUB_TOKEN)
    KVFP8_GITHUB_DB_ARTIFACT     its artifact name (default: the one .github/workflows/gpu.yml uploads)
    KVFP8_REDIS_DB=redis://...   also read and write a Redis shared by a fleet (needs `redis`)

Construction only: nothing here touches the network. Hypothesis downloads the artifact at the first
fetch (then caches it a day), and redis-py connects at the first command.

Also a pytest plugin (conftest.py's pytest_plugins) that keys every property's examples by its node
id, as HypoFuzz does (tools/fuzz.py). PYTEST_DONT_REWRITE: conftest.py imports this module before
pytest registers it, too late for assertion rewriting (it has no asserts); the marker silences the
warning about that.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis.database import (
    DirectoryBasedExampleDatabase,
    ExampleDatabase,
    GitHubArtifactDatabase,
    MultiplexedDatabase,
    ReadOnlyDatabase,
)

DIR_ENV = "KVFP8_HYPOTHESIS_DB"
GITHUB_ENV = "KVFP8_GITHUB_DB"
ARTIFACT_ENV = "KVFP8_GITHUB_DB_ARTIFACT"
REDIS_ENV = "KVFP8_REDIS_DB"
DEFAULT_DIR = ".hypothesis/examples"
#: The artifact .github/workflows/gpu.yml uploads. Hypothesis takes the newest artifact of this name
#: in the whole repository, so the name must be unique to that workflow's database.
DEFAULT_ARTIFACT = "kvfp8-gpu-hypothesis-db"
ARTIFACT_CACHE = Path(".hypothesis/github-artifacts")
REDIS_PREFIX = b"kvfp8-hypothesis:"  # a Redis shared with other projects keeps their keys apart


def github_database(spec: str, env: Mapping[str, str] = os.environ) -> GitHubArtifactDatabase:
    """The artifact database of `spec` ("owner/repo"), its download cached per process."""
    owner, _, repo = spec.partition("/")
    if not owner or not repo or "/" in repo:
        raise ValueError(f"${GITHUB_ENV} must be owner/repo, got {spec!r}")
    artifact = env.get(ARTIFACT_ENV) or DEFAULT_ARTIFACT
    # One cache folder per xdist worker: Hypothesis deletes older zips of its folder at first fetch,
    # and workers doing that in one folder at once race (FileNotFoundError). A download is small.
    cache = ARTIFACT_CACHE / artifact / env.get("PYTEST_XDIST_WORKER", "main")
    return GitHubArtifactDatabase(owner, repo, artifact_name=artifact, path=cache)


def redis_database(url: str) -> ExampleDatabase:
    """A RedisExampleDatabase at `url`; a clear error when the redis package is not installed."""
    try:
        from hypothesis.extra.redis import RedisExampleDatabase
        from redis import Redis
    except ImportError as exc:
        raise ImportError(f"${REDIS_ENV} is set, but the `redis` package is not importable ({exc}); "
                          f"pip install redis, or unset ${REDIS_ENV}") from exc
    return RedisExampleDatabase(Redis.from_url(url), key_prefix=REDIS_PREFIX)


def example_database(env: Mapping[str, str] = os.environ) -> ExampleDatabase:
    """The local directory database, multiplexed with the shared ones the environment names."""
    databases: list[ExampleDatabase] = [DirectoryBasedExampleDatabase(env.get(DIR_ENV) or DEFAULT_DIR)]
    if env.get(REDIS_ENV):
        databases.append(redis_database(env[REDIS_ENV]))
    if env.get(GITHUB_ENV):
        # read-only: a local or branch run must never delete what CI found
        databases.append(ReadOnlyDatabase(github_database(env[GITHUB_ENV], env)))
    return databases[0] if len(databases) == 1 else MultiplexedDatabase(*databases)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """Give each @given test item the database key HypoFuzz gives it: the digest of its node id.

    Hypothesis's pytest plugin adds the node id only for @pytest.mark.parametrize or fixtures with
    params, not for the suite's `impl` and `recipe` (metafunc.parametrize in conformance/session.py).
    Then every recipe of a property shares one key, a failure HypoFuzz finds (under the node id's
    key) never replays under pytest, and the first recipe to replay another recipe's failing example
    sees it pass and deletes it. Runs after Hypothesis's hookwrapper has set its own key.
    """
    inner = getattr(getattr(getattr(item, "obj", None), "hypothesis", None), "inner_test", None)
    if isinstance(item, pytest.Function) and inner is not None:
        inner._hypothesis_internal_add_digest = item.nodeid.encode()
