"""A command's flags as one TOML file: `slide train --config run.toml` reads one, and a run
writes what it resolved into `OUT/config.toml`, so `--config OUT/config.toml` repeats it.

A key is a flag's name without its dashes (`seq`, `lr-schedule` or `lr_schedule`); a value is
what the flag takes, as TOML types it: a string, number or boolean (a switch such as
`no-shuffle`), a list for a repeatable flag (`nvme-dir`). Each value goes through the flag's
own parsing (its type and choices), so a file and a command line accept the same values. Flags
on the command line override the file; a key that is no flag is refused, naming the closest
one. A value from the file counts as given (`args.given`), as a typed flag does, unless it is
the flag's default: a written file holds every flag, and checks that refuse a flag given
where it does nothing (`--clip-norm` without `--clip`) or one a saved plan fixes must not
refuse a file that only repeats the defaults.

Written files are flat: one `key = value` line per flag with a value (None is left out, so the
flag's default applies when it is read back).
"""

from __future__ import annotations

import argparse
import difflib
import json
import tomllib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from slide.errors import UserError

AddArguments = Callable[[argparse.ArgumentParser], None]
CONFIG_DEST = "config"  # the flag naming the file, itself no key of it


def bare_parser(add_arguments: AddArguments) -> argparse.ArgumentParser:
    """A parser of the same arguments whose every default is SUPPRESS, which leaves a
    destination nothing set out of the namespace, and that raises on a bad value instead of
    exiting."""
    bare = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(bare)
    for action in bare._actions:
        action.default = argparse.SUPPRESS
    bare._defaults.clear()  # set_defaults()'s values
    return bare


def apply_config(
    args: argparse.Namespace, add_arguments: AddArguments, path: str
) -> frozenset[str]:
    """`path`'s values into `args` where the command line gave none; the destinations given
    by either (the new `args.given`)."""
    from_file = read_config(path, add_arguments)
    for dest, value in from_file.items():
        if dest not in args.given:
            setattr(args, dest, value)
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    default = vars(defaults.parse_args([]))
    return args.given | {dest for dest, value in from_file.items() if value != default[dest]}


def read_config(path: str, add_arguments: AddArguments) -> dict[str, Any]:
    """The file's values by destination, each parsed as its flag parses it."""
    try:
        table = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"--config {path}: cannot read it ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"--config {path}: not TOML: {exc}") from None
    bare = bare_parser(add_arguments)
    actions = {a.dest: a for a in bare._actions if a.option_strings and a.dest != "help"}
    actions.pop(CONFIG_DEST, None)
    values, argv = {}, []
    for key, value in table.items():
        dest = key.replace("-", "_")
        action = actions.get(dest)
        if action is None:
            raise UserError(f"--config {path}: unknown key {key!r}{_closest(dest, actions)}")
        if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
            if not isinstance(value, bool):
                raise UserError(f"--config {path}: {key} is a switch: give true or false")
            values[dest] = value if action.const else not value
        else:
            argv += _as_argv(path, key, action, value)
    try:
        parsed = vars(bare.parse_args(argv))
    except argparse.ArgumentError as exc:
        raise UserError(f"--config {path}: {exc}") from None
    return {**parsed, **values}


def _as_argv(path: str, key: str, action: argparse.Action, value: Any) -> list[str]:
    flag = action.option_strings[-1]
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [part for item in items for part in (flag, str(item))]
    if isinstance(value, list | dict):
        raise UserError(f"--config {path}: {key} takes one value, got {value!r}")
    return [flag, str(value)]


def _closest(dest: str, actions: Iterable[str]) -> str:
    names = {a.replace("_", "-"): a for a in actions}
    match = difflib.get_close_matches(dest.replace("_", "-"), names, n=1, cutoff=0.5)
    return f": did you mean {match[0]!r}?" if match else " (its keys are the command's flags)"


def resolved(args: argparse.Namespace, add_arguments: AddArguments) -> dict[str, Any]:
    """Every flag's value in `args`, keyed by its config name; those that are None left out."""
    bare = bare_parser(add_arguments)
    dests = [a.dest for a in bare._actions if a.option_strings and a.dest != "help"]
    return {
        dest.replace("_", "-"): getattr(args, dest)
        for dest in dests
        if dest != CONFIG_DEST and getattr(args, dest, None) is not None
    }


def to_toml(values: Mapping[str, Any]) -> str:
    """Flat TOML, one `key = value` line each: strings, numbers, booleans and lists of them."""
    return "".join(f"{key} = {_toml_value(value)}\n" for key, value in values.items())


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # inf, -inf and nan are TOML's spellings too
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {type(value).__name__} {value!r}")
