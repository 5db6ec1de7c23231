"""``python -m bytegraph.report DEBUG_DIR -o report.html``: one static page about a debug directory.

The page is self-contained (inline CSS and a small inline script, no network, no external
assets) and works opened from disk. It shows, for one run of ``BYTEGRAPH_DEBUG_DIR``:

- a summary (frames, graphs, ops, graph breaks, eager frames, recompiles, compile time);
- a time bar per phase (tracing, fake tensors, guards, code generation, backend), for the
  whole run and per frame;
- the frames compiled, in order, with their outcome, graphs, op counts and guards;
- each graph break and eager frame with its reason, hint, and the user's stack, the source
  around each line with the breaking line highlighted;
- each recompile with the guard that failed, and the cache entries of each code object;
- per frame: graphs (op counts and code), guards, generated code, files.

``DEBUG_DIR`` is the directory given to ``BYTEGRAPH_DEBUG_DIR`` (its newest run is shown; pick
another with ``--run``) or one run folder.
"""
import argparse
import html
import json
import os
import sys

from .timing import PHASES

PHASE_COLORS = {"bytecode tracing": "#4e79a7", "fake-tensor propagation": "#59a14f", "guard building": "#edc948",
                "code generation": "#b07aa1", "backend compile": "#e15759"}
MAX_EMBEDDED = 200_000    # characters of one file shown inline; longer files are linked


def find_run(path, run=None):
    """The run folder to report on: ``path`` itself if it holds an index.json, else its newest
    (or named) ``run_*`` folder."""
    if os.path.isfile(os.path.join(path, "index.json")) and run is None:
        return path
    if not os.path.isdir(path):
        raise SystemExit(f"bytegraph.report: {path!r} is not a directory")
    runs = sorted(d for d in os.listdir(path) if d.startswith("run_")
                  and os.path.isfile(os.path.join(path, d, "index.json")))
    if run is not None:
        if run not in runs:
            raise SystemExit(f"bytegraph.report: no run {run!r} in {path!r}; runs: {', '.join(runs) or 'none'}")
        return os.path.join(path, run)
    if not runs:
        raise SystemExit(f"bytegraph.report: {path!r} holds no debug run (no index.json); set "
                         "BYTEGRAPH_DEBUG_DIR to it and run the program first")
    return os.path.join(path, runs[-1])


def load_index(run_dir):
    with open(os.path.join(run_dir, "index.json"), encoding="utf-8") as f:
        return json.load(f)


def _read(run_dir, frame, name):
    path = os.path.join(run_dir, frame["folder"], name)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_EMBEDDED + 1)
    except OSError:
        return None
    if len(text) > MAX_EMBEDDED:
        text = text[:MAX_EMBEDDED] + "\n... (cut; see the file)\n"
    return text


def _e(text):
    return html.escape(str(text), quote=True)


def _seconds(s):
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.2f} s"


def _time_bar(timings, scale):
    """A bar, one segment per phase; ``scale`` is the seconds the full width stands for."""
    if scale <= 0:
        return '<div class="bar empty"></div>'
    parts = []
    for phase in PHASES:
        s = timings.get(phase, 0.0)
        if s <= 0:
            continue
        width = max(100.0 * s / scale, 0.3)
        parts.append(f'<span class="seg" data-phase="{_e(phase)}" style="width:{width:.2f}%;'
                     f'background:{PHASE_COLORS[phase]}" title="{_e(phase)}: {_seconds(s)}"></span>')
    return f'<div class="bar">{"".join(parts)}</div>'


def _legend():
    return "".join(f'<span class="key"><span class="swatch" style="background:{PHASE_COLORS[p]}"></span>'
                   f'{_e(p)}</span>' for p in PHASES)


def _stack_html(stack):
    out = []
    for i, entry in enumerate(stack):
        innermost = i == len(stack) - 1
        ctx = entry.get("context") or {}
        lines = ctx.get("lines") or []
        first = ctx.get("first", entry.get("lineno", 0))
        head = (f'<div class="where">{_e(entry["filename"])}:{entry["lineno"]} in <code>{_e(entry["name"])}</code>'
                f'{" <span class=lib>[library]</span>" if entry.get("library") else ""}</div>')
        if entry.get("library") and not innermost:
            out.append(f'<div class="frame-entry library">{head}</div>')
            continue
        rows = []
        end = entry.get("end_lineno") or entry["lineno"]
        for k, text in enumerate(lines):
            n = first + k
            hit = entry["lineno"] <= n <= end
            cls = ' class="break-line"' if hit else ""
            body = _e(text)
            if hit and n == entry["lineno"] and entry.get("colno") is not None and n == end:
                a, b = entry["colno"], entry.get("end_colno") or len(text)
                body = f"{_e(text[:a])}<mark>{_e(text[a:b])}</mark>{_e(text[b:])}"
            rows.append(f'<tr{cls}><td class="ln">{n}</td><td><pre>{body}</pre></td></tr>')
        src = f'<table class="src">{"".join(rows)}</table>' if rows else \
            f'<pre class="src">{_e(entry.get("line", ""))}</pre>'
        out.append(f'<div class="frame-entry">{head}{src}</div>')
    return "".join(out)


def _op_table(op_counts):
    rows = "".join(f"<tr><td><code>{_e(op)}</code></td><td class=num>{n}</td></tr>"
                   for op, n in sorted(op_counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f'<table class="ops"><tr><th>op</th><th>count</th></tr>{rows}</table>'


def _link(rel_prefix, frame, name):
    return f'<a href="{_e(rel_prefix + frame["folder"] + "/" + name)}">{_e(name)}</a>'


def _frame_details(run_dir, frame, rel_prefix, open_it):
    parts = []
    outcome = frame.get("outcome", "?")
    if frame.get("recompile_reason"):
        parts.append(f'<p class="recompile">Recompiled because: <code>{_e(frame["recompile_reason"])}</code></p>')
    brk = frame.get("break")
    if brk:
        label = "Runs eagerly because" if outcome == "eager" else (
            "Failed" if outcome == "error" else "Graph break")
        parts.append(f'<div class="break"><p><b>{label}:</b> {_e(brk["reason"])}</p>'
                     + (f'<p class="hint">Hint: {_e(brk["hint"])}</p>' if brk.get("hint") else "")
                     + _stack_html(brk.get("stack") or []) + "</div>")
    for g in frame.get("graphs", []):
        code = _read(run_dir, frame, g["file"]) or ""
        parts.append(
            f'<div class="graph"><h4>Graph {g["number"]}: <span class="graph-ops" data-ops="{g["ops"]}">'
            f'{g["ops"]} ops</span>, backend <code>{_e(g.get("backend"))}</code>'
            + (f', compiled in {_seconds(g["backend_seconds"])}' if g.get("backend_seconds") is not None else "")
            + f'</h4><p>inputs: {_e(", ".join(g.get("inputs", [])))}</p>'
            + _op_table(g.get("op_counts", {}))
            + f'<details><summary>graph code ({_link(rel_prefix, frame, g["file"])}, '
              f'{_link(rel_prefix, frame, g["table"])})</summary><pre class="code">{_e(code)}</pre></details></div>')
    guards = frame.get("guards", [])
    if guards:
        parts.append(f'<details><summary>{len(guards)} guards</summary><ul class="guards">'
                     + "".join(f"<li><code>{_e(g)}</code></li>" for g in guards) + "</ul></details>")
    for name, title in (("transformed_function.py", "transformed function"),
                        ("guard_function.py", "guard function"), ("original_bytecode.txt", "original bytecode"),
                        ("source.txt", "source")):
        if name in frame.get("files", {}):
            parts.append(f'<details><summary>{title}</summary><pre class="code">'
                         f'{_e(_read(run_dir, frame, name) or "")}</pre></details>')
    for gen in frame.get("generated", []):
        parts.append(f'<details><summary>{_e(gen["kind"])} <code>{_e(gen["name"])}</code></summary>'
                     f'<pre class="code">{_e(_read(run_dir, frame, gen["file"]) or "")}</pre></details>')
    for out in frame.get("backend_output", []):
        parts.append(f'<details><summary>backend output: {_e(out["kind"].replace("_", " "))}</summary>'
                     f'<pre class="code">{_e(_read(run_dir, frame, out["file"]) or "")}</pre></details>')
    files = " ".join(_link(rel_prefix, frame, n) for n in frame.get("files", {}))
    parts.append(f'<p class="files">files: {files}</p>')
    timing_rows = "".join(f"<tr><td>{_e(p)}</td><td class=num>{_seconds(frame['timings'].get(p, 0.0))}</td></tr>"
                          for p in PHASES if p in frame.get("timings", {}))
    parts.append(f'<table class="timings">{timing_rows}</table>')
    title = (f'#{frame["number"]} <code>{_e(frame["name"])}</code> '
             f'<span class="outcome {_e(outcome.replace(" ", "-"))}">{_e(outcome)}</span>'
             f' <span class="loc">{_e(frame["filename"])}:{frame["firstlineno"]}</span>')
    return (f'<details class="frame" id="frame-{frame["number"]}"{" open" if open_it else ""}>'
            f'<summary>{title}</summary>{"".join(parts)}</details>')


def render(run_dir, output_path=None):
    """The report page for ``run_dir``, as HTML text. Links to files are made relative to
    ``output_path``'s folder (default: the run folder)."""
    index = load_index(run_dir)
    frames = index.get("frames", [])
    out_dir = os.path.dirname(os.path.abspath(output_path)) if output_path else os.path.abspath(run_dir)
    rel = os.path.relpath(os.path.abspath(run_dir), out_dir)
    rel_prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"

    graphs = [g for f in frames for g in f.get("graphs", [])]
    breaks = [f for f in frames if f.get("break") and f.get("outcome") == "graph break"]
    eager = [f for f in frames if f.get("outcome") == "eager"]
    errors = [f for f in frames if f.get("outcome") == "error"]
    recompiles = [f for f in frames if f.get("recompile_reason")]
    gave_up = index.get("recompiles_given_up", [])
    totals = {p: sum(f.get("timings", {}).get(p, 0.0) for f in frames) for p in PHASES}
    total_time = sum(totals.values())
    slowest = max((sum(f.get("timings", {}).values()) for f in frames), default=0.0)

    cards = [("frames", len(frames)), ("graphs", len(graphs)), ("ops", sum(g["ops"] for g in graphs)),
             ("graph breaks", len(breaks)), ("eager frames", len(eager)),
             ("recompiles", len(recompiles) + len(gave_up)), ("compile time", _seconds(total_time))]
    summary = "".join(f'<div class="card" id="count-{_e(k.replace(" ", "-"))}"><div class="n">{v}</div>'
                      f'<div class="k">{_e(k)}</div></div>' for k, v in cards)

    phase_rows = "".join(f'<tr><td><span class="swatch" style="background:{PHASE_COLORS[p]}"></span>{_e(p)}</td>'
                         f'<td class=num>{_seconds(totals[p])}</td>'
                         f'<td class=num>{(100 * totals[p] / total_time if total_time else 0):.0f}%</td></tr>'
                         for p in PHASES)

    frame_rows = []
    for f in frames:
        ops = sum(g["ops"] for g in f.get("graphs", []))
        seconds = sum(f.get("timings", {}).values())
        frame_rows.append(
            f'<tr class="frame-row" data-outcome="{_e(f.get("outcome"))}">'
            f'<td class=num><a href="#frame-{f["number"]}">{f["number"]}</a></td>'
            f'<td><code>{_e(f["name"])}</code>{" <span class=resume>(resume of " + _e(f["resume_of"]) + ")</span>" if f.get("resume_of") else ""}</td>'
            f'<td class="loc">{_e(os.path.basename(f["filename"]))}:{f["firstlineno"]}</td>'
            f'<td><span class="outcome {_e(f.get("outcome", "").replace(" ", "-"))}">{_e(f.get("outcome"))}</span></td>'
            f'<td class=num>{len(f.get("graphs", []))}</td><td class=num>{ops}</td>'
            f'<td class=num>{len(f.get("guards", []))}</td><td class=num>{f.get("cache_entry", 1)}</td>'
            f'<td class=num>{_seconds(seconds)}</td><td class="barcell">{_time_bar(f.get("timings", {}), slowest)}</td></tr>')

    break_items = []
    for f in breaks + eager + errors:
        brk = f["break"]
        kind = {"graph break": "graph break", "eager": "runs eagerly", "error": "error"}[f["outcome"]]
        break_items.append(
            f'<div class="break-item"><h3><a href="#frame-{f["number"]}">#{f["number"]}</a> '
            f'<code>{_e(f["name"])}</code>: {_e(kind)}</h3><p class="reason">{_e(brk["reason"])}</p>'
            + (f'<p class="hint">Hint: {_e(brk["hint"])}</p>' if brk.get("hint") else "")
            + _stack_html(brk.get("stack") or []) + "</div>")

    recompile_rows = "".join(
        f'<tr><td><a href="#frame-{f["number"]}">#{f["number"]}</a></td><td><code>{_e(f["name"])}</code></td>'
        f'<td class=num>{f.get("cache_entry")}</td><td><code>{_e(f["recompile_reason"])}</code></td><td>recompiled</td></tr>'
        for f in recompiles)
    recompile_rows += "".join(
        f'<tr><td></td><td><code>{_e(r["name"])}</code></td><td></td><td><code>{_e(r["reason"])}</code></td>'
        f'<td>cache limit reached: runs eagerly</td></tr>' for r in gave_up)

    by_code = {}
    for f in frames:
        by_code.setdefault(f.get("code_key", f["name"]), []).append(f)
    cache_rows = []
    for key, group in by_code.items():
        entries = ", ".join(
            f'<a href="#frame-{f["number"]}">#{f["number"]}</a> ({_e(f.get("outcome"))}, '
            f'{len(f.get("guards", []))} guards)' for f in group)
        name = group[0].get("resume_of") and f'{group[0]["name"]}' or group[0]["name"]
        cache_rows.append(f'<tr><td><code>{_e(name)}</code></td><td class="loc">{_e(os.path.basename(group[0]["filename"]))}'
                          f':{group[0]["firstlineno"]}</td><td class=num>{len(group)}</td><td>{entries}</td></tr>')

    details = "".join(_frame_details(run_dir, f, rel_prefix, len(frames) <= 3) for f in frames)
    versions = index.get("versions", {})
    meta = (f'run <code>{_e(index.get("run"))}</code>, started {_e(index.get("started"))}, pid {index.get("pid")}; '
            f'<code>{_e(" ".join(index.get("argv", [])))}</code>; '
            + ", ".join(f"{_e(k)} {_e(v)}" for k, v in versions.items()))

    return PAGE.format(
        title=_e(f"bytegraph report: {index.get('run')}"), meta=meta, summary=summary, legend=_legend(),
        total_bar=_time_bar(totals, total_time), phase_rows=phase_rows, frame_rows="".join(frame_rows),
        breaks="".join(break_items) or "<p>No graph breaks.</p>",
        recompiles=(f'<table class="list"><tr><th>frame</th><th>function</th><th>cache entry</th>'
                    f'<th>failing guard</th><th></th></tr>{recompile_rows}</table>' if recompile_rows
                    else "<p>No recompiles.</p>"),
        cache=("<table class=list><tr><th>code object</th><th>where</th><th>entries</th><th>compiles</th></tr>"
               + "".join(cache_rows) + "</table>"),
        details=details, css=CSS, script=SCRIPT, data_frames=len(frames))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bytegraph.report",
                                     description="Write one static HTML page about a bytegraph debug directory.")
    parser.add_argument("debug_dir", help="the BYTEGRAPH_DEBUG_DIR directory, or one run folder in it")
    parser.add_argument("-o", "--output", help="the page to write (default: report.html in the run folder)")
    parser.add_argument("--run", help="which run_* folder to show (default: the newest)")
    args = parser.parse_args(argv)
    run_dir = find_run(args.debug_dir, args.run)
    output = args.output or os.path.join(run_dir, "report.html")
    page = render(run_dir, output)
    with open(output, "w", encoding="utf-8") as f:
        f.write(page)
    print(f"bytegraph.report: wrote {output} ({len(load_index(run_dir).get('frames', []))} frames from {run_dir})")
    return 0


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2433;background:#f6f7f9}
header{background:#1d2433;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header .meta{color:#c5cad6;font-size:12px;margin-top:4px}header code{color:#fff}
main{padding:12px 24px 40px;max-width:1400px}
section{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:12px 16px;margin:14px 0}
h2{font-size:16px;margin:0 0 10px}h3{font-size:14px;margin:8px 0 4px}h4{margin:8px 0 4px;font-size:13px}
.cards{display:flex;flex-wrap:wrap;gap:10px}.card{border:1px solid #dde1e8;border-radius:6px;padding:8px 14px;min-width:90px}
.card .n{font-size:22px;font-weight:600}.card .k{color:#5b6475;font-size:12px}
.bar{display:flex;height:14px;background:#eef0f4;border-radius:3px;overflow:hidden;min-width:120px}
.bar .seg{display:block;height:100%}.barcell{width:28%}
.key{margin-right:14px;font-size:12px}.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
table{border-collapse:collapse}td,th{padding:3px 8px;text-align:left;vertical-align:top}
table.list td,table.list th,#frames-table td,#frames-table th{border-bottom:1px solid #eef0f4}
.num{text-align:right;font-variant-numeric:tabular-nums}.loc{color:#5b6475;font-size:12px}
.outcome{font-size:11px;padding:1px 6px;border-radius:8px;background:#e3e7ee;white-space:nowrap}
.outcome.graph{background:#d7f0dd}.outcome.graph-break{background:#fde8c8}.outcome.eager{background:#f8d3d3}
.outcome.error{background:#e15759;color:#fff}.resume{color:#5b6475;font-size:12px}
.break-item{border-left:3px solid #f28e2b;padding:2px 10px;margin:10px 0}.reason{font-weight:600}
.hint{color:#5b6475}.where{font-size:12px;color:#5b6475;margin-top:6px}.lib{color:#8a92a3}
table.src{background:#fafbfc;border:1px solid #eef0f4;width:100%;font:12px/1.4 ui-monospace,Menlo,monospace}
table.src pre{margin:0;white-space:pre-wrap}table.src td.ln{color:#8a92a3;text-align:right;width:40px;user-select:none}
tr.break-line{background:#fff3bf}tr.break-line mark{background:#ffd43b}
pre.code{background:#fafbfc;border:1px solid #eef0f4;padding:8px;overflow:auto;max-height:480px;font-size:12px}
details{margin:4px 0}details.frame{border:1px solid #dde1e8;border-radius:6px;padding:6px 10px;margin:8px 0;background:#fff}
details.frame>summary{cursor:pointer;font-weight:600}.recompile code{background:#fde8c8}
ul.guards{margin:4px 0;padding-left:20px;font-size:12px}.files{font-size:12px}
#filter{padding:4px 8px;width:260px;margin-bottom:8px}.hidden{display:none}
#script-errors{color:#b00020;font-weight:600}
"""

SCRIPT = """
(function(){
  var errors=[];
  window.addEventListener('error',function(e){errors.push(String(e.message));
    var box=document.getElementById('script-errors');if(box){box.textContent='Script errors: '+errors.join('; ');}
    document.body.setAttribute('data-script-errors',String(errors.length));});
  function ready(){
    var filter=document.getElementById('filter');
    filter.addEventListener('input',function(){
      var q=filter.value.toLowerCase();
      document.querySelectorAll('#frames-table tr.frame-row').forEach(function(row){
        row.classList.toggle('hidden',q!==''&&row.textContent.toLowerCase().indexOf(q)<0);});
    });
    function setAll(open){document.querySelectorAll('details.frame').forEach(function(d){d.open=open;});}
    document.getElementById('expand-all').addEventListener('click',function(){setAll(true);});
    document.getElementById('collapse-all').addEventListener('click',function(){setAll(false);});
    document.querySelectorAll('a[href^="#frame-"]').forEach(function(a){
      a.addEventListener('click',function(){var d=document.getElementById(a.getAttribute('href').slice(1));
        if(d){d.open=true;}});});
    var shown=document.querySelectorAll('#frames-table tr.frame-row').length;
    document.getElementById('frames-shown').textContent=String(shown);
    document.body.setAttribute('data-ready','1');
  }
  if(document.readyState==='loading'){document.addEventListener('DOMContentLoaded',ready);}else{ready();}
})();
"""

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>{css}</style></head>
<body data-frames="{data_frames}">
<header><h1>bytegraph compile report</h1><div class="meta">{meta}</div></header>
<main>
<div id="script-errors"></div>
<section id="summary"><h2>Summary</h2><div class="cards">{summary}</div></section>
<section id="time"><h2>Compile time per phase</h2>{total_bar}<p>{legend}</p>
<table class="list">{phase_rows}</table></section>
<section id="frames"><h2>Frames compiled (<span id="frames-shown"></span>)</h2>
<input id="filter" type="search" placeholder="filter frames (name, file, outcome)">
<table id="frames-table"><tr><th>#</th><th>function</th><th>where</th><th>outcome</th><th>graphs</th><th>ops</th>
<th>guards</th><th>cache entry</th><th>time</th><th>phases</th></tr>{frame_rows}</table></section>
<section id="breaks"><h2>Graph breaks and eager frames</h2>{breaks}</section>
<section id="recompiles"><h2>Recompiles</h2>{recompiles}</section>
<section id="cache"><h2>Cache entries per code object</h2>{cache}</section>
<section id="details"><h2>Frame details <button id="expand-all" type="button">expand all</button>
<button id="collapse-all" type="button">collapse all</button></h2>{details}</section>
</main>
<script>{script}</script>
</body></html>
"""


if __name__ == "__main__":
    sys.exit(main())
