"""The page: one self-contained HTML file, plotly.js inlined once, no network request.

Every text from a record passes through `e` (html.escape) before it reaches the
page; figure JSON is escaped by plotly itself (`<` written as \\u003c). The table
sorts and filters by a few lines of inline script; nothing is fetched.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from typing import Any

import plotly.offline

from training_harness.reports.style import Figure, num


def e(text: Any) -> str:
    return html.escape("" if text is None else str(text), quote=True)


def plotly_js() -> str:
    js = plotly.offline.get_plotlyjs()
    return js.replace("</script", "<\\/script").replace("<!--", "<\\!--")


CSS = """
:root{--fg:#1f2328;--muted:#5b6572;--line:#d8dee4;--bg:#f6f8fa;--good:#1a7f37;--bad:#b42318}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:var(--fg)}
header{background:#0d2740;color:#fff;padding:18px 32px}
header h1{margin:0 0 4px;font-size:22px}
header .sub{color:#c9d6e3}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid var(--line);
 padding:6px 32px;z-index:10;font-size:13px}
nav a{margin-right:14px;color:#0b5cad;text-decoration:none}
main{max-width:1560px;margin:0 auto;padding:8px 32px 48px}
section{margin:26px 0}
h2{font-size:18px;margin:0 0 6px;border-bottom:1px solid var(--line);padding-bottom:4px}
.caption,.note{color:var(--muted);margin:4px 0 8px;max-width:980px}
.empty{background:var(--bg);border:1px dashed var(--line);padding:14px;color:var(--muted)}
.verdict{font-size:17px;margin:10px 0 14px}
.cards{display:flex;flex-wrap:wrap;gap:12px}
.card{border:1px solid var(--line);border-radius:8px;padding:10px 14px;min-width:190px;
 background:#fff}
.card .k{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card .v{font-size:24px;font-weight:600}
.card .d{color:var(--muted);font-size:12px}
.good{color:var(--good)}.bad{color:var(--bad)}
pre{background:var(--bg);border:1px solid var(--line);padding:8px 10px;overflow-x:auto;
 white-space:pre-wrap;word-break:break-all;margin:6px 0}
table{border-collapse:collapse;font-size:12.5px}
th,td{border-bottom:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.w{min-width:230px;max-width:340px}td.r{min-width:220px;max-width:420px;word-break:break-word}
table.sortable th{cursor:pointer;background:var(--bg);position:sticky;top:0;user-select:none}
table.sortable th[data-dir=asc]::after{content:" ▲"}
table.sortable th[data-dir=desc]::after{content:" ▼"}
.scroll{max-height:620px;overflow:auto;border:1px solid var(--line)}
tr.best td{background:#fff7d6}tr.baseline td{background:#eef2f6}
.st{display:inline-block;padding:0 6px;border-radius:9px;font-size:11.5px;color:#fff}
.st-ok{background:#2e9e6a}.st-oom{background:#c0392b}.st-failed{background:#8e2c2c}
.st-timeout{background:#b9770e}.st-diverged{background:#8e44ad}.st-pruned{background:#95a5a6}
.grid2{display:grid;grid-template-columns:1fr 1fr;gap:24px}
@media (max-width:1000px){.grid2{grid-template-columns:1fr}}
input.filter{margin:4px 0 8px;padding:4px 8px;width:320px;border:1px solid var(--line)}
"""

SORT_JS = """
document.querySelectorAll('table.sortable').forEach(function (t) {
  var heads = t.tHead.rows[0].cells;
  Array.prototype.forEach.call(heads, function (th, i) {
    th.addEventListener('click', function () {
      var asc = th.dataset.dir !== 'asc', num = th.dataset.type === 'num';
      Array.prototype.forEach.call(heads, function (h) { delete h.dataset.dir; });
      th.dataset.dir = asc ? 'asc' : 'desc';
      var body = t.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var key = function (r) { var c = r.cells[i], v = c.dataset.v;
        v = v === undefined ? c.textContent : v;
        return num ? (v === '' ? NaN : parseFloat(v)) : v.toLowerCase(); };
      rows.sort(function (a, b) { var x = key(a), y = key(b);
        if (num) { if (isNaN(x)) return isNaN(y) ? 0 : 1; if (isNaN(y)) return -1; }
        return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1); });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
document.querySelectorAll('input.filter').forEach(function (box) {
  var t = document.getElementById(box.dataset.table);
  box.addEventListener('input', function () {
    var q = box.value.toLowerCase();
    Array.prototype.forEach.call(t.tBodies[0].rows, function (r) {
      r.style.display = r.textContent.toLowerCase().indexOf(q) < 0 ? 'none' : ''; });
  });
});
"""


def page(title: str, subtitle: str, nav: Sequence[tuple[str, str]], body: str) -> str:
    """The whole document; `title` and `subtitle` are plain text, `body` is built HTML."""
    links = "".join(f'<a href="#{e(k)}">{e(label)}</a>' for k, label in nav)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)}</title><style>{CSS}</style>"
        f'<script>window.PlotlyConfig = {{MathJaxConfig: "local"}};</script>'
        f"<script>{plotly_js()}</script></head><body>"
        f'<header><h1>{e(title)}</h1><div class="sub">{e(subtitle)}</div></header>'
        f"<nav>{links}</nav><main>{body}</main><script>{SORT_JS}</script></body></html>\n")


def section(key: str, title: str, inner: str, caption: str = "") -> str:
    cap = f'<p class="caption">{e(caption)}</p>' if caption else ""
    return f'<section id="{e(key)}"><h2>{e(title)}</h2>{cap}{inner}</section>'


def figure(f: Figure, extra: str = "") -> str:
    """A figure's section: the plot, or a plain sentence where there is nothing to draw;
    `extra` is built HTML shown below it."""
    if f.fig is None:
        return section(f.key, f.title, f'<p class="empty">{e(f.empty)}</p>{extra}')
    plot = f.fig.to_html(full_html=False, include_plotlyjs=False, default_width="100%",
                         config={"displaylogo": False, "responsive": True})
    return section(f.key, f.title, f'<div class="plot">{plot}</div>{extra}', f.caption)


def card(key: str, value: str, detail: str = "", cls: str = "") -> str:
    return (f'<div class="card"><div class="k">{e(key)}</div>'
            f'<div class="v {e(cls)}">{e(value)}</div><div class="d">{e(detail)}</div></div>')


def status(s: str) -> str:
    return f'<span class="st st-{e(s)}">{e(s)}</span>'


def kv_table(rows: Iterable[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def sortable_table(table_id: str, columns: Sequence[tuple[str, str]],
                   rows: Iterable[tuple[str, Sequence[tuple[str, Any]]]]) -> str:
    """columns: (title, kind) with kind "num" (sorted as numbers, right-aligned), "text",
    "wide" or "long" (text in a wider or a wrapping column); rows: (row class,
    [(cell HTML, sort value)]). Cell HTML must already be escaped; sort values are
    escaped here."""
    classes = {"num": " class=n", "wide": " class=w", "long": " class=r"}
    head = "".join(f'<th data-type="{e(kind)}">{e(name)}</th>' for name, kind in columns)
    out = []
    for cls, cells in rows:
        tds = "".join(
            f'<td{classes.get(kind, "")} data-v="{e(_sort_value(v))}">{c}</td>'
            for (c, v), (_, kind) in zip(cells, columns, strict=True))
        out.append(f'<tr class="{e(cls)}">{tds}</tr>')
    return (f'<input class="filter" data-table="{e(table_id)}" placeholder="filter rows…">'
            f'<div class="scroll"><table id="{e(table_id)}" class="sortable"><thead><tr>{head}'
            f'</tr></thead><tbody>{"".join(out)}</tbody></table></div>')


def _sort_value(v: Any) -> str:
    if isinstance(v, str):
        return v
    x = num(v)
    return "" if x is None else repr(x)
