"""Start a server: resolve the exports, plan models and versions, run uvicorn until SIGTERM.

uvicorn handles SIGTERM and SIGINT: it stops accepting connections, lets the requests in
flight finish (up to ``serve.drain_s``), then the app's shutdown finishes the queued
batches and stops the inference threads.
"""

from __future__ import annotations

import logging
import secrets
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

from fwk.errors import UserError
from fwk.serve.models import Export, find_export
from fwk.serve.routing import AutoPromote, Router
from fwk.serve.settings import ServeConfig, allowed_hosts

logger = logging.getLogger(__name__)


@dataclass
class ServePlan:
    """Which exports are served, under which model names, and how traffic is split."""

    exports: dict[str, dict[str, Export]]  # model -> version (export id) -> export
    routers: dict[str, Router]


def plan(
    root: Path,
    ids: list[str],
    cfg: ServeConfig,
    name: str | None = None,
    canary: str | None = None,
    auto_promote: bool = False,
) -> ServePlan:
    """Resolve the ids into models and versions. They are export ids, run ids or prefixes, and
    none means the newest export."""
    listed = [find_export(root, q) for q in ids] if ids else [find_export(root, None)]
    new = find_export(root, canary) if canary else None
    recipes = sorted({e.recipe for e in listed + ([new] if new else [])})
    if name is not None and len(recipes) > 1:
        raise UserError(f"--name {name} names one model, but the exports are of {len(recipes)}: {', '.join(recipes)}")
    exports: dict[str, dict[str, Export]] = {}
    for e in listed:
        exports.setdefault(name or e.recipe, {}).setdefault(e.id, e)
    if new is not None:
        model = name or new.recipe
        if model not in exports:
            raise UserError(
                f"canary {new.id} is a {new.recipe} export, but no {new.recipe} export is served; "
                f"serve one: fwk serve STABLE_ID --canary {new.id}"
            )
        if list(exports[model]) == [new.id]:
            raise UserError(
                f"canary {new.id} is also the stable version of {model}; name the stable export first: "
                f"fwk serve STABLE_ID --canary {new.id}"
            )
        exports[model].setdefault(new.id, new)
    auto = AutoPromote(cfg.auto_promote_requests, cfg.auto_promote_max_error_delta, cfg.auto_promote_max_p99_ratio)
    routers = {}
    for model, versions in exports.items():
        has_canary = new is not None and model == (name or new.recipe)
        stable = next(v for v in versions if not (has_canary and v == new.id))
        routers[model] = Router(
            model,
            list(versions),
            stable,
            canary=new.id if has_canary else None,
            share=cfg.canary_share,
            auto=auto if auto_promote and has_canary else None,
            window=cfg.latency_window,
        )
    return ServePlan(exports, routers)


def check_port(host: str, port: int) -> None:
    """Refuse a taken port in one line, before anything loads, since it is the user's to fix."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another with --port") from None


def describe(p: ServePlan) -> list[str]:
    lines = []
    for model, router in p.routers.items():
        parts = []
        for v, e in p.exports[model].items():
            role = "stable" if v == router.stable else "by version"
            role = f"canary {router.share:.0%}" if v == router.canary else role
            exits = e.report.get("exits")
            carries = f", exits after blocks {exits['after_blocks']}" if exits else ""
            parts.append(f"{v} ({role}, {e.report['final']} of run {e.run_id}{carries})")
        lines.append(f"model {model}: {'; '.join(parts)}")
    return lines


def run(
    p: ServePlan,
    cfg: ServeConfig,
    host: str,
    port: int,
    threads: int,
    preload: bool,
) -> None:
    import uvicorn

    from fwk.serve.app import build
    from fwk.serve.connections import check_open_files, protocol
    from fwk.serve.repository import Repository

    check_open_files(cfg.max_connections)
    repo = Repository(p.routers, p.exports, cfg, threads, preload)
    for line in describe(p):
        logger.info(line)
    token = secrets.token_urlsafe(24) if cfg.admin_token == "auto" else cfg.admin_token
    if cfg.admin_token == "auto":  # said once: only whoever started the server can steer its rollout
        logger.info(f"admin token (POST .../promote, .../rollback as Authorization: Bearer TOKEN): {token}")
    batching = f"max batch {cfg.max_batch_size}, max delay {cfg.max_delay_ms:g} ms" + (
        " (adaptive)" if cfg.adaptive else ""
    )
    logger.info(
        f"serving on http://{host}:{port} (KServe v2; {batching}; {threads} inference threads x "
        f"{cfg.intra_op_threads or 'auto'} onnxruntime threads); SIGTERM or Ctrl-C drains and stops"
    )
    hosts = allowed_hosts(cfg, host)
    if hosts is not None:
        logger.info(f"answering requests for Host {', '.join(sorted(hosts))} (serve.allowed_hosts)")
    config = uvicorn.Config(
        build(repo, token, hosts),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=cfg.drain_s,
        # past max_connections open, uvicorn answers 503 to a request whose headers are in; the
        # protocol lets health checks through and closes slow connections (fwk/serve/connections.py)
        limit_concurrency=cfg.max_connections,
        http=protocol(
            cfg.header_timeout_s, cfg.max_connections, count=lambda why: repo.metrics.refused.labels(why).inc()
        ),
        backlog=2048,
    )
    # uvicorn catches SIGTERM/SIGINT, drains, then re-raises the signal to the handler it found:
    # ours records it, so a drained server exits 0 and says so instead of dying by the signal
    got: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: got.append(signum))
    uvicorn.Server(config).run()
    why = f" on {signal.Signals(got[0]).name}" if got else ""
    logger.info(f"stopped{why}: in-flight requests drained")
