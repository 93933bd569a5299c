"""The torchrun command line for one machine and for many."""

from pathlib import Path

from fwk.config.schema import ParallelConfig
from fwk.launch.torchrun import torchrun_argv


def test_single_node_is_standalone() -> None:
    argv = torchrun_argv(ParallelConfig(nproc_per_node=4), Path("/runs/abc"), "abc")
    assert argv[1:] == [
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=4",
        "--standalone",
        "-m",
        "fwk.launch.worker",
        "/runs/abc",
    ]


def test_multi_node_uses_rendezvous() -> None:
    cfg = ParallelConfig(nproc_per_node=8, nnodes=2, rdzv_endpoint="node0:29400")
    argv = torchrun_argv(cfg, Path("/runs/abc"), "abc")
    assert "--nnodes=2" in argv and "--rdzv-endpoint=node0:29400" in argv and "--rdzv-id=abc" in argv
    assert "--standalone" not in argv and not any(a.startswith("--node-rank") for a in argv)


def test_static_rendezvous_passes_node_rank() -> None:
    cfg = ParallelConfig(nproc_per_node=2, nnodes=2, node_rank=1, rdzv_backend="static")
    assert "--node-rank=1" in torchrun_argv(cfg, Path("/r"), "r")


def test_an_elastic_range_passes_min_max_and_restarts() -> None:
    cfg = ParallelConfig(nproc_per_node=2, nnodes=4, min_nnodes=2, rdzv_endpoint="node0:29400", rdzv_last_call_s=10)
    argv = torchrun_argv(cfg, Path("/r"), "r")
    assert "--nnodes=2:4" in argv and "--max-restarts=3" in argv  # a lost machine takes one restart
    assert "--rdzv-conf=last_call_timeout=10,keep_alive_interval=2" in argv
    fixed = torchrun_argv(ParallelConfig(nproc_per_node=2, nnodes=4, min_nnodes=4), Path("/r"), "r")
    assert "--nnodes=4" in fixed and not any(a.startswith(("--max-restarts", "--rdzv-conf")) for a in fixed)
