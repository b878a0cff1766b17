"""Tables that fit the terminal and never cut a number.

NOTE [ Narrow terminals ]
rich shrinks every column of a table wider than the console and cuts what no longer fits with an
ellipsis, numbers included (an 80-column terminal showed a profile's `108.1…`). Here each number
column gets exactly the width of its widest cell (numbers are never wrapped or cut), text columns
(names) share what is left and wrap (fold) inside it, and when even that does not fit the
columns marked droppable go, lowest priority first, named in the table's caption.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Col", "fitted_table", "MIN_TEXT_WIDTH"]

MIN_TEXT_WIDTH = 8  # a text column narrower than this folds names into unreadable pieces


@dataclass(frozen=True)
class Col:
    """A column: its header, whether it holds numbers (never cut), and its drop priority (None:
    always shown; higher numbers go first when the table is too wide)."""

    header: str
    number: bool = True
    drop: int | None = None


def _need(col: Col, cells: list[str]) -> int:
    """The width that shows every cell and the header whole (a number column does not wrap)."""
    return max([len(col.header), *(len(c) for c in cells)])


def fitted_table(title: str, cols: list[Col], rows: list[list[str]], *, width: int | None = None,
                 **table_options):
    """A rich Table of `rows` under `cols` that fits `width` characters (default: the console's,
    which honours COLUMNS) without cutting a number. Returns the Table."""
    from rich.table import Table

    from memplan.cli._app import console

    width = width or console().width
    keep = list(range(len(cols)))
    cells = [[str(r[i]) for r in rows] for i in range(len(cols))]

    def total(idx: list[int]) -> int:  # widths, plus padding (2) and a border (1) per column
        return sum(_need(cols[i], cells[i]) if cols[i].number
                   else min(_need(cols[i], cells[i]), MIN_TEXT_WIDTH) for i in idx) + 3 * len(idx) + 1

    dropped = []
    while total(keep) > width:
        droppable = [i for i in keep if cols[i].drop is not None]
        if not droppable:
            break
        worst = max(droppable, key=lambda i: cols[i].drop)
        keep.remove(worst)
        dropped.append(cols[worst].header)
    fixed = sum(_need(cols[i], cells[i]) for i in keep if cols[i].number)
    text = [i for i in keep if not cols[i].number]
    room = width - fixed - 3 * len(keep) - 1
    caption = (f"not shown at {width} columns: {', '.join(dropped)} (widen the terminal or use "
               "--json)") if dropped else None
    # the room for names, shared narrowest need first: a column that needs less than an equal
    # share leaves the rest to the wider ones
    text_width: dict[int, int] = {}
    left = room
    for n, i in enumerate(sorted(text, key=lambda i: _need(cols[i], cells[i]))):
        share = max(MIN_TEXT_WIDTH, left // (len(text) - n))
        text_width[i] = min(share, _need(cols[i], cells[i]))
        left -= text_width[i]
    table = Table(title=title, caption=caption, **table_options)
    for i in keep:
        col = cols[i]
        if col.number:
            table.add_column(col.header, justify="right", no_wrap=True,
                             width=_need(col, cells[i]))
        else:
            table.add_column(col.header, justify="left", overflow="fold", max_width=text_width[i])
    for r in range(len(rows)):
        table.add_row(*(cells[i][r] for i in keep))
    return table
