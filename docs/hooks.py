"""MkDocs hooks that write the parts of the site that the code and the benchmarks already hold.

A page asks for a generated part with an HTML comment on a line of its own, so the page
still reads as plain Markdown on GitHub:

- ``<!-- fwk:help train -->`` becomes the options of ``fwk train``, read from the command
  line's own definitions, so a renamed flag can never leave the page stale.
- ``<!-- fwk:bench bench/cpu/parallel.txt -->`` becomes that benchmark record: the command
  that wrote it, the machine line, and its table, as the benchmark printed them.
- ``<!-- fwk:bench-all -->`` lists every record under ``bench/cpu/`` and ``bench/gpu/``.

An unknown command or a missing record raises, and ``mkdocs build --strict`` fails with it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"^<!-- fwk:(bench-all|help|bench)\s*(\S*)\s*-->$", re.M)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each generated-part marker of a page with what it names."""

    def expand(match: re.Match[str]) -> str:
        kind, arg = match.group(1), match.group(2)
        if kind == "help":
            return _help(arg)
        if kind == "bench":
            return _record(ROOT / arg)
        return _all_records()

    return MARK.sub(expand, markdown)


def _command(name: str) -> Any:
    import typer

    from fwk.cli import app

    group = typer.main.get_command(app)
    command: Any = group
    for part in name.split():
        if part not in getattr(command, "commands", {}):
            raise ValueError(f"docs: <!-- fwk:help {name} --> names no fwk command")
        command = command.commands[part]
    return command


def _help(name: str) -> str:
    """Render ``fwk NAME``'s summary, its arguments and options as a Markdown table."""
    command = _command(name.replace("_", " "))
    lines = [f"`fwk {name.replace('_', ' ')}`: {_one_line(command.help or '')}", ""]
    if hasattr(command, "commands"):  # a group: typer bundles its own click, so no isinstance
        lines += ["| subcommand | what it does |", "| --- | --- |"]
        lines += [f"| `fwk {name} {n}` | {_one_line(c.help or '')} |" for n, c in command.commands.items()]
        return "\n".join(lines) + "\n"
    lines += ["| argument or option | default | what it does |", "| --- | --- | --- |"]
    for param in command.params:
        if param.name == "help":
            continue
        if param.param_type_name == "argument":
            flag = f"`{param.name.upper()}...`" if param.nargs == -1 else f"`{param.name.upper()}`"
            default = ""
        else:
            flag = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
            default = "" if param.default in (None, [], ()) or param.is_flag else f"`{param.default}`"
        lines.append(f"| {flag} | {default} | {_one_line(getattr(param, 'help', None) or '')} |")
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    """Make help text one table cell: one line, its pipes escaped, ``<id>`` kept as text."""
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _record(path: Path) -> str:
    """Render one benchmark record: its command as code, its machine line, its table verbatim."""
    if not path.is_file():
        raise FileNotFoundError(f"docs: the benchmark record {path.relative_to(ROOT)} does not exist")
    text = path.read_text().splitlines()
    command = [line[2:] for line in text if line.startswith("$ ")]
    machine = [line for line in text if line.startswith("fwk benchmarks:") or line.startswith("# ")]
    table = [line for line in text if line.startswith("|")]
    rest = [line for line in text if line and line[:1] not in "$|#" and not line.startswith("fwk benchmarks:")]
    out = [f"`{path.relative_to(ROOT)}`", ""]
    if command:
        out += ["```", *command, "```", ""]
    out += [f"_{line.lstrip('# ')}_" for line in machine] + [""]
    out += table + [""] + rest
    return "\n".join(out) + "\n"


def _all_records() -> str:
    """Render every committed benchmark record, CPU first, each under its own heading."""
    out = []
    for folder in ("bench/cpu", "bench/gpu"):
        for path in sorted((ROOT / folder).glob("*.txt")) + sorted((ROOT / folder).glob("*.md")):
            out += [f"### {path.relative_to(ROOT)}", "", _record(path)]
    return "\n".join(out)
