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
