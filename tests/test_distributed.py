"""DDP, FSDP2 and collectives on a real 2-process gloo group (CPU), compared with eager.

One pair of worker processes (tests/dist_checks.py) is started for the whole module; they join
one process group through a file store (no port to choose) and run every check in turn; each
test below asserts on its check's result. The workers import the bytegraph this test imports.
"""
import json
import os
import subprocess
import sys

import pytest
import torch.distributed as dist

import bytegraph

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 2
TIMEOUT_S = 300

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    init_file = tmp / "store"
    root = os.path.dirname(os.path.dirname(os.path.abspath(bytegraph.__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    procs, outs, logs = [], [], []
    for rank in range(WORLD):
        out = tmp / f"rank{rank}.json"
        log = open(tmp / f"rank{rank}.log", "w")
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "dist_checks.py"), str(rank),
                                       str(WORLD), str(init_file), str(out)],
                                      stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(tmp)))
        outs.append(out)
        logs.append(log)
    try:
        for p in procs:
            p.wait(timeout=TIMEOUT_S)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for log in logs:
            log.close()
    per_rank = []
    for rank, out in enumerate(outs):
        if not out.exists():
            text = (tmp / f"rank{rank}.log").read_text()[-4000:]
            pytest.fail(f"rank {rank} wrote no results (exit code {procs[rank].returncode}):\n{text}")
        per_rank.append(json.loads(out.read_text()))
    return per_rank


def _check(results, name):
    details = []
    for rank, per_rank in enumerate(results):
        assert name in per_rank, f"rank {rank} did not run {name}"
        r = per_rank[name]
        assert r["ok"], f"rank {rank}: {name} failed:\n{r['error']}"
        details.append(r["detail"])
    return details


def test_ddp_split_matches_eager(results):
    for d in _check(results, "ddp_split_matches_eager"):
        assert d["pieces"] >= 3 and d["graphs"] == d["pieces"]


def test_ddp_optimize_off_gives_one_graph(results):
    for d in _check(results, "ddp_optimize_off_one_graph"):
        assert d["graphs"] == 1


def test_ddp_around_compiled_module(results):
    _check(results, "ddp_around_compiled_module")


def test_ddp_dynamic_batch(results):
    _check(results, "ddp_dynamic_batch")


def test_ddp_no_sync(results):
    _check(results, "ddp_no_sync")


def test_ddp_find_unused_parameters(results):
    _check(results, "ddp_find_unused_parameters")


def test_ddp_static_graph(results):
    _check(results, "ddp_static_graph")


def test_ddp_buckets_overlap_backward(results):
    for d in _check(results, "ddp_overlap"):
        assert d["buckets_started_before_first_layer_grad"][-1] >= 1


def test_ddp_explain_shows_split(results):
    _check(results, "ddp_explain_shows_split")


def test_ddp_called_inside_compiled_function(results):
    _check(results, "ddp_called_inside_compiled_function")


def test_functional_collectives_in_graph(results):
    _check(results, "functional_collectives_in_graph")


def test_inplace_collectives_rewritten(results):
    _check(results, "inplace_collectives_rewritten")


def test_async_collective_breaks(results):
    _check(results, "async_collective_breaks")


def test_rank_is_a_guarded_constant(results):
    _check(results, "rank_is_a_guarded_constant")


def test_fsdp2_shard_then_compile(results):
    _check(results, "fsdp2_shard_then_compile")


def test_fsdp2_compile_then_shard(results):
    _check(results, "fsdp2_compile_then_shard")
