"""The executor's handlers tell an op's variants apart by its operands' roles (`vocab.Role`),
never by its unit number, its operand count or a value's name: what an op does is what the
Program says, so the simulator sees the same thing. Grep-level, over the handler modules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

HANDLERS = ("compute.py", "handlers.py", "runtime.py", "fused.py", "host_adam.py", "adam.py")
EXECUTOR = Path(__file__).resolve().parents[2] / "executor"
CONVENTIONS = {
    "a unit number": re.compile(r"\b(?:u|unit|op\.unit)\s*(?:==|!=|<|>|<=|>=)\s*\d"),
    "an operand count": re.compile(r"\blen\(\s*op\.(?:reads|writes)\s*\)"),
    "a value's name": re.compile(
        r"\bop\.(?:reads|writes)\[\d+\]\.name\s*(?:==|!=|\bin\b)"
        r"|\.name\.(?:startswith|endswith)\("
    ),
}


@pytest.mark.parametrize(
    ("what", "line"),
    [
        ("a unit number", "        if u == 0:"),
        ("a unit number", "    if op.unit > 3:"),
        ("an operand count", "        elif len(op.writes) > 1:"),
        ("a value's name", '    if op.reads[1].name == "tape":'),
        ("a value's name", '    if v.name.endswith(".tokens"):'),
    ],
)
def test_each_convention_is_caught(what: str, line: str) -> None:
    assert CONVENTIONS[what].search(line), (what, line)


def test_handlers_branch_on_roles_only() -> None:
    found = []
    for name in HANDLERS:
        for number, line in enumerate((EXECUTOR / name).read_text().splitlines(), 1):
            found += [f"{name}:{number}: {what}: {line.strip()}"
                      for what, pattern in CONVENTIONS.items() if pattern.search(line)]  # fmt: skip
    assert not found, "\n".join(found)
