"""A static, offline HTML report: feature cards, plotly figures (JavaScript embedded once) and tables."""

from __future__ import annotations

import html
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tl_query_lens.report.tokens import readable
from tl_query_lens.results import atomic_write_text

logger = logging.getLogger(__name__)

# A URL scheme: a letter, then letters, digits, "+", "-" or ".", then ":" (RFC 3986 §3.1).
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*):")


@dataclass
class TokenList:
    """A ranked token list of one signature: strings and scores, best first."""

    method: str
    strings: list[str]
    scores: list[float]


@dataclass
class FeatureCard:
    """One feature: key signatures beside value signatures (logit lens vs Query Lens) and per-module shares."""

    title: str
    key_lists: list[TokenList] = field(default_factory=list)
    value_lists: list[TokenList] = field(default_factory=list)
    module_shares: dict[str, float] = field(default_factory=dict)
    notes: str = ""
    link: str = ""  # e.g. the feature's atlas page, relative to the report


@dataclass
class Section:
    """A titled block of the report: free text, figures, tables and/or feature cards."""

    title: str
    text: str = ""
    figures: list[Any] = field(default_factory=list)  # plotly figures
    tables: list[tuple[list[str], list[list[Any]]]] = field(default_factory=list)
    cards: list[FeatureCard] = field(default_factory=list)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:1em}
.card{border:1px solid #ccc;border-radius:6px;padding:.8em}.card h3{margin:.1em 0 .5em;font-size:1.05em}
.sig{display:flex;gap:.6em}.sig div{flex:1}.sig h4{margin:.2em 0;font-size:.85em;color:#555}
.tok{display:inline-block;background:#eef3ff;border-radius:3px;padding:0 .3em;margin:1px;font-family:monospace;
font-size:.8em;white-space:pre}.neg{background:#fff0ee}
.score{color:#666;font-size:.75em;margin:0 .4em 0 .1em;font-variant-numeric:tabular-nums}
.bar{height:14px;display:inline-block;vertical-align:middle}.bar.pos{background:#4c78a8}.bar.negative{background:#e45756}
.axis{display:inline-block;width:90px;text-align:right;border-right:1px solid #999}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0}td,th{border:1px solid #ddd;padding:.2em .5em}
th{background:#f4f4f4;overflow-wrap:anywhere}.muted{color:#777;font-size:.85em}
"""


def _tokens(tokens: TokenList, limit: int = 12) -> str:
    """Chips of the top tokens, each with its score beside it (whitespace and control characters made visible)."""
    chips = "".join(
        f'<span class="tok{" neg" * (score < 0)}">{html.escape(readable(s))}</span>'
        f'<span class="score">{score:.3g}</span>'
        for s, score in zip(tokens.strings[:limit], tokens.scores[:limit])
    )
    return f"<div><h4>{html.escape(tokens.method)}</h4>{chips}</div>"


def safe_link(link: str) -> str | None:
    """``link`` if a browser would open it as a relative path or an http(s) URL, else None.

    Browsers drop whitespace and control characters around and inside a scheme (``" java\\tscript:"`` runs script),
    so the scheme is read with those removed; any scheme but ``http`` / ``https`` (``javascript:``, ``data:``,
    ``vbscript:``, ``file:``) is refused.
    """
    bare = "".join(c for c in link if ord(c) > 0x20 and ord(c) != 0x7F)
    scheme = _SCHEME.match(bare)
    if scheme is None or scheme.group(1).lower() in ("http", "https"):
        return link
    return None


def _card(card: FeatureCard) -> str:
    title = html.escape(card.title)
    if card.link:
        link = safe_link(card.link)
        if link is None:
            logger.warning(
                "report: the link of card %r is not a relative path or an http(s) URL; shown unlinked", card.title
            )
        else:
            title = f'<a href="{html.escape(link, quote=True)}">{title}</a>'
    parts = [f'<div class="card"><h3>{title}</h3>']
    if card.key_lists:
        parts.append("<b>key — what activates it</b><div class='sig'>")
        parts.extend(_tokens(t) for t in card.key_lists)
        parts.append("</div>")
    if card.value_lists:
        parts.append("<b>value — what it promotes</b><div class='sig'>")
        parts.extend(_tokens(t) for t in card.value_lists)
        parts.append("</div>")
    if card.module_shares:
        parts.append(f"<b>per-module shares</b><table>{_share_rows(card.module_shares)}</table>")
    if card.notes:
        parts.append(f"<p class='muted'>{html.escape(card.notes)}</p>")
    parts.append("</div>")
    return "".join(parts)


def _share_rows(shares: dict[str, float], width: int = 90) -> str:
    """Signed bars on a shared axis: positive shares to the right (blue), negative to the left (red)."""
    top = max(abs(v) for v in shares.values()) or 1.0
    rows = []
    for name, v in shares.items():
        bar = f"<span class='bar {'pos' if v >= 0 else 'negative'}' style='width:{width * abs(v) / top:.0f}px'></span>"
        cell = f"<span class='axis'></span>{bar}" if v >= 0 else f"<span class='axis'>{bar}</span>"
        rows.append(f"<tr><td>{html.escape(name)}</td><td style='white-space:nowrap'>{cell}</td><td>{v:+.3f}</td></tr>")
    return "".join(rows)


def _table(columns: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else html.escape(str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{fmt(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<div class='scroll'><table><tr>{head}</tr>{body}</table></div>"


def build_report(
    path: str | Path, sections: list[Section], *, title: str = "tl_query_lens report", subtitle: str = ""
) -> Path:
    """Write a single self-contained HTML file (plotly.js inlined once, so it opens offline)."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    if subtitle:
        body.append(f"<p class='muted'>{html.escape(subtitle)}</p>")
    for section in sections:
        body.append(f"<h2>{html.escape(section.title)}</h2>")
        if section.text:
            body.append(f"<p>{html.escape(section.text)}</p>")
        for columns, rows in section.tables:
            body.append(_table(columns, rows))
        for figure in section.figures:
            body.append(figure.to_html(full_html=False, include_plotlyjs=False, default_width="100%"))
        if section.cards:
            body.append("<div class='cards'>" + "".join(_card(c) for c in section.cards) + "</div>")
    return write_page(path, body, title=title)


def write_page(path: str | Path, parts: list[str], *, title: str) -> Path:
    """A self-contained HTML page of ``parts`` (HTML fragments, e.g. results' ``report_section()``), plotly.js
    inlined once so it opens offline."""
    from plotly.offline import get_plotlyjs

    page = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style><script type='text/javascript'>{get_plotlyjs()}</script></head>"
        f"<body>{''.join(parts)}</body></html>"
    )
    return atomic_write_text(path, page)
