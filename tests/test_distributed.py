"""DDP, FSDP2 and collectives on a real 2-process gloo group (CPU), compared with eager.

One pair of worker processes (tests/dist_checks.py) is started for the whole module; they join
one process group through a file store (no port to choose) and run every check in turn; each
test below asserts on its check's result. The workers import the bytegraph this test imports.
"""

import pytest
import torch.distributed as dist

from helpers import rank_details, run_ranks

WORLD = 2
TIMEOUT_S = 300

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_ranks("dist_checks.py", tmp_path_factory.mktemp("dist"), WORLD, TIMEOUT_S)


def test_ddp_split_matches_eager(results):
    for d in rank_details(results, "ddp_split_matches_eager"):
        assert d["pieces"] >= 3 and d["graphs"] == d["pieces"]


def test_ddp_optimize_off_gives_one_graph(results):
    for d in rank_details(results, "ddp_optimize_off_one_graph"):
        assert d["graphs"] == 1


def test_ddp_around_compiled_module(results):
    rank_details(results, "ddp_around_compiled_module")


def test_ddp_dynamic_batch(results):
    rank_details(results, "ddp_dynamic_batch")


def test_ddp_no_sync(results):
    rank_details(results, "ddp_no_sync")


def test_ddp_find_unused_parameters(results):
    rank_details(results, "ddp_find_unused_parameters")


def test_ddp_static_graph(results):
    rank_details(results, "ddp_static_graph")


def test_ddp_buckets_overlap_backward(results):
    for d in rank_details(results, "ddp_overlap"):
        assert d["buckets_started_before_first_layer_grad"][-1] >= 1


def test_ddp_explain_shows_split(results):
    rank_details(results, "ddp_explain_shows_split")


def test_ddp_called_inside_compiled_function(results):
    rank_details(results, "ddp_called_inside_compiled_function")


def test_functional_collectives_in_graph(results):
    rank_details(results, "functional_collectives_in_graph")


def test_inplace_collectives_rewritten(results):
    rank_details(results, "inplace_collectives_rewritten")


def test_async_collective_breaks(results):
    rank_details(results, "async_collective_breaks")


def test_rank_is_a_guarded_constant(results):
    rank_details(results, "rank_is_a_guarded_constant")


def test_fsdp2_shard_then_compile(results):
    rank_details(results, "fsdp2_shard_then_compile")


def test_fsdp2_compile_then_shard(results):
    rank_details(results, "fsdp2_compile_then_shard")
