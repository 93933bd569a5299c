"""`fwk export`: turn a finished run into a verified model file: ONNX (pruned, quantized), a torch.export
program, an AOTInductor package, or weights for other tools."""

from __future__ import annotations

from pathlib import Path

import typer

_OPTIONS = (
    "--format, --prune, --ratio, --rounds, --quantize, --qat-steps, --output, --max-accuracy-drop, --overwrite, "
    "--exits/--no-exits, --trust-config"
)


def export(
    args: list[str] | None = typer.Argument(
        None,
        metavar="[RUN_ID] [OVERRIDES]...",
        help="A run id or a unique prefix of one (default: the newest complete run), then overrides of the "
        "export group: export.KEY=VALUE, export=OPTION; paths.runs=DIR for runs trained under another root.",
        show_default=False,
    ),
    fmt: str = typer.Option(
        "onnx",
        "--format",
        help="onnx (pruned, quantized, verified), pt2 (a torch.export program, dynamic batch), aoti (that "
        "program compiled ahead of time by AOTInductor: native code, loadable from C++), pte (an ExecuTorch program "
        "for phones and edge boards, XNNPACK; takes --prune and --quantize int8), hf (a model=hf run as "
        "the folder save_pretrained writes, loadable by transformers' AutoModelFor*), or safetensors (the raw "
        "weights of any model).",
    ),
    prune: str = typer.Option(
        "none",
        "--prune",
        help="Structured pruning first: none, magnitude or taylor (one shot per round, then a fine-tune), or "
        "lottery_ticket (rounds of pruning, rewinding to the run's early weights and retraining).",
    ),
    ratio: float = typer.Option(0.5, "--ratio", help="Share of channels (and attention heads) to remove, in (0, 1)."),
    rounds: int | None = typer.Option(
        None, "--rounds", help="Pruning rounds that reach --ratio together (default: 3 for lottery_ticket, else 1)."
    ),
    quantize: str | None = typer.Option(
        None,
        "--quantize",
        help="none, int8 (static QDQ, calibrated on training batches: conv nets; the default), dynamic_int8 "
        "(transformers) or fp16. --format pte: none (the default) or int8 (PT2E, XNNPACK's quantizer).",
    ),
    output: Path | None = typer.Option(
        None, "--output", help="Also write the final model to this path (refused if it exists, unless --overwrite)."
    ),
    max_accuracy_drop: float = typer.Option(
        1.0,
        "--max-accuracy-drop",
        help="Largest accepted loss against torch fp32: accuracy points (language models: % rise of the "
        "validation loss). Beyond it: exit 1, naming the stage; the artifacts are kept.",
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an earlier export at --output (nothing else)."),
    trust_config: bool = typer.Option(
        False,
        "--trust-config",
        help="Build a recorded config's nested _target_ and trust_remote_code: only a config you wrote.",
    ),
    exits: bool = typer.Option(
        True,
        "--exits/--no-exits",
        help="A run trained with methods=[early_exit]: --format onnx, pt2 and aoti carry its exit heads and "
        "calibrated threshold (a batch stops at the first exit where all its rows are confident); --no-exits "
        "exports the model without them.",
    ),
    qat_steps: str = typer.Option(
        "0",
        "--qat-steps",
        help="--quantize int8: fine-tune N steps with fake int8 quantization (quantization-aware training) "
        "and export int8-qat.onnx with the learned ranges; auto: only when PTQ int8 loses more than "
        "--max-accuracy-drop (export.qat_frac of the run's steps); 0: off.",
    ),
) -> None:
    """Export a trained run to a pruned, quantized ONNX model, verified stage by stage.

    Prunes channels and heads (retraining through the engine), folds BatchNorms, exports
    ONNX, optimizes the graph, quantizes, then measures every stage on the validation set
    (accuracy, agreement, output difference, size, MACs, latency) and writes
    runs/<id>/exports/<export-id>/ with export_report.json.
    """
    from fwk.config.trust import trust
    from fwk.export.formats import Request, get

    trust(trust_config)

    words, ids = _words(args, fmt)
    request = Request(
        ids, words, output, overwrite, prune, ratio, rounds, quantize, max_accuracy_drop, qat_steps, exits
    )
    get(fmt).export(request)


def _words(args: list[str] | None, fmt: str) -> tuple[list[str], list[str]]:
    """Refuse unknown flags, several run ids and an unknown format, and return the words and
    the run ids."""
    from fwk.errors import UserError
    from fwk.export.formats import names

    # the user's mistakes first, before anything slow is imported
    words = list(args or [])
    flags = [w for w in words if w.startswith("-")]
    if flags:
        raise UserError(f"unknown option '{flags[0]}' for fwk export; its options are {_OPTIONS}")
    ids = [w for w in words if "=" not in w]
    if len(ids) > 1:
        raise UserError(f"fwk export takes one run id, got {len(ids)}: {', '.join(ids)}")
    if fmt not in names():
        raise UserError(f"--format {fmt} is not one of {', '.join(names())}")
    return words, ids
