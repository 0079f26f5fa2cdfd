"""The words and tables the tools print: counted nouns, and a table as markdown in a log or with rich on a terminal."""

from __future__ import annotations

import sys


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def markdown_table(header: list[str], cells: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


def print_table(header: list[str], cells: list[list[str]], title: str) -> None:
    """A rich table on a terminal; the same table as plain markdown text in a log or a pipe."""
    if not sys.stdout.isatty():
        print(markdown_table(header, cells), flush=True)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for i, column in enumerate(header):
        table.add_column(column, justify="left" if i == 0 else "right")
    for row in cells:
        table.add_row(*row)
    Console().print(table)
