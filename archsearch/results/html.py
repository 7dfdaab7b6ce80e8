"""The study report as one HTML page that opens with no network.

plotly.js is embedded (plotly's own offline bundle, about 4.5 MB), the tables sort with the few
lines of `SORT_JS`, and the style sheet is inline: the file can be mailed, attached to an issue or
opened from a laptop with no connection. Every text from the database is escaped.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from archsearch.fileio import write_atomic
from archsearch.results.regimes import expectation, validation_regime
from archsearch.results.report import (
    DEFAULT_MAX_ROWS,
    REPORT_SUFFIXES,
    Report,
    ReportError,
    StepBreakdown,
    StudySection,
    Validation,
    build_report,
)
from archsearch.search.promotion import ranking_line
from archsearch.units import format_si

if TYPE_CHECKING:
    from archsearch.storage import Storage

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1d2330; }
header { background: #1d2330; color: #fff; padding: 14px 28px; }
header h1 { margin: 0 0 4px; font-size: 21px; } header p { margin: 0; color: #c8cfdc; }
nav { padding: 6px 28px; background: #eef1f6; position: sticky; top: 0; z-index: 5; }
nav a { margin-right: 14px; color: #1f5fbf; text-decoration: none; }
main { padding: 4px 28px 40px; max-width: 1500px; }
h2 { border-bottom: 2px solid #dde2ea; padding-bottom: 3px; margin-top: 30px; }
h3 { margin: 22px 0 6px; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 13px; }
th, td { border-bottom: 1px solid #e3e7ee; padding: 3px 9px; text-align: right; vertical-align: top; }
th { background: #f5f7fa; white-space: nowrap; } td.text, th.text { text-align: left; }
table.sortable th { cursor: pointer; user-select: none; }
th[aria-sort="ascending"]::after { content: " \\25B2"; }
th[aria-sort="descending"]::after { content: " \\25BC"; }
tr.front td { background: #f1f7ff; } tr.knee td { background: #ffe9b8; font-weight: 600; }
.scroll { max-height: 620px; overflow: auto; border: 1px solid #e3e7ee; display: inline-block; }
.scroll th { position: sticky; top: 0; }
.warning { background: #fff4e0; border-left: 5px solid #e08a00; padding: 9px 14px; margin: 10px 0; }
.note { color: #5a6475; } pre { background: #f5f7fa; padding: 8px 12px; overflow: auto; font-size: 12px; }
details { margin: 4px 0; } summary { cursor: pointer; }
"""

# Click a column's header (or Enter on it) to sort by it, again to reverse; missing values stay
# last both ways and ties keep their order, as `archsearch trials --sort` orders them.
SORT_JS = """
(function () {
  function key(cell, numeric) {
    var raw = cell.hasAttribute("data-sort") ? cell.getAttribute("data-sort") : cell.textContent;
    if (raw === "") return null;
    return numeric ? parseFloat(raw) : raw.toLowerCase();
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, col) {
      function sort() {
        var numeric = th.getAttribute("data-type") === "num";
        var up = th.getAttribute("aria-sort") !== "ascending";
        Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", up ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.map.call(body.rows, function (row, i) {
          return [key(row.cells[col], numeric), i, row];
        });
        rows.sort(function (a, b) {
          if (a[0] === null || b[0] === null) return (a[0] === null) - (b[0] === null) || a[1] - b[1];
          if (a[0] < b[0]) return up ? -1 : 1;
          if (a[0] > b[0]) return up ? 1 : -1;
          return a[1] - b[1];
        });
        var sorted = document.createDocumentFragment();
        rows.forEach(function (r) { sorted.appendChild(r[2]); });
        body.appendChild(sorted);
      }
      th.tabIndex = 0;
      th.addEventListener("click", sort);
      th.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); sort(); }
      });
    });
  });
})();
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _when(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(unix))


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _si(value: float | None, unit: str = "") -> str:
    return "-" if value is None else format_si(value, unit)


def _interval(value: float | None, bounds: tuple[float, float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" + (f" [{bounds[0]:.2f}, {bounds[1]:.2f}]" if bounds else "")


# A cell is (html text, sort key or None); a column is (header, numeric, cell of a row).
Cell = tuple[str, Any]


def _table(
    headers: Sequence[tuple[str, bool]],
    rows: Iterable[tuple[Sequence[Cell], str]],
    *,
    sortable: bool = False,
    table_id: str | None = None,
) -> str:
    """A table; `headers` are (text, numeric), each row is (cells, the <tr>'s attributes)."""
    attrs = (f' id="{esc(table_id)}"' if table_id else "") + (' class="sortable"' if sortable else "")
    head = "".join(
        f'<th scope="col"{" data-type=num" if numeric else " class=text"}>{esc(text)}</th>'
        for text, numeric in headers
    )
    body = []
    for cells, tr in rows:
        tds = []
        for (text, key), (_, numeric) in zip(cells, headers, strict=True):
            sort = "" if key is None and not numeric else f' data-sort="{esc("" if key is None else key)}"'
            tds.append(f"<td{'' if numeric else ' class=text'}{sort}>{text}</td>")
        body.append(f"<tr{tr}>{''.join(tds)}</tr>")
    return f"<table{attrs}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render(report: Report) -> str:
    """The report as one self-contained HTML page.

    Raises:
        ArchsearchError: plotly is not installed.
    """
    names = ", ".join(s.name for s in report.sections)
    versions = dict(report.versions)
    nav = ['<a href="#front">front</a>'] + [
        f'<a href="#study-{i}">{esc(s.name)}</a>' for i, s in enumerate(report.sections)
    ] + ['<a href="#versions">versions</a>']  # fmt: skip
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>archsearch report: {esc(names)}</title><style>{CSS}</style></head><body>",
        f"<header><h1>archsearch report: {esc(names)}</h1>",
        f"<p>written {_when(report.generated_at)} from {esc(report.storage)} by archsearch "
        f"{esc(versions.get('archsearch', '?'))}</p></header>",
        f"<nav>{''.join(nav)}</nav><main>",
        _front(report),
        *(_study(i, s) for i, s in enumerate(report.sections)),
        _versions(report),
        f"</main><script>{SORT_JS}</script></body></html>",
    ]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------
# The front
# ------------------------------------------------------------------------------------------------
def write_report(
    storage: Storage,
    studies: Sequence[str],
    path: str | Path,
    *,
    loss: str | None = None,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> Path:
    """Build the report of `studies` and write it to `path` (.html) atomically; returns the path.

    Raises:
        ReportError: `path` is not an .html file, or as `build_report`.
        ArchsearchError: as `build_report`; plotly is not installed.
    """
    path = Path(path)
    if path.suffix.lower() not in REPORT_SUFFIXES:
        raise ReportError(f"the report is one HTML file: give an output ending in .html, not {path.name!r}")
    if path.is_dir():
        raise ReportError(f"{path} is a folder: give the report's file name")
    page = render(build_report(storage, studies, loss=loss, max_rows=max_rows))
    write_atomic(path, page.encode("utf-8"))
    return path


def _front(report: Report) -> str:
    from archsearch.search.plots import front_figure

    labels = {
        s.name: {n: f"trial {n}: {s.shapes.get(n, '')}" for n in s.front.trial_numbers}
        for s in report.sections
    }
    figure = front_figure(report.fronts, labels)
    figure.update_layout(height=560, margin=dict(l=70, r=30, t=60, b=60))
    # plotly's own offline bundle, inline: the page needs no network (no CDN).
    plot = figure.to_html(
        full_html=False, include_plotlyjs=True, div_id="front-plot", config={"displaylogo": False}
    )
    out = [
        '<section id="front"><h2>Front</h2>',
        '<p class="note">Every complete trial with every objective is a faded point (hover for its '
        "shape); the line joins the Pareto front, the star is its knee. Lower left is better.</p>",
        plot,
    ]
    for i, s in enumerate(report.sections):
        f = s.front
        axes = ", ".join(f.front.objectives)
        ref = ", ".join(f"{x:.4g}" for x in f.front.reference)
        out.append(
            f"<h3>{esc(s.name)}: {len(f.front.numbers)} of {len(f.trial_numbers)} complete trials on the "
            f"front</h3><p>hypervolume {f.front.hypervolume:.4g} against reference ({esc(ref)}) in "
            f"({esc(axes)}), log10 for FLOPs and step time"
            + (
                f"; the loss is adjusted: {esc(f.loss_rule.formula())}, beta: {esc(f.beta_rule or '')}"
                if f.loss_rule is not None
                else ""
            )
            + "</p>"
            + (f'<p class="ranked-at">{esc(ranking_line(f.ranking))}</p>' if f.ranking is not None else "")
        )
        out.append(_front_members(i, s))
    out.append("</section>")
    return "\n".join(out)


def _front_members(i: int, s: StudySection) -> str:
    f = s.front
    adjusted = f.loss_rule is not None
    headers = [("", False), ("trial", True), ("shape", False), ("params", True), ("FLOPs/token", True),
               ("loss", True), *((("adjusted", True),) if adjusted else ()), ("step time", True),
               ("throughput", True), ("long loss", True)]  # fmt: skip
    rows = []
    for r, values in zip(f.records, f.front.values, strict=True):
        tps = f.throughput.get(r.number)
        long = s.long.get(r.number)
        cells: list[Cell] = [
            ("knee" if r.number == f.front.knee else "", None),
            (str(r.number), r.number),
            (esc(s.shapes.get(r.number, "")), None),
            (_si(r["params_total"]), r["params_total"]),
            (_si(r["flops_forward_per_token"]), r["flops_forward_per_token"]),
            (_fmt(f.ranked_loss(r), ".4f"), f.ranked_loss(r)),
            *(((f"{values[0]:.4f}", float(values[0])),) if adjusted else ()),
            (_si(r["step_time_s"], "s"), r["step_time_s"]),
            (f"{format_si(tps[0])} tok/s {esc(tps[1])}{' (model)' if tps[2] else ''}" if tps else "-",
             tps[0] if tps else None),
            (_long_cell(long), long[1] if long else None),
        ]  # fmt: skip
        tr = f' class="front{" knee" if r.number == f.front.knee else ""}" data-front-member="{r.number}"'
        rows.append((cells, tr))
    return _table(headers, rows, sortable=True, table_id=f"front-{i}")


def _long_cell(long: tuple[float, float, int] | None) -> str:
    if long is None:
        return "-"
    multiplier, loss, seeds = long
    return f"{loss:.4f} ({multiplier:g}x{f', {seeds} seeds' if seeds > 1 else ''})"


# ------------------------------------------------------------------------------------------------
# A study
# ------------------------------------------------------------------------------------------------
def _study(i: int, s: StudySection) -> str:
    counts = ", ".join(f"{n} {state}" for state, n in (s.record.counts or {}).items() if n)
    links = " ".join(
        f'<a href="#s{i}-{part}">{part}</a>' for part in ("trials", "knee", "validation", "step", "settings")
    )
    return "\n".join(
        [
            f'<section class="study" id="study-{i}"><h2>Study {esc(s.name)}</h2>',
            f"<p>objectives {esc(', '.join(s.record.objectives))}; created {_when(s.record.created_at)}; "
            f"{s.total_trials} trials: {esc(counts)}. {links}</p>",
            _trials(i, s),
            _knee(i, s),
            _validation(i, s),
            _steps(i, s),
            _settings(i, s),
            "</section>",
        ]
    )


# The trials table's columns: (header, numeric, the cell of a row given its columns by name).
def _columns(s: StudySection) -> list[tuple[str, bool, Callable[[dict[str, Any]], Cell]]]:
    rule = s.front.loss_rule

    def number(name: str, render: Callable[[Any], str]) -> Callable[[dict[str, Any]], Cell]:
        return lambda row: (render(row[name]) if row[name] is not None else "-", row[name])

    def adjusted(row: dict[str, Any]) -> Cell:
        if rule is None or row["loss"] is None or not row["params_total"]:
            return "-", None
        value = rule.value(row["loss"], row["loss_change"], row["params_total"])
        return f"{value:.4f}", value

    def long(row: dict[str, Any]) -> Cell:
        entry = s.long.get(row["number"])
        return _long_cell(entry), entry[1] if entry else None

    columns = [
        ("trial", True, number("number", str)),
        ("status", False, lambda row: (esc(row["status"]), row["status"])),
        ("shape", False, lambda row: (esc(s.shapes.get(row["number"], "-")), None)),
        ("params", True, number("params_total", format_si)),
        ("FLOPs/token", True, number("flops_forward_per_token", format_si)),
        ("loss", True, number("loss", lambda v: f"{v:.4f}")),
        ("bits/byte", True, number("bits_per_byte", lambda v: f"{v:.3f}")),
        ("step time", True, number("step_time_s", lambda v: format_si(v, "s"))),
        ("tokens/s", True, number("tokens_per_second", format_si)),
        ("long loss", True, long),
        ("reason", False, lambda row: (esc(row["reason"] or ""), row["reason"] or "")),
    ]
    if rule is not None:
        columns.insert(6, ("adjusted loss", True, adjusted))
    return columns


def _trials(i: int, s: StudySection) -> str:
    columns = _columns(s)
    members, knee = set(s.front.front.numbers), s.front.front.knee
    rows = []
    for values in s.table.rows:
        row = dict(zip(s.table.columns, values, strict=True))
        n = row["number"]
        classes = ("front" if n in members else "") + (" knee" if n == knee else "")
        tr = f' class="{classes.strip()}"' if classes else ""
        tr += f' data-number="{n}"' if n is not None else ""
        rows.append(([render(row) for _, _, render in columns], tr))
    shown = len(s.table)
    note = (
        f'<p class="warning">The table shows {shown} of {s.total_trials} trials (the front and the lowest '
        f"numbers): <code>archsearch trials --study {esc(s.name)} --format csv</code> lists them all.</p>"
        if shown < s.total_trials
        else ""
    )
    table = _table([(h, num) for h, num, _ in columns], rows, sortable=True, table_id=f"trials-{i}")
    return (
        f'<h3 id="s{i}-trials">Trials</h3><p class="note">Click a column to sort by it. Front members are '
        f"shaded, the knee in amber.</p>{note}<div class=scroll>{table}</div>"
    )


def _knee(i: int, s: StudySection) -> str:
    k = s.knee
    out = [
        f'<h3 id="s{i}-knee">The knee: trial {k.number}</h3>',
        f"<p>{esc(k.config.describe() if k.config else '')}<br>{format_si(k['params_total'])} parameters, "
        f"{format_si(k['flops_forward_per_token'])} forward FLOPs/token, proxy loss {_fmt(k['loss'], '.4f')}"
        f", step time {_si(k['step_time_s'], 's')}. The trial <code>archsearch export --study "
        f"{esc(s.name)} --knee</code> writes; each format below is what it would write.</p>",
    ]
    if k.number != s.front.front.knee:  # the fronts rank another loss than the study's (`--loss`)
        out.append(
            f'<p class="note">The plot\'s knee, trial {s.front.front.knee}, is that of the loss the '
            "fronts rank here; export ranks the study's own loss objective.</p>"
        )
    rows = []
    for e in s.exports:
        what = esc(e.target) if e.refused is None else f"refused: {esc(e.refused)}"
        notes = "<br>".join(esc(n) for n in e.notes)
        files = ", ".join(esc(name) for name, _ in e.files) or "-"
        cells = [(esc(e.fmt), None), (what, None), (files, None), (notes, None)]
        rows.append((cells, f' data-format="{esc(e.fmt)}"'))
    headers = [("format", False), ("describes", False), ("files", False), ("notes", False)]
    out.append(_table(headers, rows, table_id=f"exports-{i}"))
    for e in s.exports:
        if e.refused is not None:
            continue
        command = f"archsearch export --study {s.name} --knee --format {e.fmt} -o {e.fmt}/"
        files = "".join(f"<p><b>{esc(name)}</b></p><pre>{esc(text)}</pre>" for name, text in e.files)
        out.append(f"<details><summary>{esc(e.fmt)}: <code>{esc(command)}</code></summary>{files}</details>")
    return "\n".join(out)


def _validation(i: int, s: StudySection) -> str:
    head = f'<h3 id="s{i}-validation">Validation</h3>'
    v = s.validation
    if v is None:
        return (
            f'{head}<div class="warning" role="alert" id="s{i}-not-validated"><b>Study {esc(s.name)} was '
            "never validated.</b> Its loss axis is a short proxy run, which can rank shapes unlike longer "
            f"training; <code>archsearch validate --study {esc(s.name)}</code> retrains a calibration set "
            "for longer and measures how well it ranks.</div>"
        ) + _regime(i, s, None)
    return head + _validation_body(i, v) + _regime(i, s, v)


def _regime(i: int, s: StudySection, v: Validation | None) -> str:
    """Which measured regime the study's proxy sits in, and what was measured there: a study's
    figures read beside the regime that measured them, not the tiny CPU regime's by default."""
    at = {name: k for k, name in enumerate(s.table.columns)}
    rows = [r for r in s.table.rows if r[at["params_total"]]]
    if v is not None:
        text = validation_regime(v.record.report, {r[at["number"]]: r[at["tokens_trained"]] for r in rows})
    elif rows:
        text = "regime: " + expectation(
            [r[at["params_total"]] for r in rows], [r[at["tokens_trained"]] for r in rows]
        )
    else:
        return ""
    return f'<p class="note" id="s{i}-regime">{esc(text)}</p>'


def _validation_body(i: int, v: Validation) -> str:
    report, record = v.record.report, v.record
    seeds = record.seeds
    earlier = f" ({v.earlier} earlier report{'s' if v.earlier > 1 else ''} stored)" if v.earlier else ""
    out = [
        f"<p>{v.trials} trials retrained at {record.multiplier:g}x the proxy's tokens, {seeds} seed"
        f"{'s' if seeds > 1 else ''}, stored {_when(record.created_at)}{earlier}. Rank correlations "
        "with the long-run loss (seed mean), each with its approximate 95% interval (Fisher z: "
        "Bonett-Wright for Spearman, Fieller-Hartley-Pearson for Kendall).</p>"
    ]
    rows = []
    for c in v.correlations:
        label = esc(c.predictor) + (" <b>(the study's objective)</b>" if c.objective else "")
        iso = f"{c.iso_pairs[0]}/{c.iso_pairs[1]}" if c.iso_pairs else "-"
        cells = [(label, None), (_interval(c.spearman, c.spearman_interval), c.spearman),
                 (_interval(c.kendall, c.kendall_interval), c.kendall), (iso, None)]  # fmt: skip
        rows.append((cells, ""))
    headers = [
        ("predictor", False), ("Spearman [95%]", True), ("Kendall [95%]", True), ("iso-params pairs", True),
    ]  # fmt: skip
    out.append(_table(headers, rows, table_id=f"correlations-{i}"))
    floor = report.get("noise_floor")
    floor_text = f"{floor:.4f}" if floor is not None else "- (one seed)"
    out.append(f"<p>seed noise floor (pooled sd): {floor_text}</p>")
    fronts = report.get("fronts", {})
    if "shared" in fronts:
        out.append(
            f"<p>fronts (loss vs FLOPs): proxy {len(fronts['proxy'])}, long run {len(fronts['long'])}, "
            f"shared {fronts['shared']}</p>"
        )
    trial_rows = []
    for r in report.get("rows", ()):
        losses = r.get("long_losses") or []
        spread = f"{min(losses):.4f} - {max(losses):.4f}" if len(losses) > 1 else "-"
        long = r.get("long_loss")
        cells = [(str(r["number"]), r["number"]), (esc(r.get("shape", "")), None),
                 (format_si(r["params_total"]), r["params_total"]), (format_si(r["flops"]), r["flops"]),
                 (f"{r['proxy_loss']:.4f}", r["proxy_loss"]), (_fmt(long, ".4f"), long),
                 (spread, None)]  # fmt: skip
        trial_rows.append((cells, ""))
    headers = [("trial", True), ("shape", False), ("params", True), ("FLOPs/token", True),
               ("proxy loss", True), ("long loss", True), ("seeds' range", False)]  # fmt: skip
    out.append(_table(headers, trial_rows, sortable=True, table_id=f"validation-{i}"))
    return "\n".join(out)


def _steps(i: int, s: StudySection) -> str:
    head = f'<h3 id="s{i}-step">The knee\'s training step</h3>'
    if not s.breakdowns:
        return f'{head}<p class="note">No step profile is stored for trial {s.knee.number}.</p>'
    return head + "\n".join(_breakdown(b) for b in s.breakdowns)


def _breakdown(b: StepBreakdown) -> str:
    how = "modelled" if b.modelled else "measured"
    out = [
        f"<p><b>{esc(b.device)}</b> ({how}, {esc(b.dtype)}, batch {b.batch}): step "
        f"{format_si(b.step_time_s, 's')}, {format_si(b.tokens_per_second)} tokens/s"
        + (f"; {esc(b.source)}" if b.source else "; no breakdown stored, the step time only")
        + "</p>"
    ]
    if b.parts:
        rows = [
            ([(esc(what), None), (format_si(seconds, "s"), seconds), (f"{seconds / b.step_time_s:.1%}", None),
              (esc(holds or ""), None)], "")
            for what, seconds, holds in b.parts
        ]  # fmt: skip
        out.append(_table([("part", False), ("time", True), ("share", True), ("holds", False)], rows))
    if b.kernels:
        rows = [
            ([(esc(name), None), (str(count), count), (format_si(total, "s"), total),
              (f"{tflops:.2f}", tflops)], "")
            for name, count, total, tflops in b.kernels
        ]  # fmt: skip
        headers = [("slowest kernels", False), ("calls", True), ("time per step", True), ("TFLOP/s", True)]
        out.append(_table(headers, rows))
    return "\n".join(out)


def _settings(i: int, s: StudySection) -> str:
    spec = json.dumps(s.record.spec, indent=2, sort_keys=True)
    out = [
        f'<h3 id="s{i}-settings">Settings, devices and versions that ran</h3>',
        f"<details><summary>the space file as written (fingerprint {esc(s.record.spec_fingerprint[:12])})"
        f"</summary><pre>{esc(s.record.spec_source or '(not stored)')}</pre></details>",
        f"<details><summary>the space as parsed</summary><pre>{esc(spec)}</pre></details>",
    ]
    if s.search_runs:
        rows = [
            ([(esc(r.host), None), (_when(r.started_at), r.started_at),
              (esc(", ".join(f"{k}={v}" for k, v in sorted(r.settings.items()))), None)], "")
            for r in s.search_runs
        ]  # fmt: skip
        out.append(_table([("driver", False), ("started", True), ("settings", False)], rows))
    else:
        out.append('<p class="note">No driver run is recorded (a study from before they were stored).</p>')
    if s.devices:
        rows = []
        for d in s.devices:
            info = d.info or {}
            cells = [(esc(info.get("name", "(unknown)")), None), (esc(info.get("type", "")), None),
                     (esc(info.get("threads", "")), None), (esc(info.get("torch_version", "")), None),
                     (esc(info.get("cuda_version") or ""), None), (esc(d.fingerprint), None),
                     (str(d.trials), d.trials), (str(d.long_runs), d.long_runs)]  # fmt: skip
            rows.append((cells, ""))
        headers = [("device", False), ("type", False), ("threads", False), ("torch", False), ("CUDA", False),
                   ("fingerprint", False), ("trials", True), ("long runs", True)]  # fmt: skip
        out.append(_table(headers, rows, table_id=f"devices-{i}"))
    else:
        out.append('<p class="note">No device is recorded for this study\'s trials.</p>')
    return "\n".join(out)


def _versions(report: Report) -> str:
    items = "".join(f"<li>{esc(name)} {esc(version)}</li>" for name, version in report.versions)
    return (
        '<section id="versions"><h2>Versions</h2><p>The torch and CUDA versions each device trained with are '
        "in its study's device table; this report was written with:</p>"
        f"<ul>{items}</ul></section>"
    )
