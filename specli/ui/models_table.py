"""The `specli models` table, built from config.model_rows()."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from specli.gguf_info import human_count, human_size

_STATUS_STYLE = {"present": "green", "missing": "yellow", "invalid": "red"}


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
