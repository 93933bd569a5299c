"""``--format pt2``, ``aoti`` and ``pte`` exports, served: the program loaded by torch alone
(``torch.export.load(...).module()`` or ``torch._inductor.aoti_load_package``) or by
ExecuTorch's runtime, with at most the batch a pte program was planned for, and with the
input and output its report records, so that the protocol, batching, warm-up and canary are
the ONNX exports' own (``fwk.serve.models.Loaded``'s interface).

torch is imported only when such an export is served. Its threads are the process's:
``serve.intra_op_threads`` sets ``torch.set_num_threads``. A batch cannot be stopped half-way
(onnxruntime's ``terminate``): a batch whose callers all left runs to its end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fwk.errors import UserError
from fwk.export.edge import RUNTIME
from fwk.serve.models import DATATYPES, Export, Tensor

_NUMPY = {numpy: datatype for datatype, numpy in DATATYPES.values()}  # float32 -> FP32


def _tensor(name: str, spec: dict[str, Any]) -> Tensor:
    dtype = str(spec["dtype"])
    if dtype not in _NUMPY:
        raise UserError(f"tensor '{name}' has type {dtype}, which fwk serve cannot carry")
    longest = tuple(int(n) for n in spec.get("longest", ()))
    return Tensor(name, _NUMPY[dtype], dtype, tuple(int(n) for n in spec["shape"]), spec.get("ids"), longest)


@dataclass
class Program:
    """A pt2 or aoti export, loaded: ``run(x)`` takes a numpy batch, rows first."""

    export: Export
    module: Any
    input: Tensor
    outputs: list[Tensor] = field(default_factory=list)
    handle: None = None  # no way to stop a running batch (the batcher then passes none)

    def run(self, x: Any, options: Any = None) -> list[Any]:
        import torch

        with torch.inference_mode():
            out = self.module(torch.from_numpy(x))
        return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else (out,))]


def load_program(export: Export, intra_op_threads: int) -> Program:
    """Load the export's program with torch; refuse one whose batch axis is not free."""
    import torch

    from fwk.export.reload import loader

    report = export.report
    x = _tensor("input", report["input"])  # fwk.export.to_onnx's names, so clients see the same model
    if not x.shape or x.shape[0] != -1:
        raise UserError(f"export {export.id}: input '{x.name}' has no free batch dimension (shape {list(x.shape)})")
    if intra_op_threads > 0:
        torch.set_num_threads(intra_op_threads)
    fmt = {"aoti": "aoti", RUNTIME: "pte", "tensorrt": "tensorrt"}.get(export.runtime, "pt2")
    return Program(export, loader(fmt, export.model_file), x, [_tensor("logits", report["output"])])
