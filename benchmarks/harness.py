"""`make bench`: every benchmark in one command, one markdown table, one JSON file.

    .venv/bin/python -m benchmarks [--only overhead,auto,tta:gpt_stdlib] [--quick]
        [--out bench/results] [--txt bench/cpu/NAME.txt]

Each group (overhead, startup, auto, decode, shards, fingerprint, datawait, tta, ablation,
precision, precision_whole, channels_last, memory, jit, kernels, parallel, layouts, export,
resnet50, serve, early_exit) runs in its own child process with a wall-clock budget, so that one benchmark's
failure, hang or leftover state (compiled graphs, threads, page cache) never reaches the next: a
group that fails or runs out of time becomes one failed row with its one-line reason, and the
others still run. ``GROUP:CASE+CASE`` runs only those cases of a group that has several (tta,
ablation: their ``CASES``). Every row is a ratio measured side by side in the same run:
``measure_pair`` warms both sides up, then interleaves them A,B,B,A,A,B... (whoever went first
goes second next time), and the row shows the median of the per-rep ratios with their min and
max, and both sides' absolute medians beside it.

The table goes to stdout. Every run writes a new file of its rows and the machine they were
measured on, bench/results/<YYYY-MM-DD>-<HHMMSS>-<cpu model>.json: created, never written
over (a name taken gets -2, -3, ...), since every machine here is called ``vm``. ``--txt``
also writes the table, as printed, to a text file whose first line is the command that
made it (``$ .venv/bin/python -m benchmarks --only tta --txt bench/cpu/tta.txt``):
bench/cpu/*.txt are the harness's own output, not edited by hand (the older ones name the
script the harness was before it became this package). A record that leaves out a group or
a case, or has a failed group, ends with a line saying so, and is never written over a file
that holds a whole record.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import re
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "benchmarks"]  # this harness (benchmarks/__main__.py), as a child runs it


@dataclass
class Side:
    """One side's absolute figure: a median with its unit and what was measured."""

    label: str
    value: float
    unit: str


@dataclass
class Row:
    group: str
    name: str
    ratio: str = ""  # what the ratio is, in its direction: "fwk/plain samples/s"
    median: float | None = None
    lo: float | None = None
    hi: float | None = None
    a: Side | None = None
    b: Side | None = None
    target: str = ""  # "<= 1.02x", "": report only
    met: bool | None = None  # None: no target, or not measurable here
    notes: str = ""
    failed: str = ""  # the one-line reason, when the benchmark failed


@dataclass
class Pair:
    """Per-rep values of two sides measured in interleaved order (seconds unless a side returns its own figure)."""

    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    order: list[str] = field(default_factory=list)

    def ratios(self, invert: bool = False) -> list[float]:
        """a_i / b_i per rep (b_i / a_i with ``invert``: a time ratio turned into a speed ratio)."""
        return [(b / a) if invert else (a / b) for a, b in zip(self.a, self.b, strict=True)]


def measure_pair(a: Callable[[], float | None], b: Callable[[], float | None], reps: int = 5, warmup: int = 1) -> Pair:
    """Warm each side up ``warmup`` times, then ``reps`` rounds alternating which goes first.

    A side returning None is timed (seconds, wall clock); one returning a number reports that
    figure itself (samples/s of a subprocess, say). Alternating the order means a rep's
    warm cache or the machine's drift does not always favour the same side.
    """
    if reps < 1:
        raise ValueError(f"reps={reps} must be >= 1")

    def once(fn: Callable[[], float | None]) -> float:
        t0 = time.perf_counter()
        got = fn()
        return time.perf_counter() - t0 if got is None else float(got)

    for _ in range(warmup):
        once(a)
        once(b)
    pair = Pair()
    for i in range(reps):
        sides = (("a", a), ("b", b)) if i % 2 == 0 else (("b", b), ("a", a))
        for name, fn in sides:
            getattr(pair, name).append(once(fn))
            pair.order.append(name)
    return pair


def ratio_row(
    group: str,
    name: str,
    ratios: list[float],
    a: Side,
    b: Side,
    ratio: str,
    target: str = "",
    notes: str = "",
) -> Row:
    """A row from per-rep ratios; ``target`` like '<= 1.02' or '>= 2' is checked against the median."""
    med = statistics.median(ratios)
    return Row(group, name, ratio, med, min(ratios), max(ratios), a, b, target, check(med, target), notes)


def check(value: float, target: str) -> bool | None:
    if not target:
        return None
    op, _, bound = target.partition(" ")
    limit = float(bound.rstrip("x%")) / (100 if bound.endswith("%") else 1)
    return {"<=": value <= limit, "<": value < limit, ">=": value >= limit, ">": value > limit}[op]


def failed(group: str, name: str, reason: str) -> Row:
    return Row(group, name, failed=" ".join(reason.split())[:300])


def guarded(group: str, name: str, fn: Callable[[], list[Row]]) -> list[Row]:
    """fn's rows, or one failed row with the exception's one line: the group's other parts still run."""
    try:
        rows = fn()
    except Exception as exc:  # a benchmark's failure is a row, not the end of the run
        rows = [failed(group, name, f"{type(exc).__name__}: {exc}")]
    partial = os.environ.get("FWK_BENCH_PARTIAL")
    if partial:  # the parent keeps these if the group later runs out of time
        with open(partial, "a") as f:
            f.writelines(json.dumps(asdict(r)) + "\n" for r in rows)
    return rows


# group -> (module of this package, its rows function, seconds it may take at full size);
# caps, not estimates, set for the slowest 2-core CPU met so far: an AVX2 EPYC (Zen 2) steps
# resnet_digits 2.2x and the GPT 1.3x slower than an AVX512-BF16 one, runs Muon's bf16
# Newton-Schulz steps emulated, and at the 2026-12-02 caps overran shards (600 s), tta (1800 s),
# ablation (2400 s), precision (60 s), channels_last (30 s) and memory (80 s), where the AVX512
# EPYC ran the whole of it in 45 minutes; on 2026-12-03 tta's cold and warm processes overran
# 4200 s there (gpt_stdlib unmeasured); +1500 s for tta:hf_llama_stdlib: 4.6 hours; --slack scales them
GROUPS: dict[str, tuple[str, str, int]] = {
    "overhead": ("overhead", "rows", 160),
    "startup": ("startup", "rows", 300),
    "auto": ("auto", "rows", 420),
    "decode": ("decode_rows", "rows", 300),
    "shards": ("shards_accuracy", "rows", 1500),
    "fingerprint": ("fingerprint", "rows", 90),
    "datawait": ("datawait", "rows", 120),
    "tta": ("tta", "rows", 8100),
    "ablation": ("ablation", "rows", 3600),
    "precision": ("precision", "rows", 300),
    "precision_whole": ("precision_whole", "rows", 900),
    "channels_last": ("channels_last", "rows", 120),
    "memory": ("memory", "rows", 240),
    "jit": ("jit", "rows", 30),
    "kernels": ("kernel_speed", "rows", 20),
    "parallel": ("parallel", "rows", 150),
    "layouts": ("layouts", "rows", 1500),
    "export": ("export", "rows", 300),  # AOTInductor compiles the aoti export: ~30 s on 2 cores
    "resnet50": ("resnet50", "rows", 2700),
    "serve": ("serve_overload", "rows", 600),
    "early_exit": ("early_exit", "rows", 1500),  # four trainings (two resnet_digits: ~80 s each), served
}


def run_group(group: str, quick: bool, cases: list[str] | None = None) -> list[dict]:
    """In this process: the group's rows as dicts (called in the child); ``cases``: only these
    of the group's ``CASES``."""
    module, fn = GROUPS[group][:2]
    rows = getattr(importlib.import_module(f"benchmarks.{module}"), fn)(quick, *([cases] if cases else []))
    return [r if isinstance(r, dict) else asdict(r) for r in rows]


def selection(only: str) -> list[tuple[str, list[str]]]:
    """``--only``'s groups, each with the cases named after a colon (none: all of them); a
    group or case that does not exist is one line naming the ones that do."""
    picked = []
    for item in filter(None, only.split(",")):
        group, _, names = item.partition(":")
        if group not in GROUPS:
            raise SystemExit(f"--only {group}: unknown group; choose from {','.join(GROUPS)}")
        cases = [c for c in names.split("+") if c]
        if cases:
            known = list(getattr(importlib.import_module(f"benchmarks.{GROUPS[group][0]}"), "CASES", {}))
            if not known or set(cases) - set(known):
                raise SystemExit(f"--only {item}: {group} has the cases {','.join(known) or '(none to choose)'}")
        picked.append((group, cases))
    return picked or [(g, []) for g in GROUPS]


def from_dict(d: dict) -> Row:
    for side in ("a", "b"):
        if d.get(side):
            d[side] = Side(**d[side])
    return Row(**d)


def run_isolated(group: str, quick: bool, budget: float, cases: list[str] | None = None) -> list[Row]:
    """The group (only ``cases`` of it, if any) in a child process with ``budget`` seconds; a
    failure is one failed row."""
    with tempfile.TemporaryDirectory(prefix=f"fwk-bench-{group}-") as tmp:
        out = Path(tmp) / "rows.json"
        argv = [*COMMAND, "--group", group, "--rows-to", str(out), *(["--quick"] if quick else [])]
        argv += ["--cases", "+".join(cases)] if cases else []
        partial = Path(tmp) / "partial.jsonl"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "FWK_BENCH_PARTIAL": str(partial),
        }
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=budget, env=env)
        except subprocess.TimeoutExpired:
            lines = partial.read_text().splitlines() if partial.exists() else []
            kept = [from_dict(json.loads(line)) for line in lines]
            return [*kept, failed(group, f"{group} (the rest)", f"over its budget of {budget:.0f} s")]
        if done.returncode != 0 or not out.exists():
            lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            return [failed(group, group, lines[-1] if lines else f"exit status {done.returncode}")]
        return [from_dict(d) for d in json.loads(out.read_text())]


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"


def table(rows: list[Row]) -> str:
    lines = [
        "| group | benchmark | ratio (what) | median [min, max] | A | B | target | met | notes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r.failed:
            lines.append(f"| {r.group} | {r.name} | failed | - | - | - | {r.target or '-'} | no | {r.failed} |")
            continue
        med = "-" if r.median is None else f"{r.median:.2f}x"
        if r.lo is not None and r.hi is not None and (r.lo, r.hi) != (r.median, r.median):
            med += f" [{r.lo:.2f}, {r.hi:.2f}]"
        a, b = (f"{s.label} {_fmt(s.value)} {s.unit}" if s else "-" for s in (r.a, r.b))
        met = {True: "yes", False: "no", None: "-"}[r.met]
        target = r.target or "-"
        lines.append(f"| {r.group} | {r.name} | {r.ratio} | {med} | {a} | {b} | {target} | {met} | {r.notes} |")
    return "\n".join(lines)


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's "model name" from /proc/cpuinfo; elsewhere platform.processor(), or the architecture."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def slug(cpu: str) -> str:
    """A CPU model as a file name's part: "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz" ->
    "intel-xeon-platinum-8375c" (the clock is left out: the same model at another clock is the same part)."""
    words = re.sub(r"\((r|tm)\)|\bcpu\b|@.*$", " ", cpu.lower())
    return re.sub(r"[^a-z0-9]+", "-", words).strip("-")[:48].rstrip("-") or "unknown-cpu"


def machine() -> dict:
    import torch

    info = {
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "load_average": os.getloadavg(),
    }
    return info


def create_new(path: Path, text: str) -> Path:
    """Write ``text`` to a file created by this call: ``path``, or, while that name is taken,
    ``path`` with -2, -3, ... before its suffix. A file that exists is never written over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        candidate = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
        try:
            with open(candidate, "x") as f:  # "x": fails if it exists, atomically (O_EXCL)
                f.write(text)
            return candidate
        except FileExistsError:
            continue
    raise FileExistsError(f"{path}: 9,999 results of that name already")


def write_json(
    rows: list[Row],
    out_dir: Path,
    info: dict,
    wall_s: float,
    quick: bool,
    started: datetime.datetime | None = None,
    command: str = "",
) -> Path:
    """The run's rows and machine in a new file named by its start (date and time) and CPU model."""
    started = started or datetime.datetime.now()
    name = f"{started:%Y-%m-%d-%H%M%S}-{slug(info['cpu'])}{'-quick' if quick else ''}.json"
    doc = {"machine": info, "command": command, "quick": quick, "wall_s": wall_s, "rows": [asdict(r) for r in rows]}
    return create_new(out_dir / name, json.dumps(doc, indent=1) + "\n")


def shown(path: Path | str) -> str:
    """``path`` relative to the working folder when inside it (the command as typed there), else absolute."""
    rel = os.path.relpath(os.path.abspath(path))
    return rel if not rel.startswith("..") else os.path.abspath(path)


def command_line(argv: list[str]) -> str:
    """The command that runs this harness with ``argv``, as a shell would take it."""
    return shlex.join([shown(sys.executable), *COMMAND[1:], *argv])


PARTIAL = "Partial record"


def partial(picked: list[tuple[str, list[str]]], rows: list[Row], quick: bool) -> str:
    """Say what makes a run's record partial: the groups or cases it left out, the groups that
    failed, smoke-test sizes. Return "" for a whole record."""
    out = [g for g in GROUPS if g not in {group for group, _ in picked}]
    some = [f"{group}:{'+'.join(cases)}" for group, cases in picked if cases]
    failed_groups = sorted({r.group for r in rows if r.failed})
    said = [
        *([f"left out {', '.join(out)}"] if out else []),
        *([f"only the cases {', '.join(some)}"] if some else []),
        *([f"failed in {', '.join(failed_groups)}"] if failed_groups else []),
        *(["--quick sizes"] if quick else []),
    ]
    return "; ".join(said)


def holds_whole_record(path: Path) -> bool:
    """Tell whether the --txt file at ``path`` holds a whole record: every group, none failed."""
    try:
        text = path.read_text()
    except OSError:
        return False
    first = text.partition("\n")[0]
    return " --only" not in first and " --quick" not in first and PARTIAL not in text and "| failed |" not in text


def refuse_partial(path: Path | None, what: str) -> None:
    """Refuse to write a partial record over a whole one, in one line that says what is missing."""
    if path is not None and what and holds_whole_record(path):
        raise SystemExit(
            f"--txt {shown(path)} holds a whole record, and this run's is partial ({what}): "
            "write it to another file, or run every group"
        )


def write_txt(path: Path, command: str, text: str) -> None:
    """``text`` under a first line ``$ COMMAND``; it replaces the file (bench/cpu/ is kept in git,
    and the text names its JSON), through a temporary file so a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(f"$ {command}\n{text}")
    tmp.replace(path)


def report(rows: list[Row], info: dict, wall_s: float, quick: bool, path: Path, partly: str = "") -> str:
    """What the run prints to stdout, and what --txt keeps: the machine, the table, the legend,
    and what a partial record left out (``partly``)."""
    return (
        f"fwk benchmarks{' (--quick: smoke-test sizes, not figures)' if quick else ''}: {info['cpu']}, "
        f"{info['cores']} cores, torch {info['torch']}, device {info['device']}; load average at start "
        f"{info['load_average'][0]:.2f}; {wall_s / 60:.1f} min\n\n"
        f"{table(rows)}\n\n"
        + (f"{PARTIAL}: {partly}.\n" if partly else "")
        + f"A, B: each side's median; ratio: median of the per-rep ratios [min, max]. Results: {shown(path)}\n"
    )


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", default="", help=f"comma-separated groups of: {','.join(GROUPS)}; GROUP:CASE+CASE: only those cases"
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of every group (minutes)")
    parser.add_argument("--slack", type=float, default=1.0, help="multiply every group's time budget (a busy machine)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="folder of the JSON results")
    parser.add_argument(
        "--txt", type=Path, help="also write the table, under a first line with this command, to this file"
    )
    parser.add_argument("--group", default="", help=argparse.SUPPRESS)  # internal: run one group here
    parser.add_argument("--rows-to", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--cases", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.group:
        cases = args.cases.split("+") if args.cases else None
        args.rows_to.write_text(json.dumps(run_group(args.group, args.quick, cases)))
        return
    picked = selection(args.only)
    refuse_partial(args.txt, partial(picked, [], args.quick))  # before hours of work, not after
    info, started, rows = machine(), time.perf_counter(), []
    start_time = datetime.datetime.now()
    for group, cases in picked:
        t0 = time.perf_counter()
        print(f"[bench] {group} ...", file=sys.stderr, flush=True)
        budget = GROUPS[group][2] * args.slack
        got = run_isolated(group, args.quick, budget, cases)
        rows += got
        print(f"[bench] {group}: {len(got)} rows in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        print("\n".join(table(got).splitlines()[2:]), file=sys.stderr, flush=True)  # progress: this group's rows
    wall = time.perf_counter() - started
    command = command_line(argv)
    path = write_json(rows, args.out, info, wall, args.quick, start_time, command)
    partly = partial(picked, rows, args.quick)
    text = report(rows, info, wall, args.quick, path, partly)
    print(text, end="")
    if args.txt:
        refuse_partial(args.txt, partly)  # a group failed: the rows stay in the JSON file named above
        write_txt(args.txt, command, text)
