"""``fwk profile --graph``: the model graph before and after the JIT layer's optimizations.

Before: the graph TorchDynamo captures from the model's forward (what ``torch.compile``
starts from). After: the kernels ``torch.compile`` (the JIT layer's backend and mode)
generates for one training step, forward and backward: each fused kernel with the ops it
fused (inductor names a kernel after them, and notes the graph nodes it came from), and
the library calls left as they were (convolutions, matmuls). Evaluation and export also
fold Conv->BatchNorm pairs (``fwk.export.fuse``): the folded pairs are listed too.

The model is the plain one (fp32, no precision or memory strategy), on the training device,
with one training batch. A compile that fails leaves the "after" side with its error.
One self-contained HTML file: no script, no server.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fwk.config.schema import Config

logger = logging.getLogger(__name__)

_KERNEL = re.compile(r"^\s*(?:\w+ = )?((?:cpp|triton)_\w*fused_\w+?)(?:\.run)?\(")
_LIBRARY = re.compile(r"^\s*(?:\w+ = )?(extern_kernels\.\w+|torch\.ops\.aten\.\w+(?:\.\w+)?)\(")
_SOURCE = re.compile(r"# (?:Topologically Sorted )?Source Nodes: \[(.*?)\], Original ATen: \[(.*?)\]")


def before_graph(model: nn.Module, x: torch.Tensor) -> list[dict[str, Any]]:
    """List the FX nodes TorchDynamo captures from ``model(x)``, leaving out placeholders."""
    graphs: list[torch.fx.GraphModule] = []

    def record(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(model, backend=record, dynamic=False)(x)
    nodes = []
    for gm in graphs:
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "output", "get_attr"):
                continue
            stack = node.meta.get("nn_module_stack") or {}
            module = next(reversed(stack.values()))[0] if stack else ""
            value = node.meta.get("example_value")
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else ""
            target = getattr(node.target, "__name__", str(node.target))
            nodes.append({"name": node.name, "op": target, "module": _module_name(module), "shape": str(shape)})
    return nodes


def _module_name(dynamo_path: str) -> str:
    """Turn Dynamo's ``L['self'].features[0]`` into ``features.0``."""
    path = re.sub(r"^L\['self'\]\.?", "", dynamo_path)
    path = re.sub(r"\[(\d+)\]", r".\1", path).replace("._modules['", ".").replace("']", "")
    return path.strip(".")


def after_kernels(code: str) -> list[dict[str, Any]]:
    """List the kernel and library calls, in order, of one generated module's ``call``."""
    calls, pending = [], None
    for line in code.splitlines():
        source = _SOURCE.search(line)
        if source:
            pending = {"nodes": source.group(1), "aten": source.group(2)}
            continue
        kernel, library = _KERNEL.match(line), _LIBRARY.match(line)
        if kernel:
            name = kernel.group(1)
            ops = re.sub(r"(^|_)\d+$", "", name.split("fused_", 1)[-1])  # cpp_fused_relu_1 -> relu
            calls.append({"kind": "fused", "name": name, "ops": ops or "(layout copy)", **(pending or {})})
        elif library:
            name = library.group(1)
            op = name.split(".")[3] if name.startswith("torch.ops.") else name.split(".")[-1]
            calls.append({"kind": "library", "name": name, "ops": op, **(pending or {})})
        if kernel or library:
            pending = None
    return calls


def folded_pairs(model: nn.Module) -> list[str]:
    """Find the Conv->BatchNorm pairs that evaluation and export fold into one conv."""
    from fwk.export.fuse import fold_conv_bn

    norms = {n for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    left = {n for n, m in fold_conv_bn(model).named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)}
    return sorted(norms - left)


def _batch(cfg: Config) -> tuple[nn.Module, torch.Tensor, torch.Tensor, torch.device]:
    from fwk.data.build import build_data
    from fwk.distributed.group import pick_device
    from fwk.models.build import build_model

    torch.manual_seed(cfg.seed)
    data = build_data(cfg.data, seed=cfg.seed)
    device = pick_device(cfg.train.device, 0)
    model = build_model(cfg.model, data, init=False).to(device).train()
    n = min(cfg.train.batch_size // cfg.world_size, len(data.train))
    items = [data.train[i] for i in range(n)]
    x = torch.stack([torch.as_tensor(a) for a, _ in items]).to(device)
    y = torch.stack([torch.as_tensor(b) for _, b in items]).to(device)
    return model, x, y, device


def _compiled_code(cfg: Config, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[str]:
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    compiled = torch.compile(model, mode=cfg.jit.mode, backend=cfg.jit.backend, dynamic=False)

    def step() -> torch.Tensor:
        out = compiled(x)
        loss = nn.functional.cross_entropy(out.flatten(0, -2), y.flatten())  # (B, C) or (B, T, V)
        loss.backward()
        return loss

    _, codes = run_and_get_code(step)
    return codes


def write_graph(cfg: Config, out: Path) -> Path:
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    model, x, y, device = _batch(cfg)
    logger.info(f"--graph: capturing the graph and compiling one training step (torch.compile {cfg.jit.backend})")
    before = before_graph(model, x)
    started = time.perf_counter()
    try:
        codes = _compiled_code(cfg, model, x, y)
        parts = [after_kernels(code) for code in codes]
        error = None
    except Exception as exc:  # a compiler missing or failing: the "before" side still stands
        parts, error = [], f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    seconds = time.perf_counter() - started
    folded = folded_pairs(model)
    path = out / "graph.html"
    path.write_text(_html(cfg, device, before, parts, folded, error, seconds), encoding="utf-8")
    torch._dynamo.reset()
    return path


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ddd;padding:2px 8px;font-size:13px}
th{background:#f3f3f3;text-align:left}.fused{background:#fff1dc}.library{background:#e6f0ff}
.cols{display:flex;gap:2em;align-items:flex-start}code{font-size:12px}
"""


def _html(
    cfg: Config,
    device: torch.device,
    before: list[dict[str, Any]],
    parts: list[list[dict[str, Any]]],
    folded: list[str],
    error: str | None,
    seconds: float,
) -> str:
    rows_before = "".join(
        f"<tr><td>{i}</td><td><code>{escape(n['name'])}</code></td><td><code>{escape(n['op'])}</code></td>"
        f"<td>{escape(n['module'])}</td><td>{escape(n['shape'])}</td></tr>"
        for i, n in enumerate(before, 1)
    )
    names = ["forward", "backward"] + [f"graph {i}" for i in range(3, len(parts) + 1)]
    after = ""
    for name, calls in zip(names, parts, strict=False):
        fused = sum(c["kind"] == "fused" for c in calls)
        after += f"<h3>{name}: {fused} fused kernels, {len(calls) - fused} library calls</h3><table>"
        after += "<tr><th>#</th><th>kernel</th><th>ops it runs</th><th>from graph nodes</th></tr>"
        after += "".join(
            f"<tr class='{c['kind']}'><td>{i}</td><td><code>{escape(c['name'])}</code></td><td>{escape(c['ops'])}</td>"
            f"<td><code>{escape(c.get('nodes', ''))}</code></td></tr>"
            for i, c in enumerate(calls, 1)
        )
        after += "</table>"
    if error:
        after += f"<p><b>torch.compile failed</b>: <code>{escape(error)}</code></p>"
    folds = (
        "<ul>" + "".join(f"<li>{escape(n)} folded into the conv before it</li>" for n in folded) + "</ul>"
        if folded
        else "<p>none (no Conv->BatchNorm pairs)</p>"
    )
    total_fused = sum(c["kind"] == "fused" for calls in parts for c in calls)
    summary = (
        f"{len(before)} ops in the captured forward graph; torch.compile ({escape(cfg.jit.backend)}, mode "
        f"{escape(cfg.jit.mode)}) ran one training step as {total_fused} fused kernels and "
        f"{sum(len(p) for p in parts) - total_fused} library calls (compiled in {seconds:.1f} s on {device.type})"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>fwk profile --graph: {escape(cfg.recipe)}</title>"
        f"<style>{_CSS}</style></head><body><h1>Model graph: {escape(cfg.recipe)}</h1><p>{summary}. "
        f"The plain model in fp32; this run trains with jit={escape(cfg.jit.name)}.</p><div class='cols'>"
        f"<div><h2>Before: the captured graph</h2><table><tr><th>#</th><th>node</th><th>op</th><th>module</th>"
        f"<th>shape</th></tr>{rows_before}</table></div>"
        f"<div><h2>After: generated kernels</h2>{after}<h2>Folded for evaluation and export</h2>{folds}</div>"
        f"</div></body></html>\n"
    )
