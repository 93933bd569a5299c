"""`fwk serve`: exported models behind a KServe v2 HTTP server (batching, warm-up, canary)."""

from __future__ import annotations

from pathlib import Path

import typer

_OPTIONS = "--host, --port, --name, --canary, --canary-share, --auto-promote, --preload"


def serve(
    args: list[str] | None = typer.Argument(
        None,
        metavar="[EXPORT_OR_RUN_ID]... [OVERRIDES]...",
        help="Export ids, or run ids (their newest export), or unique prefixes (default: the newest export); "
        "the first of each model is its stable version. Then overrides of the serve group: serve.KEY=VALUE, "
        "serve=OPTION; paths.runs=DIR for exports under another runs root.",
        show_default=False,
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
    port: int = typer.Option(8000, "--port", help="TCP port to listen on."),
    name: str | None = typer.Option(None, "--name", help="Model name in the URLs (default: the export's recipe)."),
    canary: str | None = typer.Option(
        None, "--canary", help="An export (or run) id: a new version of the model that takes --canary-share of traffic."
    ),
    canary_share: float | None = typer.Option(
        None, "--canary-share", help="Share of traffic for --canary, in (0, 1) (default: serve.canary_share, 0.05)."
    ),
    auto_promote: bool = typer.Option(
        False,
        "--auto-promote",
        help="After serve.auto_promote_requests canary requests, promote it if its error rate and p99 are within "
        "serve.auto_promote_max_error_delta / _max_p99_ratio of the stable version's; else roll it back.",
    ),
    preload: bool = typer.Option(
        False, "--preload", help="Load and warm up every listed version before ready (default: stable and canary)."
    ),
) -> None:
    """Serve exported ONNX models over HTTP with the Open Inference Protocol (KServe v2, as Triton).

    Requests are merged into batches adaptively. Versions are warmed up before
    /v2/health/ready turns true. A --canary version takes a share of traffic until
    POST /v2/models/NAME/promote, or /rollback. Prometheus metrics are on /metrics.
    """
    from dataclasses import replace

    from fwk.errors import UserError
    from fwk.serve.server import check_port, plan, run
    from fwk.serve.settings import check_settings, inference_threads, load_settings
    from fwk.track.lookup import runs_root

    words = list(args or [])
    flags = [w for w in words if w.startswith("-")]
    if flags:
        raise UserError(f"unknown option '{flags[0]}' for fwk serve; its options are {_OPTIONS}")
    if not 0 < port < 65536:
        raise UserError(f"--port={port} is not allowed: expected a TCP port in 1..65535")
    if canary_share is not None and canary is None:
        raise UserError("--canary-share needs --canary EXPORT_ID (the version that takes that share)")
    if auto_promote and canary is None:
        raise UserError("--auto-promote needs --canary EXPORT_ID (the version to promote or roll back)")
    ids = [w for w in words if "=" not in w]
    roots = [w.partition("=")[2] for w in words if w.startswith("paths.runs=")]
    cfg = load_settings([w for w in words if "=" in w and not w.startswith("paths.runs=")])
    if canary_share is not None:
        if not 0 < canary_share < 1:
            raise UserError(f"--canary-share={canary_share:g} is not allowed: expected a share of traffic in (0, 1)")
        cfg = check_settings(replace(cfg, canary_share=canary_share))
    p = plan(Path(roots[-1]) if roots else runs_root(), ids, cfg, name, canary, auto_promote)
    check_port(host, port)
    run(p, cfg, host, port, inference_threads(cfg), preload)
