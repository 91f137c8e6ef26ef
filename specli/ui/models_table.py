"""The `specli models` table, built from config.model_rows()."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from specli.gguf_info import human_count, human_size

_STATUS_STYLE = {"present": "green", "installed": "green", "missing": "yellow", "invalid": "red"}


def _cell(value: Any, fmt: Any = str) -> Text:
    return Text("—", style="dim") if value is None else Text(fmt(value))


def render_models_table(rows: Sequence[dict[str, Any]], title: str | Text | None = None) -> Table:
    """One line per model: name, default draft, what the file is, and whether it is usable."""
    table = Table(title=title, title_justify="left", header_style="bold", expand=False)
    table.add_column("name", style="bold cyan", no_wrap=True)
    table.add_column("draft", style="cyan", no_wrap=True)
    table.add_column("arch")
    table.add_column("params", justify="right")
    table.add_column("quant")
    table.add_column("ctx", justify="right")
    table.add_column("vocab", justify="right")
    table.add_column("size", justify="right")
    table.add_column("file", overflow="fold")
    for row in rows:
        status = row.get("status", "present")
        file_cell = Text(status, style=_STATUS_STYLE.get(status, ""))
        file_cell.append(f"  {row.get('path', '')}", style="dim")
        if row.get("error"):
            file_cell.append(f"\n{row['error']}", style="red")
        arch = _cell(row.get("architecture"))
        if row.get("recurrent"):
            arch.append(" (recurrent)", style="yellow")
        table.add_row(
            Text(row["name"]),
            _cell(row.get("draft")),
            arch,
            _cell(row.get("parameters"), human_count),
            _cell(row.get("quantization")),
            _cell(row.get("context_length"), lambda n: f"{n:,}"),
            _cell(row.get("vocab_size"), lambda n: f"{n:,}"),
            _cell(row.get("size"), human_size),
            file_cell,
        )
    return table


def _about(row: dict[str, Any]) -> str:
    """What the file is, in a few words: architecture, parameters, quantization (what is known)."""
    parts = [row.get("architecture"), row.get("parameters") and human_count(row["parameters"]),
             row.get("quantization")]
    about = " ".join(str(p) for p in parts if p)
    return about + (" (recurrent)" if row.get("recurrent") else "")


def render_models_list(rows: Sequence[dict[str, Any]], title: str | Text | None = None) -> Group:
    """The same entries for a narrow terminal (80 columns): per model a line of name, draft, status,
    size and what it is, then its file (and any error) on a line of its own, where the table would
    fold the path into a column a few characters wide."""
    name_width = max([4, *(len(row["name"]) for row in rows)])
    draft_width = max([5, *(len(row.get("draft") or "—") for row in rows)])
    lines: list[Text] = [Text(str(title)) if title is not None else Text()]
    lines.append(Text(f"{'name':<{name_width}}  {'draft':<{draft_width}}  {'status':<8} {'size':>9}  what",
                      style="bold"))
    for row in rows:
        status = row.get("status", "present")
        line = Text(f"{row['name']:<{name_width}}", style="bold cyan")
        line.append(f"  {(row.get('draft') or '—'):<{draft_width}}  ", style="cyan")
        line.append(f"{status:<8}", style=_STATUS_STYLE.get(status, ""))
        size = human_size(row["size"]) if row.get("size") is not None else "—"
        line.append(f" {size:>9}  {_about(row)}".rstrip())
        lines.append(line)
        lines.append(Text(f"  {row.get('path', '')}", style="dim", overflow="fold"))
        if row.get("error"):
            lines.append(Text(f"  {row['error']}", style="red"))
    if title is None:
        lines.pop(0)
    return Group(*lines)


def render_models(rows: Sequence[dict[str, Any]], width: int,
                  title: str | Text | None = None) -> Table | Group:
    """The table where it fits `width` columns, the list (`render_models_list`) where it does not."""
    from rich.console import Console

    table = render_models_table(rows, title)
    natural = Console(width=10_000).measure(table).maximum
    return table if natural <= width else render_models_list(rows, title)
