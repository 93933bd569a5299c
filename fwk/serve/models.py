"""Exports on disk, loaded into onnxruntime sessions with their input and output metadata.

An export is ``<runs root>/<run id>/exports/<export id>/`` holding ``export_report.json``
(ONNX), or ``weights_report.json`` with a ``runtime`` (``--format pt2``, ``aoti`` or ``pte``: loaded
by ``fwk.serve.programs``); the report's ``final`` names the model file to serve (int8.onnx,
fp32.onnx, model.pt2, ...). Export ids hash their parent run, so they are unique across runs.
A user names an export by its id, by a run id (then the run's newest export), or by a unique
prefix of either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fwk.errors import UserError
from fwk.serve.limits import read as read_limits
from fwk.track.lookup import closest

REPORT = "export_report.json"  # fwk/export/report.py's REPORT; not imported: it is torch-free, but keep serve light
PROGRAM_REPORT = "weights_report.json"  # fwk/export/weights.py's REPORT: servable when it names a runtime
ONNX = "onnxruntime"

# onnxruntime's tensor types -> the v2 protocol's datatypes and numpy's
DATATYPES = {
    "tensor(float)": ("FP32", "float32"),
    "tensor(float16)": ("FP16", "float16"),
    "tensor(double)": ("FP64", "float64"),
    "tensor(int64)": ("INT64", "int64"),
    "tensor(int32)": ("INT32", "int32"),
    "tensor(int16)": ("INT16", "int16"),
    "tensor(int8)": ("INT8", "int8"),
    "tensor(uint8)": ("UINT8", "uint8"),
    "tensor(bool)": ("BOOL", "bool"),
}


@dataclass(frozen=True)
class Export:
    """One finished export on disk."""

    id: str
    run_id: str
    path: Path
    report: dict[str, Any]

    @property
    def recipe(self) -> str:
        return str(self.report.get("recipe") or self.report.get("model") or "model")

    @property
    def model_file(self) -> Path:
        return self.path / self.report["final"]

    @property
    def created(self) -> str:
        return str(self.report.get("created", ""))

    @property
    def runtime(self) -> str:
        return str(self.report.get("runtime", ONNX))

    @property
    def max_batch(self) -> int | None:
        """The largest batch the export takes, when it has one: a pte program's memory is planned for it."""
        bound = self.report.get("max_batch")
        return int(bound) if bound else None

    @property
    def passed(self) -> tuple[bool, str]:
        """Whether it passed its verification, and the reason it did not."""
        if self.runtime == ONNX:
            verdict = self.report.get("verdict") or {}
            return bool(verdict.get("passed", False)), str(verdict.get("reason", "no verdict"))
        diff = f"max abs diff {self.report.get('max_abs_diff')} > {self.report.get('tolerance')}"
        return bool(self.report.get("passed", False)), str(self.report.get("reason") or diff)


def all_exports(root: Path) -> list[Export]:
    """List every export under ``root`` with a readable report, oldest first."""
    found = []
    for report in sorted([*root.glob(f"*/exports/*/{REPORT}"), *root.glob(f"*/exports/*/{PROGRAM_REPORT}")]):
        try:
            data = json.loads(report.read_text())
        except (OSError, ValueError):
            continue  # half-written or edited by hand: not servable, and not ours to report here
        if report.name == PROGRAM_REPORT and not data.get("runtime"):
            continue  # weights for other tools (hf, safetensors): nothing to serve
        found.append(Export(report.parent.name, report.parent.parent.parent.name, report.parent, data))
    return sorted(found, key=lambda e: (e.created, e.path.stat().st_mtime))


def _servable(e: Export) -> Export:
    passed, reason = e.passed
    if not passed:
        raise UserError(f"export {e.id} failed its verification ({reason}); serve another export")
    if not e.model_file.is_file():
        raise UserError(f"export {e.id} has no {e.report['final']} in {e.path}; export the run again")
    return e


def find_export(root: Path, query: str | None) -> Export:
    """Find the export ``query`` names: an export id, a run id for its newest export, or a
    unique prefix of one."""
    exports = all_exports(root)
    if not exports:
        raise UserError(
            f"no exports under {root}; make one with `fwk export RUN_ID` (or set FWK_RUNS / paths.runs=DIR)"
        )
    if query is None:
        return _servable(exports[-1])
    runs = sorted({e.run_id for e in exports} | {p.name for p in root.iterdir() if (p / "config.yaml").is_file()})
    for same in (lambda i: i == query, lambda i: i.startswith(query)):
        hit_exports = [e for e in exports if same(e.id)]
        hit_runs = [r for r in runs if same(r)]
        if len(hit_exports) + len(hit_runs) > 1:
            names = [f"export {e.id} (run {e.run_id})" for e in hit_exports] + [f"run {r}" for r in hit_runs]
            shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            raise UserError(f"'{query}' matches {len(names)} ids ({shown}); give more characters")
        if hit_exports:
            return _servable(hit_exports[0])
        if hit_runs:
            of_run = [e for e in exports if e.run_id == hit_runs[0]]
            if not of_run:
                raise UserError(f"run {hit_runs[0]} has no exports; make one with `fwk export {hit_runs[0]}`")
            return _servable(of_run[-1])
    near = ", ".join(closest(query, [e.id for e in exports] + runs))
    raise UserError(f"no export or run '{query}' under {root}; closest ids: {near}")


@dataclass(frozen=True)
class Tensor:
    """A model input or output as the v2 protocol describes it: -1 for a free dimension."""

    name: str
    datatype: str  # v2: FP32, INT64, ...
    dtype: str  # numpy
    shape: tuple[int, ...]
    ids: int | None = None  # an integer input that indexes an embedding table: its rows (valid ids 0..ids-1)
    longest: tuple[int, ...] = ()  # per dimension, the most a position table allows (-1: any); () none known

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def _tensor(arg: Any) -> Tensor:
    if arg.type not in DATATYPES:
        raise UserError(f"tensor '{arg.name}' has type {arg.type}, which fwk serve cannot carry")
    datatype, dtype = DATATYPES[arg.type]
    shape = tuple(d if isinstance(d, int) and d > 0 else -1 for d in arg.shape)
    return Tensor(arg.name, datatype, dtype, shape)


@dataclass
class Loaded:
    """An export loaded in an onnxruntime session.

    run(x) takes a batch of the one input, rows first. ``options``, from ``handle()``, lets
    another thread stop that run with ``options.terminate = True``."""

    export: Export
    session: Any
    input: Tensor
    outputs: list[Tensor] = field(default_factory=list)

    def run(self, x: Any, options: Any = None) -> list[Any]:
        return self.session.run(None, {self.input.name: x}, options)

    @staticmethod
    def handle() -> Any:
        import onnxruntime as ort

        return ort.RunOptions()


def load(export: Export, intra_op_threads: int) -> Loaded:
    """Open an onnxruntime CPU session of the export's final model. Refuse models it cannot
    batch. (A pt2 or aoti export: ``fwk.serve.programs.load_program``.)"""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra_op_threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(export.model_file), opts, providers=["CPUExecutionProvider"])
    inputs = [_tensor(a) for a in session.get_inputs()]
    if len(inputs) != 1:
        raise UserError(f"export {export.id} has {len(inputs)} inputs; fwk serve serves models with one input")
    (x,) = inputs
    if not x.shape or x.shape[0] != -1:
        raise UserError(f"export {export.id}: input '{x.name}' has no free batch dimension (shape {list(x.shape)})")
    if x.dtype.startswith(("int", "uint")):
        limits = read_limits(export.model_file, x.name, len(x.shape))
        x = replace(x, ids=limits.ids, longest=limits.longest)
    return Loaded(export, session, x, [_tensor(a) for a in session.get_outputs()])


def example(tensor: Tensor, rows: int, seed: int = 0) -> Any:
    """Make a batch of ``rows`` for warm-up: standard normal values, small ones for ints, and
    free dims as 1."""
    import numpy as np

    shape = (rows, *[d if d > 0 else 1 for d in tensor.shape[1:]])
    rng = np.random.default_rng(seed)
    if tensor.dtype.startswith(("float",)):
        return rng.standard_normal(shape).astype(tensor.dtype)
    if tensor.dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 2, shape).astype(tensor.dtype)
