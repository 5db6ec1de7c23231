#!/usr/bin/env bash
# The GPU measurements the issues ask for, in parts that each fit a 10-minute run.
#
#   scripts/gpu_benchmarks.sh PART OUTDIR     PART: tests | train | train2 | depth | numpy
#
# Every training-step variant runs in a fresh process (bench/train_step.py --only-row/--only-compiler)
# and appends its result as a JSON line to OUTDIR/train.jsonl as soon as it ends, so a part cut off
# by a time limit keeps what it finished. Needs a CUDA machine; bytegraph from this checkout.
set -uo pipefail
cd "$(dirname "$0")/.."
part=$1
out=$2
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

train_rows() {   # rows... : each row for eager, torch.compile and bytegraph
    for row in "$@"; do
        for compiler in eager torch.compile bytegraph; do
            timeout 300 python3 bench/train_step.py --only-row "$row" --only-compiler "$compiler" \
                2>>"$out/train.err" | grep '^{' >>"$out/train.jsonl" \
                || echo "{\"row\": \"$row\", \"compiler\": \"$compiler\", \"error\": \"failed or timed out\"}" >>"$out/train.jsonl"
            echo "done: $row / $compiler"
        done
    done
}

case $part in
tests)
    python3 -m pytest -q -p no:cacheprovider -o addopts= tests/test_cudagraphs.py tests/test_numpy_faq.py \
        tests/test_optimizers.py tests/test_higher_order.py tests/test_depth_shared_blocks.py -x 2>&1 | tail -n 15 | tee "$out/gpu_tests.txt"
    ;;
train)
    train_rows "whole step, AdamW foreach" "model compiled, AdamW foreach" "inference batch 1, reduce-overhead"
    ;;
train2)
    train_rows "whole step, AdamW fused" "whole step + LR scheduler"
    ;;
depth)
    timeout 330 python3 bench/regional.py --device cuda 2>&1 | tee "$out/regional.txt"
    timeout 200 python3 bench/warm_start.py --device cuda --backend inductor --layers 12 --runs 1 2>&1 \
        | tee "$out/warm_start.txt"
    ;;
numpy)
    timeout 200 python3 bench/numpy_speed.py --device cuda 2>&1 | tee "$out/numpy_speed.txt"
    timeout 250 python3 bench/train_step.py --checkpoint --json "$out/checkpoint.json" 2>&1 \
        | tee "$out/checkpoint.txt"
    ;;
*)
    echo "unknown part $part" >&2
    exit 2
    ;;
esac
