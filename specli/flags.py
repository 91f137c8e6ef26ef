"""The settings table's options on the typer commands: each row of specli.settings.SETTINGS is a flag on
every command its `commands` name, with its flags, its help and that command's own default, so a new
setting is one row there and nothing here.

A command marks where its settings go with a parameter `given: dict = SETTING_FLAGS`; `takes_settings`
puts the table's options in its place and hands the command what was typed of them (None: not given),
which `checked` parses by the same rules as models.toml and chat's slash commands.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from specli.settings import FLAGS, SETTINGS, Setting, defaults_for, parse_updates

F = TypeVar("F", bound=Callable[..., Any])

_METAVARS = {"float": "FLOAT", "int": "INT", "k": "N|auto", "seed": "INT", "stops": "TEXT"}
# What a flag of each kind takes from typer: text (parsed by specli.settings), a switch, or a list.
_TYPES: dict[str, Any] = {"bool": bool | None, "stops": list[str] | None}
GIVEN = "given"  # the parameter a command's settings replace
SETTING_FLAGS: Any = object()  # its default: "the table's settings go here"


def _shown(value: object) -> str:
    return "random" if value is None else str(value)


def setting_option(setting: Setting, command: str) -> Any:
    """The flag of `setting` on `command`: a flag's value defaults to None ("not given"), and its help
    shows the command's default (its range and its check are the table's)."""
    text = setting.help_for.get(command, setting.help)
    if setting.kind == "bool":
        negation = setting.negation_for.get(command, setting.negation)
        return typer.Option(None, f"{setting.flag}/{negation}" if negation else setting.flag, help=text,
                            show_default=False)
    if setting.kind != "stops":
        text += f" [default: {_shown(getattr(defaults_for(command), setting.name))}]"
    metavar = _METAVARS.get(setting.kind) or "|".join(setting.choices)
    decls = (setting.short, setting.flag) if setting.short else (setting.flag,)
    return typer.Option(None, *decls, metavar=metavar, help=text, show_default=False)


def takes_settings(command: str) -> Callable[[F], F]:
    """A typer command with the options of every setting that `command` takes, in the table's order,
    where its `given` parameter is; the command is called with `given`, a dict of their raw values."""
    names = [name for name, setting in SETTINGS.items() if command in setting.commands]

    def decorate(func: F) -> F:
        params = list(inspect.signature(func, eval_str=True).parameters.values())
        at = [p.name for p in params].index(GIVEN)
        options = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                     default=setting_option(SETTINGS[name], command),
                                     annotation=_TYPES.get(SETTINGS[name].kind, str | None))
                   for name in names]
        kept = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params]
        signature = inspect.Signature([*kept[:at], *options, *kept[at + 1:]])

        @functools.wraps(func)
        def command_with_settings(**values: Any) -> Any:
            given = {name: values.pop(name) for name in names}
            return func(**values, **{GIVEN: given})

        command_with_settings.__signature__ = signature  # type: ignore[attr-defined]
        command_with_settings.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        return command_with_settings  # type: ignore[return-value]

    return decorate


def checked(given: dict[str, Any]) -> dict[str, Any]:
    """The settings typed on the command line, checked (SettingError naming the flag)."""
    raw = dict(given)
    if raw.get("stop") is not None and len(raw["stop"]) == 0:
        raw["stop"] = None
    return parse_updates(raw, FLAGS)
