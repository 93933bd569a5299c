"""A model of your own that tensor parallelism can split: it says how, in ``tp_plan``.

Train it on two processes, each holding half of every layer:

    PYTHONPATH=. fwk train model._target_=my_parallel_model.ParallelMLP \\
        parallel=tp parallel.nproc_per_node=2

fwk's tensor parallelism asks the model for its plan, a dict from module names to
``torch.distributed.tensor.parallel`` styles, and checks that every parameter it names
became a DTensor. The first layer is split by its output columns and the second by its
input rows, so the hidden activations stay split between them and one all-reduce joins
the logits, the Megatron-LM pattern. Pipeline parallelism asks for ``pipeline_split(n)``
the same way; a model without one is refused for ``parallel.pp`` in one line.
"""

from __future__ import annotations

from typing import Any

from my_model import TinyMLP
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


class ParallelMLP(TinyMLP):
    """The example MLP, with its tensor-parallel plan beside it."""

    def tp_plan(self, degree: int) -> dict[str, Any]:
        """Split ``fc1`` by columns and ``fc2`` by rows over ``degree`` ranks."""
        if self.fc1.out_features % degree:
            raise ValueError(f"hidden={self.fc1.out_features} does not split over tp={degree}")
        return {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
