"""The cache of composed configs: a hit equals Hydra's composition and skips Hydra, and any
change to what a composition reads is a miss."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fwk.config import compose_cache
from fwk.config.compose import compose
from fwk.config.grammar import resources_root
from fwk.errors import UserError

OVERRIDES = ["recipe=resnet_digits", "train.max_steps=7", "optim.lr=0.01"]


def entries() -> list[Path]:
    return sorted(compose_cache.folder().glob("*.json"))


def test_a_second_composition_is_read_back_equal_to_hydras(monkeypatch: pytest.MonkeyPatch) -> None:
    first = compose(OVERRIDES)
    assert len(entries()) == 1
    calls = []
    monkeypatch.setattr("fwk.config.compose._compose", lambda o: calls.append(o))
    assert compose(OVERRIDES) == first  # from the cache: Hydra was not called
    assert calls == []
    assert first["train"]["max_steps"] == 7 and first["recipe"] == "resnet_digits"


def test_a_hit_in_a_new_process_does_not_import_hydra(decision_cache: Path) -> None:
    code = (
        "import sys, json\n"
        "from fwk.config.compose import compose\n"
        f"c = compose({OVERRIDES!r})\n"
        "print(json.dumps(['hydra' in sys.modules, c['optim']['lr']]))\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(decision_cache.parents[1])}
    argv = [sys.executable, "-c", code]
    outs = [json.loads(subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout) for _ in "ab"]
    assert outs == [[True, 0.01], [False, 0.01]]


def test_a_mistake_is_never_cached_and_says_its_line_each_time() -> None:
    for _ in range(2):
        with pytest.raises(UserError, match="train.max_stepz"):
            compose(["train.max_stepz=3"])
    assert entries() == []


def test_an_unreadable_entry_is_composed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    first = compose(OVERRIDES)
    entries()[0].write_text("{not json")
    assert compose(OVERRIDES) == first
    assert json.loads(entries()[0].read_text()) == first  # and kept again


def test_the_key_follows_the_files_the_environment_they_read_and_the_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "resources"
    for part in ("conf", "recipes"):
        shutil.copytree(resources_root() / part, root / part)
    monkeypatch.delenv("FWK_RUNS", raising=False)
    base = compose_cache.key(OVERRIDES, root)
    assert compose_cache.key(OVERRIDES, root) == base
    assert compose_cache.key([*OVERRIDES, "seed=1"], root) != base
    monkeypatch.setenv("UNRELATED_VARIABLE", "x")
    assert compose_cache.key(OVERRIDES, root) == base  # no config reads it
    monkeypatch.setenv("FWK_RUNS", "/elsewhere")  # conf/config.yaml: ${oc.env:FWK_RUNS,runs}
    assert compose_cache.key(OVERRIDES, root) != base
    monkeypatch.delenv("FWK_RUNS")
    recipe = root / "recipes" / "resnet_digits.yaml"
    recipe.write_text(recipe.read_text() + "\n# edited\n")
    assert compose_cache.key(OVERRIDES, root) != base


def test_a_config_json_would_change_is_not_kept() -> None:
    compose_cache.put("k", {"a": {1: "an int key"}})
    compose_cache.put("t", {"a": (1, 2)})
    assert entries() == []


def test_the_oldest_entries_go_past_keep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compose_cache, "KEEP", 2)
    for n, name in enumerate("abc"):
        compose_cache.put(name, {"n": n})
        os.utime(compose_cache.folder() / f"{name}.json", ns=(n * 10**9, n * 10**9))
    compose_cache.put("d", {"n": 3})
    assert [p.stem for p in entries()] == ["c", "d"]
