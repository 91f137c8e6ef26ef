"""`specli models` and `specli models check`: the models.toml registry listed, and whether a draft can
draft for a target (the engine's vocabulary check, as a report)."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.text import Text

from specli.errors import UsageProblem
from specli.runplan import model_name, open_registry, validated
from specli.ui.console import make_console, note


def list_models(config: str | None, json_out: bool) -> None:
    """The registry's entries: file present or missing, size, architecture, parameters, vocab."""
    from specli.config import find_config, load_config, model_rows

    out = make_console()
    if not out.is_terminal:
        out = make_console(width=160)  # a file or pipe: do not fold paths into columns
    found = find_config(config)
    if found is None:
        raise UsageProblem(
            "no models.toml found (looked for --config, $SPECLI_CONFIG, ./models.toml, "
            "~/.config/specli/models.toml); copy the repository's models.toml there"
        )
    registry = load_config(found, strict=False)
    problems = [*registry.default_problems.values(),
                *(e for entry in registry.models.values() for e in entry.problems.values())]
    for problem in problems:  # a listing uses no setting, but says what a run would refuse
        note(make_console(stderr=True), str(problem))
    rows = model_rows(registry)
    if json_out:
        print(json.dumps(rows, default=str))
        return
    from specli.ui.models_table import render_models

    out.print(render_models(rows, out.width, title=Text(f"models in {found}")))


def check_pair(target: str, draft: str, config: str | None, verbose: bool) -> None:
    """Load both models' vocabularies and compare them: a table of facts, then compatible or why not
    (exit 1)."""
    from rich.table import Table

    from specli import llama, llama_log
    from specli.compat import check_vocab

    out = make_console()
    err = make_console(stderr=True)
    named = [model_name(target, "TARGET"), model_name(draft, "DRAFT")]
    cfg, notes = open_registry(config, named)
    for text in notes:
        note(err, text)
    paths = [validated(cfg.resolve(x).path if cfg else Path(x).expanduser()) for x in named]
    llama_log.set_verbose(verbose)
    opts = llama.ModelOptions(n_ctx=64, n_threads=1)
    with llama.Model(paths[0], opts) as t, llama.Model(paths[1], opts) as d:
        report = check_vocab(t, d)
    table = Table(title=Text(f"{paths[0].name} ← {paths[1].name}"), title_justify="left")
    table.add_column("")
    table.add_column("target")
    table.add_column("draft")
    for what, a, b in report.facts:
        table.add_row(Text(what), Text(a), Text(b), style=None if a == b else "yellow")
    out.print(table)
    if report.ok:
        out.print(f"[green]compatible[/]: {report.checked_token_texts} token texts compared")
    else:
        for problem in report.problems:
            out.print(f"[red]incompatible[/]: {escape(problem)}")
        raise typer.Exit(1)
