"""Run ids are content hashes: same config and code -> same id; storage paths don't count."""

import re

from fwk.track.run_id import code_version, run_id

CFG = {"seed": 0, "optim": {"lr": 0.1}, "paths": {"runs": "/a"}}


def test_same_config_same_id() -> None:
    assert run_id(CFG, "git:abc") == run_id(dict(CFG), "git:abc")
    assert re.fullmatch(r"[0-9a-f]{10}", run_id(CFG, "git:abc"))


def test_paths_do_not_change_the_id() -> None:
    assert run_id({**CFG, "paths": {"runs": "/b"}}, "git:abc") == run_id(CFG, "git:abc")


def test_tags_do_not_change_the_id() -> None:
    # tags label a run; the same training with other tags is the same run
    assert run_id({**CFG, "tags": ["baseline"]}, "git:abc") == run_id({**CFG, "tags": []}, "git:abc")


def test_seed_config_and_code_change_the_id() -> None:
    base = run_id(CFG, "git:abc")
    assert run_id({**CFG, "seed": 1}, "git:abc") != base
    assert run_id({**CFG, "optim": {"lr": 0.2}}, "git:abc") != base
    assert run_id(CFG, "git:abd") != base


def test_code_version_format() -> None:
    assert re.fullmatch(r"git:[0-9a-f]{12}(\+dirty\.[0-9a-f]{10})?|fwk \S+", code_version())


def test_rendezvous_location_does_not_change_the_id() -> None:
    # a requeued SLURM job meets on another host; static rendezvous gives each node its rank
    cfg = {**CFG, "parallel": {"nnodes": 2, "rdzv_endpoint": "node0:15001", "node_rank": 0}}
    moved = {**CFG, "parallel": {"nnodes": 2, "rdzv_endpoint": "node7:15001", "node_rank": 1}}
    assert run_id(moved, "git:abc") == run_id(cfg, "git:abc")
    # nor do the node and process counts: the global batch is the same on any, and a run resumes on another
    resized = {**CFG, "parallel": {"nnodes": 4, "nproc_per_node": 8, "rdzv_endpoint": "node0:15001"}}
    assert run_id(resized, "git:abc") == run_id(cfg, "git:abc")
    # nor does the layout: the same model and global batch, resharded by its checkpoints
    layout = {"nnodes": 2, "name": "pp", "pp": 2, "tp": 2, "pp_schedule": "gpipe", "pp_microbatches": 8}
    assert run_id({**CFG, "parallel": layout}, "git:abc") == run_id(cfg, "git:abc")


def test_tracking_does_not_change_the_id() -> None:
    # where results are sent (TensorBoard, an MLflow server) is not what a run computes
    mlflow = {**CFG, "tracking": {"name": "mlflow", "mlflow": True, "uri": "http://127.0.0.1:5000"}}
    assert run_id(mlflow, "git:abc") == run_id({**CFG, "tracking": {"name": "tensorboard"}}, "git:abc")


def test_data_fingerprint_and_salt_change_the_id() -> None:
    base = run_id(CFG, "git:abc")
    assert run_id(CFG, "git:abc", data="") == base  # nothing to fingerprint: the id of before
    assert run_id(CFG, "git:abc", data="09f66e6debdee2cd") != base
    assert run_id(CFG, "git:abc", data="09f66e6debdee2cd") != run_id(CFG, "git:abc", data="09f66e6debdee2ce")
    assert run_id(CFG, "git:abc", salt="replay of x") != base
