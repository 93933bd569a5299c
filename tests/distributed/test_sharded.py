"""fwk/distributed/sharded.py: what a rank holds, answered without importing the sharding libraries."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from torch import nn

from fwk.distributed.sharded import is_dtensor, is_sharded

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import sys, tempfile
    import fwk.engine.assemble, fwk.engine.evaluate, fwk.components.checkpoint  # the engine a run imports
    heavy = [m for m in ("torch.distributed.tensor", "torch.distributed.fsdp") if m in sys.modules]
    print("imported:", ",".join(heavy) or "none")
    import torch, torch.distributed as dist
    from torch import nn
    from fwk.distributed.sharded import is_dtensor, is_sharded
    store = tempfile.mktemp()
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (1,))
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    print("plain:", is_sharded(model), is_dtensor(model[0].weight))
    model[0].weight = nn.Parameter(distribute_tensor(model[0].weight.detach(), mesh, [Shard(0)]))
    print("dtensor:", is_sharded(model), is_dtensor(model[0].weight), is_dtensor(model[1].weight))
    print("fsdp:", is_sharded(fully_shard(nn.Sequential(nn.Linear(4, 4)), mesh=mesh)))
    dist.destroy_process_group()
    """
)


def test_the_engine_imports_no_sharding_library_and_still_tells_a_sharded_model() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines())
    assert lines["imported"] == "none"  # 0.5 to 1 s of a one-process run's start-up
    assert lines["plain"] == "False False"
    assert lines["dtensor"] == "True True False"
    assert lines["fsdp"] == "True"


def test_a_pipeline_stage_is_sharded_and_a_plain_model_is_not() -> None:
    model = nn.Linear(3, 3)
    assert not is_sharded(model) and not is_dtensor(model.weight)
    model.pipeline_part = True  # one stage of fwk/strategies/pipeline.py
    assert is_sharded(model)
