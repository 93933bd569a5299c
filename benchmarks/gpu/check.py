"""`make gpu-check`: every GPU claim of fwk checked in one command, each part on a budget.

    python -m benchmarks.gpu [--dry] [--out DIR] [--only NAME,...]

The parts (``benchmarks/gpu/parts.py``) run in order, each in a session of its own with a
wall-clock budget: a part that overruns is killed with everything it started (its process
group and every descendant, torchrun's workers too) and reported "over budget", and the
next part starts, so one slow part cannot eat the others' time.
``--dry`` runs every part on the CPU at tiny sizes, with the CUDA-only parts reported as
skipped by name: ``make test`` runs it, so the command cannot rot between GPU machines.
A part that runs pytest (the correctness checks of tests/gpu/) is skipped when its tests
were all skipped: they need CUDA.

The report goes to DIR (default ``bench/gpu/``, or a temporary folder's with --dry):
``<date>-<gpu>.md`` (each part's status, time and output) and the same as ``.json``,
rewritten after every part. The
exit status is non-zero when a part failed or overran, and the last line names them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.gpu.part import Part
from benchmarks.gpu.parts import PARTS
from fwk.launch.supervise import descendants

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = 3  # a part's exit status for "cannot run here" (it prints its "skipped: ..." line)
TAIL = 60  # lines of each part's output kept in the report
PYTEST_SUMMARY = re.compile(r"((?:\d+ \w+, )*\d+ \w+) in [\d.]+s(?: \([\d:]+\))?")


@dataclass
class Result:
    name: str
    section: str
    what: str
    status: str  # ok | failed | over budget | skipped
    seconds: float
    budget_s: float
    reason: str = ""
    output: str = ""


def _last_line(text: str, prefix: str = "") -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    marked = [line for line in lines if prefix and line.startswith(prefix)]
    return (marked or lines or [""])[-1][:300]


def _kill(proc: subprocess.Popen) -> None:
    """The part, everything it started, and its process group: gone before the next part.
    A part that has exited (and been reaped) leaves only its group to end: its pid may
    already be another process's."""
    if proc.poll() is None:
        for pid in [*descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def only_skipped(output: str) -> bool:
    """Whether ``output`` ends in pytest's summary of a run whose tests were all skipped
    ("1 skipped, 1 deselected in 0.52s"): a CUDA test on a machine without CUDA."""
    lines = [line.strip(" =") for line in output.splitlines() if line.strip(" =")]
    found = PYTEST_SUMMARY.fullmatch(lines[-1]) if lines else None
    if found is None:
        return False
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", found.group(1))}
    return counts.get("skipped", 0) > 0 and not {"passed", "failed", "error", "errors", "xpassed"} & set(counts)


def run_part(part: Part, dry: bool) -> Result:
    """Run one part within its budget; whatever it started dies with it, whether it ends,
    overruns or this script is interrupted."""
    argv, budget = (part.dry_argv, part.dry_budget_s) if dry else (part.argv, part.budget_s)
    if argv is None:
        return Result(part.name, part.section, part.what, "skipped", 0.0, budget, "needs CUDA (no --dry form)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.update(part.env)
    env.update(part.dry_env if dry else {})
    env["PYTHONUNBUFFERED"] = "1"
    t0 = time.monotonic()
    with tempfile.TemporaryFile(mode="w+", errors="replace") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        code: int | None = None
        try:
            code = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            pass
        finally:
            _kill(proc)  # an overrun, an interrupt, or what a finished part left behind
        seconds = time.monotonic() - t0
        log.seek(0)
        output = log.read()
    tail = "\n".join(output.splitlines()[-TAIL:])
    if code is None:
        status, reason = "over budget", f"killed after its budget of {budget:.0f} s"
    elif code == 0 and only_skipped(output):
        status, reason = "skipped", _last_line(output, "SKIPPED")
    elif code == 0:
        status, reason = "ok", _last_line(output, "ok:")
    elif code == SKIPPED:
        status, reason = "skipped", _last_line(output, "skipped:")
    else:  # a script's "FAILED: why" line, or pytest's "FAILED test - why"
        status, reason = "failed", f"exit {code}: {_last_line(output, 'FAILED')}"
    return Result(part.name, part.section, part.what, status, seconds, budget, reason, tail)


def gpu_name() -> str:
    """The GPU's name (nvidia-smi, no torch import here), or "cpu"."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "cpu"
    return out.splitlines()[0].strip() if out.strip() else "cpu"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def report(results: list[Result], machine: dict[str, str], dry: bool) -> str:
    lines = [f"# fwk gpu-check{' (dry run, on the CPU)' if dry else ''}: {machine['gpu']}, {machine['date']}", ""]
    lines += [f"- {k}: {v}" for k, v in machine.items()]
    lines += ["", "| section | part | status | seconds (budget) | result |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        result = r.reason.replace("|", "\\|")
        lines.append(f"| {r.section} | {r.name} | {r.status} | {r.seconds:.1f} ({r.budget_s:.0f}) | {result} |")
    for r in results:
        if r.output:
            lines += ["", f"## {r.name}: {r.what}", "", "```", r.output, "```"]
    return "\n".join(lines) + "\n"


def run_all(parts: list[Part], dry: bool, out: Path) -> tuple[list[Result], Path]:
    """Every part in order (each reported as it ends); the report's markdown path."""
    machine = {
        "date": datetime.date.today().isoformat(),
        "gpu": gpu_name(),
        "host": platform.node(),
        "python": platform.python_version(),
        "budget_s": f"{sum(p.dry_budget_s if dry else p.budget_s for p in parts):.0f}",
    }
    out.mkdir(parents=True, exist_ok=True)
    md = out / f"{machine['date']}-{slug(machine['gpu'])}{'-dry' if dry else ''}.md"
    results: list[Result] = []
    for part in parts:
        print(f"gpu-check: {part.name} ({part.what}) ...", flush=True)
        result = run_part(part, dry)
        results.append(result)
        print(f"gpu-check: {part.name}: {result.status} in {result.seconds:.1f} s: {result.reason}", flush=True)
        # after every part: a check cut short (the machine's lease, a command's limit) keeps what it measured
        md.write_text(report(results, machine, dry))
        md.with_suffix(".json").write_text(
            json.dumps({"machine": machine, "dry": dry, "results": [asdict(r) for r in results]}, indent=1) + "\n"
        )
    return results, md


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="every part on the CPU at tiny sizes (CUDA-only: skipped)")
    parser.add_argument("--out", default="", help="report folder (default bench/gpu, or a temporary one with --dry)")
    parser.add_argument("--only", default="", help="comma-separated part names")
    args = parser.parse_args(argv)
    parts = PARTS
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {p.name for p in PARTS})
        if unknown:
            parser.error(f"--only {','.join(unknown)}: unknown part; choose from {','.join(p.name for p in PARTS)}")
        parts = [p for p in PARTS if p.name in wanted]
    out = Path(args.out) if args.out else (Path(tempfile.mkdtemp(prefix="fwk-gpu-check-")) if args.dry
                                           else ROOT / "bench" / "gpu")  # fmt: skip
    results, md = run_all(parts, args.dry, out)
    code, line = verdict(results)
    print(f"gpu-check: report {md}")
    print(line)
    return code


def verdict(results: list[Result]) -> tuple[int, str]:
    """(exit status, the last line): 1 naming every part that failed or overran, else 0."""
    counts = {s: sum(r.status == s for r in results) for s in ("ok", "skipped", "failed", "over budget")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items())
    bad = [f"{r.name} ({r.status})" for r in results if r.status in ("failed", "over budget")]
    if bad:
        return 1, f"gpu-check: {summary}; failed: {', '.join(bad)}"
    return 0, f"gpu-check: {summary}"
