"""The job's one ``DeviceMesh``, built from its degrees (``dims.py``), and its slices.

Every technique takes its dimensions from this one root mesh, as torchtitan's
``ParallelDims.build_mesh`` does: FSDP over a tensor-parallel mesh needs both to be slices
of the same mesh. Dimensions of size 1 are kept, so every name can be sliced whatever the
layout.
"""

from __future__ import annotations

import torch
import torch.distributed as tdist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from fwk.distributed.dims import NAMES, Dims


def build(dims: Dims, device: torch.device) -> DeviceMesh:
    """Build the root mesh (pp, dp_replicate, dp_shard, tp). It is a collective, called once by every rank."""
    return init_device_mesh(device.type, tuple(getattr(dims, n) for n in NAMES), mesh_dim_names=NAMES)


def data_mesh(root: DeviceMesh, dims: Dims) -> DeviceMesh:
    """Return the data-parallel slice FSDP shards over. It is (dp_replicate, dp_shard) for HSDP,
    else the one dimension that is larger than 1, or dp_shard."""
    if dims.dp_replicate > 1 and dims.dp_shard > 1:
        return root["dp_replicate", "dp_shard"]
    return root["dp_replicate"] if dims.dp_replicate > 1 and dims.dp_shard == 1 else root["dp_shard"]


def group(root: DeviceMesh, name: str) -> tdist.ProcessGroup:
    """Return the process group of this rank's peers along one dimension."""
    return root.get_group(name)


def data_group(root: DeviceMesh, dims: Dims) -> tdist.ProcessGroup:
    """Return the group of the ranks that hold the same part of the model and take different batches."""
    if dims.dp_replicate > 1 and dims.dp_shard > 1:
        return root["dp_replicate", "dp_shard"]._flatten("dp").get_group()
    return root.get_group("dp_replicate" if dims.dp_replicate > 1 else "dp_shard")
