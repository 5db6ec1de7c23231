"""HF architectures: bytegraph vs torch.compile, per model (graphs, breaks, ops, capture ms).

    OMP_NUM_THREADS=1 python bench/hf_models.py                 # all models, table on stdout
    python bench/hf_models.py --only llama,bert --no-dynamo     # some models, bytegraph only
    python bench/hf_models.py --markdown docs/hf-models.md      # rewrite the table in that page
    python bench/hf_models.py --generate                        # also model.generate() on a few decoders

Each model of ``bytegraph.demo.hf_models.ZOO`` and ``BREAKING`` (tiny config, random weights) runs its
forward under ``torch.no_grad()`` in ``eval()`` mode, with an attention mask (padding in
one row) and ``use_cache=True`` where the model takes them. For each compiler:

- **graphs / ops**: graphs the backend received and their call nodes (functions,
  methods, modules; those of a subgraph a node runs, such as a vmap's body, too; not
  torch.compile's vmap batching bookkeeping, ``BOOKKEEPING``), over two calls (so a recompile
  shows);
- **ops run per call**: call nodes of the graphs that ran during the second call: how much of
  one call's work runs inside graphs (a graph recompiled for the second call counts once);
- **breaks**: graph breaks and eager frames with their reasons (bytegraph's
  ``debug.records``; torch's ``torch._dynamo.explain``);
- **capture ms**: wall time of the first call of a fresh compilation with
  ``backend="eager"``, the two compilers interleaved, the fastest of ``--repeat`` each (on a
  shared machine the minimum is the least disturbed), i.e. the front end's own work;
- **same**: both calls equal eager's output.

With ``--markdown PATH`` the table between the markers ``<!-- hf-table -->`` and
``<!-- /hf-table -->`` in PATH is replaced (the rest of the page is kept).
"""
import argparse
import contextlib
import io
import logging
import os
import re
import sys
import time
import traceback
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import bytegraph  # noqa: E402
from bytegraph.debug import records  # noqa: E402
from bytegraph.debug.counting import count_ops  # noqa: E402
from bytegraph.demo.hf_models import BREAKING, BREAKING_NAMES, NAMES, ZOO, build, inputs  # noqa: E402
from bytegraph.testing import same  # noqa: E402

bytegraph.config.persistent_cache = False   # measure compiles, not loads from an earlier run's cache


# torch.compile's inlined vmap leaves its batching machinery in the graph (nodes on no data);
# bytegraph's vmap is one node over a body. Neither is counted, so ops compare computations.
BOOKKEEPING = frozenset({"_add_batch_dim", "_remove_batch_dim", "_vmap_increment_nesting",
                         "_vmap_decrement_nesting", "lazy_load_decompositions", "_log_api_usage_once"})


class Recorder:
    """Keeps the graphs it is given; counts the ops of the graphs that run (``ran``)."""

    def __init__(self):
        self.graphs = []
        self.ran = 0

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        ops = count_ops(gm, nested=True, skip=BOOKKEEPING)
        forward = gm.forward

        def run(*args):
            self.ran += ops
            return forward(*args)
        return run


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


def _short(reason):
    reason = str(reason).splitlines()[0]
    reason = re.sub(r"\s+", " ", reason)
    return reason[:150]


def count_bytegraph(model, kw):
    """Graphs, ops, break reasons and equality with eager, over two calls."""
    bytegraph.reset()
    rec = Recorder()
    start = len(records.frames)
    compiled = bytegraph.compile(model, backend=rec)
    expected = model(**kw)
    ok = same(expected, compiled(**kw), rtol=1e-4, atol=1e-5)
    rec.ran = 0
    ok = same(expected, compiled(**kw), rtol=1e-4, atol=1e-5) and ok
    breaks = []
    for r in records.frames[start:]:
        reason = r.break_reason or r.fallback_reason
        if reason:
            breaks.append(_short(reason))
    bytegraph.reset()
    ops = sum(count_ops(g, nested=True, skip=BOOKKEEPING) for g in rec.graphs)
    return dict(graphs=len(rec.graphs), ops=ops, ran=rec.ran, breaks=breaks, same=ok)


def count_dynamo(model, kw):
    from torch import _dynamo   # the reference, only when asked for
    _dynamo.reset()
    rec = Recorder()
    compiled = torch.compile(model, backend=rec)
    expected = model(**kw)
    ok = same(expected, compiled(**kw), rtol=1e-4, atol=1e-5)
    rec.ran = 0
    ok = same(expected, compiled(**kw), rtol=1e-4, atol=1e-5) and ok
    _dynamo.reset()
    explained = _dynamo.explain(model)(**kw)
    breaks = [_short(b.reason) for b in explained.break_reasons]
    _dynamo.reset()
    ops = sum(count_ops(g, nested=True, skip=BOOKKEEPING) for g in rec.graphs)
    return dict(graphs=len(rec.graphs), ops=ops, ran=rec.ran, breaks=breaks, same=ok)


def capture_once(engine, model, kw):
    """Milliseconds of the first call of a fresh compilation with backend="eager"."""
    if engine == "bg":
        bytegraph.reset()
        compiled = bytegraph.compile(model, backend="eager")
    else:
        from torch import _dynamo
        _dynamo.reset()
        compiled = torch.compile(model, backend="eager")
    t = time.perf_counter()
    compiled(**kw)
    return (time.perf_counter() - t) * 1e3


def measure(name, args):
    model = build(name).eval()
    kw = inputs(name, use_cache=True)
    row = dict(name=name, arch=(ZOO.get(name) or BREAKING[name])[1])
    engines = [("bg", count_bytegraph)] + ([] if args.no_dynamo else [("tc", count_dynamo)])
    for key, fn in engines:
        try:
            with torch.no_grad(), _quiet():
                row[key] = fn(model, kw)
        except Exception as e:
            row[key] = dict(error=_short(f"{type(e).__name__}: {e}"))
            if args.traceback:
                traceback.print_exc()
    # Capture times interleaved (bytegraph, torch.compile, bytegraph, ...), so both see the
    # same load on a shared machine; the fastest of each is reported.
    times = {key: [] for key, _ in engines if "error" not in row[key]}
    for _ in range(args.repeat):
        for key in times:
            try:
                with torch.no_grad(), _quiet():
                    times[key].append(capture_once(key, model, kw))
            except Exception as e:
                row[key] = dict(error=_short(f"{type(e).__name__}: {e}"))
    for key, ts in times.items():
        if ts and "error" not in row[key]:
            row[key]["capture_ms"] = min(ts)
    bytegraph.reset()
    return row


GENERATE_CASES = [("gpt2", None), ("llama", None), ("llama", "static"), ("mistral", None), ("qwen2", None),
                  ("gemma2", None), ("bart", None)]


def run_generate(name, cache, engine):
    """Greedy generate() of 20 new tokens with a compiled forward: graphs made, same tokens."""
    model = build(name).eval()
    kw = inputs(name, batch=2, seq=8)
    kw.pop("decoder_input_ids", None)
    settings = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0)
    if cache:
        settings["cache_implementation"] = cache
    expected = model.generate(**kw, **settings)
    rec = Recorder()
    if engine == "bg":
        bytegraph.reset()
        model.forward = bytegraph.compile(model.forward, backend=rec)
    else:
        from torch import _dynamo   # the reference, only when asked for
        _dynamo.reset()
        model.forward = torch.compile(model.forward, backend=rec)
    t = time.perf_counter()
    out = model.generate(**kw, **settings)
    return dict(graphs=len(rec.graphs), same=bool(torch.equal(out, expected)),
                seconds=time.perf_counter() - t)


def generate_table(args):
    lines = ["| model | cache | graphs bytegraph / torch.compile | same tokens bytegraph / torch.compile |",
             "|---|---|---|---|"]
    for name, cache in GENERATE_CASES:
        if args.only and name not in ",".join(args.only).split(","):
            continue
        cells = {}
        for engine in ("bg",) + (() if args.no_dynamo else ("tc",)):
            try:
                with torch.no_grad(), _quiet():
                    cells[engine] = run_generate(name, cache, engine)
            except Exception as e:
                cells[engine] = dict(graphs="ERR", same=_short(f"{type(e).__name__}: {e}"))
        bg, tc = cells["bg"], cells.get("tc", dict(graphs="-", same="-"))
        line = (f"| {name} | {cache or 'dynamic'} | {bg['graphs']} / {tc['graphs']} | "
                f"{_yes(bg['same'])} / {_yes(tc['same'])} |")
        print(line, flush=True)
        lines.append(line)
    return "\n".join(lines)


def _yes(v):
    return {True: "yes", False: "NO"}.get(v, v) if isinstance(v, bool) else v


def _cell(res, key):
    if res is None:
        return "-"
    if "error" in res:
        return "ERR"
    v = res[key]
    return f"{v:.0f}" if isinstance(v, float) else str(v)


def table(rows):
    head = ("| model | graphs bg / tc | ops bg / tc | ops run per call bg / tc | capture ms bg / tc (ratio) | same | "
            "bytegraph breaks | torch.compile breaks |")
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        bg, tc = r.get("bg"), r.get("tc")
        ratio = ""
        if bg and tc and "error" not in bg and "error" not in tc and tc["capture_ms"]:
            ratio = f" ({bg['capture_ms'] / tc['capture_ms']:.2f}x)"
        same_cell = "yes" if bg and bg.get("same") else ("ERR: " + bg["error"] if bg and "error" in bg else "NO")
        lines.append(f"| {r['name']} (`{r['arch']}`) | {_cell(bg, 'graphs')} / {_cell(tc, 'graphs')} | "
                     f"{_cell(bg, 'ops')} / {_cell(tc, 'ops')} | {_cell(bg, 'ran')} / {_cell(tc, 'ran')} | "
                     f"{_cell(bg, 'capture_ms')} / {_cell(tc, 'capture_ms')}{ratio} | {same_cell} | "
                     f"{_breaks(bg)} | {_breaks(tc)} |")
    return "\n".join(lines)


def _breaks(res):
    if not res or "error" in res:
        return (res or {}).get("error", "-").replace("|", "\\|")
    if not res["breaks"]:
        return "none"
    counts = {}
    for b in res["breaks"]:
        counts[b] = counts.get(b, 0) + 1
    return "; ".join(f"{n}x {b}" if n > 1 else b for b, n in counts.items()).replace("|", "\\|")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", action="append", default=[], help="comma-separated model names")
    p.add_argument("--no-dynamo", action="store_true", help="bytegraph only")
    p.add_argument("--repeat", type=int, default=3, help="fresh compilations timed per model")
    p.add_argument("--markdown", help="page whose <!-- hf-table --> block is replaced")
    p.add_argument("--traceback", action="store_true")
    p.add_argument("--generate", action="store_true",
                   help="also compare model.generate() (greedy, 20 new tokens) on a few decoders")
    args = p.parse_args(argv)
    names = [n for o in args.only for n in o.split(",") if n] or list(NAMES) + list(BREAKING_NAMES)
    unknown = set(names) - set(NAMES) - set(BREAKING_NAMES)
    if unknown:
        p.error(f"unknown models {sorted(unknown)}; known: {', '.join(NAMES + BREAKING_NAMES)}")
    import transformers
    rows = []
    for name in names:
        row = measure(name, args)
        rows.append(row)
        print(table([row]).splitlines()[-1], flush=True)
    text = table(rows)
    header = (f"transformers {transformers.__version__}, torch {torch.__version__}, Python "
              f"{sys.version.split()[0]}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; "
              f"`python bench/hf_models.py{' ' + ' '.join(argv or sys.argv[1:]) if (argv or sys.argv[1:]) else ''}`")
    print()
    print(header)
    print(text)
    if args.generate:
        print()
        gen = generate_table(args)
        text += "\n\nGeneration (`model.forward` compiled, `model.generate(...)` greedy, 20 new tokens, " \
                "batch of 2 padded prompts of 8 tokens):\n\n" + gen
    if args.markdown:
        page = open(args.markdown).read()
        block = f"<!-- hf-table -->\n{header}\n\n{text}\n<!-- /hf-table -->"
        if "<!-- hf-table -->" in page:
            page = re.sub(r"<!-- hf-table -->.*?<!-- /hf-table -->", lambda m: block, page, flags=re.S)
        else:
            page = page.rstrip() + "\n\n" + block + "\n"
        with open(args.markdown, "w") as f:
            f.write(page)


if __name__ == "__main__":
    main()
