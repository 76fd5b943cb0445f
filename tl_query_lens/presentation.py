"""How a result presents itself: named scalars, typed tables, plotly figures and an HTML section.

Every result class (:class:`~tl_query_lens.results.SavableResult`) answers the four calls of :class:`Presentable`.
Whatever shows a result (``Tracker.log_result``, the HTML report, the feature atlas, the command line's printout)
reads only these four calls, so the columns of a table are written once, in the result class.

* :meth:`Presentable.scalars` — the headline numbers, ``name → float`` (booleans as 0/1, ints as floats; a missing
  value is left out, NaN and ±inf stay).
* :meth:`Presentable.tables` — ``name → Table``; a :class:`Table` declares each column's type and checks its cells.
* :meth:`Presentable.figures` — ``name → plotly figure`` (plotly is imported only when a figure is drawn).
* :meth:`Presentable.report_section` — one ``<section>`` of HTML built from the three above (no script tags: the
  report that holds it embeds plotly.js once).

:class:`Presents` gives the defaults that most results need: scalars from the result's numeric fields, no tables, no
figures, and a section that shows both; a result overrides only what it has more of.
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

CELL_TYPES: tuple[type, ...] = (bool, int, float, str)


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a :class:`Table`: its name, the Python type of its cells, and whether a cell may be None."""

    name: str
    type: type
    optional: bool = False

    def __post_init__(self) -> None:
        if self.type not in CELL_TYPES:
            raise TypeError(f"Column {self.name!r}: type must be one of bool, int, float, str, not {self.type!r}.")

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` is a cell of this column (bool is not an int here, and an int is not a float)."""
        if value is None:
            return self.optional
        return type(value) is self.type


@dataclasses.dataclass
class Table:
    """Rows of typed cells. Build it with :meth:`build`, which converts what a result holds (tensors, numpy numbers,
    ints in float columns) to the declared types and refuses what cannot be converted; :meth:`check` says whether
    every cell has its column's type.

    Attributes:
        columns: the columns, in order.
        rows: one tuple per row, one cell per column.
    """

    columns: tuple[Column, ...]
    rows: list[tuple[Any, ...]]

    @classmethod
    def build(cls, columns: Mapping[str, type | tuple[type, None]], rows: Iterable[Sequence[Any]]) -> Table:
        """``columns``: ``name → type`` (``(type, None)`` for a column whose cells may be None), in order."""
        cols = tuple(
            Column(name, spec[0], optional=True) if isinstance(spec, tuple) else Column(name, spec)
            for name, spec in columns.items()
        )
        converted = []
        for row in rows:
            row = tuple(row)
            if len(row) != len(cols):
                raise ValueError(f"A row of {len(row)} cells for {len(cols)} columns {[c.name for c in cols]}.")
            converted.append(tuple(_convert(value, col) for value, col in zip(row, cols)))
        return cls(cols, converted)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def check(self) -> None:
        """Raise TypeError naming the first cell whose type is not its column's."""
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise TypeError(f"Row {i} has {len(row)} cells for {len(self.columns)} columns.")
            for value, col in zip(row, self.columns):
                if not col.accepts(value):
                    raise TypeError(
                        f"Row {i}, column {col.name!r}: {value!r} is a {type(value).__name__}, not a "
                        f"{col.type.__name__}{' or None' if col.optional else ''}."
                    )

    def column(self, name: str) -> list[Any]:
        """The cells of column ``name``."""
        index = self.names.index(name)
        return [row[index] for row in self.rows]

    def records(self) -> list[dict[str, Any]]:
        """One ``{column: cell}`` dict per row."""
        return [dict(zip(self.names, row)) for row in self.rows]

    def lists(self) -> tuple[list[str], list[list[Any]]]:
        """``(column names, rows as lists)``: what ``Tracker.log_table`` and CSV writers take."""
        return self.names, [list(row) for row in self.rows]

    def to_html(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.names)
        body = "".join("<tr>" + "".join(f"<td>{_fmt(v)}</td>" for v in row) + "</tr>" for row in self.rows)
        return f"<table><tr>{head}</tr>{body}</table>"

    def to_markdown(self) -> str:
        lines = ["| " + " | ".join(self.names) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(_fmt(v, escape=False) for v in row) + " |" for row in self.rows]
        return "\n".join(lines)


def _convert(value: Any, col: Column) -> Any:
    if value is None:
        if col.optional:
            return None
        raise TypeError(f"Column {col.name!r} does not take None; declare it as ({col.type.__name__}, None).")
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        value = value.item()  # 0-d tensors and numpy numbers
    if col.type is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if col.type is int and isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if col.type is bool and isinstance(value, bool):
        return value
    if col.type is str and isinstance(value, str):
        return value
    raise TypeError(f"Column {col.name!r} ({col.type.__name__}): cannot take {value!r} ({type(value).__name__}).")


def _fmt(value: Any, *, escape: bool = True) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else "–" if value is None else str(value)
    return html.escape(text) if escape else text


@runtime_checkable
class Presentable(Protocol):
    """The interface every result class implements (see the module docstring)."""

    def scalars(self) -> dict[str, float]: ...

    def tables(self) -> dict[str, Table]: ...

    def figures(self) -> dict[str, Any]: ...

    def report_section(self) -> str: ...


def as_scalar(value: Any) -> float | None:
    """``value`` as a float when it is one number (bool, int, float, 0-d tensor), else None."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, (bool, int, float)):
        return float(value)
    return None


def numeric_fields(obj: Any, names: Iterable[str] | None = None, *, prefix: str = "") -> dict[str, float]:
    """``prefix + field → float`` for the dataclass fields of ``obj`` (or ``names``) that hold one number; lists of
    two numbers (confidence intervals) become ``field_lo`` / ``field_hi``; dicts of numbers become ``field/key``."""
    out: dict[str, float] = {}
    names = [f.name for f in dataclasses.fields(obj) if not f.name.startswith("_")] if names is None else names
    for name in names:
        value = getattr(obj, name)
        number = as_scalar(value)
        if number is not None:
            out[prefix + name] = number
        elif isinstance(value, (list, tuple)) and len(value) == 2 and all(as_scalar(v) is not None for v in value):
            out[f"{prefix}{name}_lo"], out[f"{prefix}{name}_hi"] = (float(v) for v in value)
        elif isinstance(value, dict) and value and all(as_scalar(v) is not None for v in value.values()):
            out.update({f"{prefix}{name}/{k}": float(as_scalar(v)) for k, v in value.items()})  # type: ignore[arg-type]
    return out


class Presents:
    """Defaults of the :class:`Presentable` interface for dataclass results (mixed into ``SavableResult``)."""

    #: Title of the report section (default: the class name).
    title: ClassVar[str] = ""

    def scalars(self) -> dict[str, float]:
        """The numeric fields (see :func:`numeric_fields`); results override this to choose their headline numbers."""
        return numeric_fields(self)

    def tables(self) -> dict[str, Table]:
        return {}

    def figures(self) -> dict[str, Any]:
        return {}

    def summary_line(self) -> str:
        """One line the command line prints after the tables (e.g. where to open a site); empty by default."""
        return ""

    def report_section(self) -> str:
        """``<section>`` with the title, the scalars as a two-column table, every table and every figure."""
        return section_html(self.title or type(self).__name__, self.scalars(), self.tables(), self.figures())


def section_html(title: str, scalars: Mapping[str, float], tables: Mapping[str, Table], figures: Mapping[str, Any]):
    """The HTML of a report section (figures without plotly.js: the page that holds the section embeds it once)."""
    parts = [f"<section><h2>{html.escape(title)}</h2>"]
    if scalars:
        rows = "".join(
            f"<tr><td>{html.escape(k)}</td><td>{_fmt(v) if not math.isnan(v) else 'NaN'}</td></tr>"
            for k, v in scalars.items()
        )
        parts.append(f"<table class='scalars'>{rows}</table>")
    for name, table in tables.items():
        parts.append(f"<h3>{html.escape(name)}</h3>{table.to_html()}")
    for figure in figures.values():
        parts.append(figure.to_html(full_html=False, include_plotlyjs=False, default_width="100%"))
    parts.append("</section>")
    return "".join(parts)
