"""`specli bench`'s front end: its files checked before any work, the pair planned and refused early when
bench cannot run it, the runs measured under a progress display, the report, then the files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from specli.drafters.registry import drafter_kind
from specli.errors import EXIT_INTERRUPTED, UsageProblem, fail
from specli.flags import checked
from specli.runplan import plan_run
from specli.settings import BENCH
from specli.ui.console import make_console, note


@dataclass(frozen=True)
class BenchCommand:
    """What `specli bench` was given (its settings as typed: specli.flags)."""

    target: str
    draft: str | None
    k: str
    temps: str
    prompts: str | None
    repeat: int
    ngram: bool
    given: dict
    json_path: str | None
    csv_path: str | None
    servers: list[str] | None
    api_key: str | None
    verbose: bool
    config: str | None


def run_bench_command(command: BenchCommand) -> None:
    from specli import llama_log
    from specli.bench.files import write_csv, write_json
    from specli.bench.measure import run_bench
    from specli.bench.server import parse_server, unique_names
    from specli.bench.suite import BenchConfig, load_prompts, parse_k_list, parse_temp_list
    from specli.ui.bench_view import bench_progress, render_bench

    c = command
    out = make_console()
    err = make_console(stderr=True)
    # Output paths first: a result is never measured only to be lost on a bad path.
    named = [(p, opt, writer) for p, opt, writer in
             ((c.json_path, "--json", write_json), (c.csv_path, "--csv", write_csv)) if p is not None]
    outputs = [(output_path(p, opt), writer) for p, opt, writer in named]
    flags = checked(c.given)
    ks, temperatures = parse_k_list(c.k), parse_temp_list(c.temps)
    plan = plan_run(BENCH, c.target, c.draft, ngram=c.ngram, config=c.config, flags=flags)
    inputs = [(plan.target, "the target"), (plan.draft_model, "the draft"),
              (c.prompts and given_path(c.prompts, "--prompts"), "--prompts"),
              (plan.config, "the models.toml")]
    refuse_clashing_outputs([(path, opt) for (path, _), (_, opt, _) in zip(outputs, named, strict=True)],
                            [(path, what) for path, what in inputs if path is not None])
    for text in plan.notes:
        note(err, text)
    if plan.draft is None:
        raise UsageProblem("bench compares against a drafter: give --draft (a model, or 'ngram')")
    kind = drafter_kind(plan.draft)
    if kind is not None and not kind.in_bench:
        raise UsageProblem(f"bench does not run --draft {kind.name} yet: compare with `specli run --json`")
    llama_log.set_verbose(c.verbose)
    cfg = BenchConfig(
        target=plan.target,
        draft=plan.draft,
        ks=ks,
        temps=temperatures,
        prompts=load_prompts(given_path(c.prompts, "--prompts")) if c.prompts is not None else None,
        repeat=c.repeat,
        settings=plan.settings.seeded(),
        ngram=c.ngram,
        servers=unique_names([parse_server(s, c.api_key, i) for i, s in enumerate(c.servers or [], 1)]),
    )
    with bench_progress(err) as progress:
        result = run_bench(cfg, progress=progress)
    # The report first: whatever happens to the files, the measurements are on screen.
    render_bench(result, out)
    failed = []
    for path, writer in outputs:
        try:
            writer(result, path)
        except OSError as e:
            failed.append(f"cannot write {path}: {e.strerror or e}")
    if failed:
        raise fail("; ".join(failed) + " (the report above has the results)")
    if result.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)


def given_path(text: str, option: str) -> Path:
    """A file option's value as a path; an empty one is refused (Path('') would be the directory '.')."""
    if not text.strip():
        raise UsageProblem(f"{option} was given an empty file name")
    return Path(text).expanduser()


def output_path(path: str, option: str) -> Path:
    from specli.fileio import FileProblem, check_output_path

    try:
        return check_output_path(path, option)
    except FileProblem as e:
        raise UsageProblem(str(e)) from None


def refuse_clashing_outputs(outputs: list[tuple[Path, str]], inputs: list[tuple[Path, str]]) -> None:
    """Two outputs that are one file (the second would silently replace the first), or an output that
    is one of the inputs (a model, the prompts), are refused before any work."""
    from specli.fileio import same_output

    for i, (path, option) in enumerate(outputs):
        for other, other_option in outputs[:i]:
            if same_output(path, other):
                raise UsageProblem(f"{other_option} {other} and {option} {path} are the same file: "
                                   "give each its own")
        for source, what in inputs:
            if same_output(path, source):
                raise UsageProblem(f"{option} {path} is {what} ({source}): writing it would destroy it")
