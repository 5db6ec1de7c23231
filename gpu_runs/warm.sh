source gpu_runs/pre.sh
python bench/train_step.py --warm-start --rows foreach --compilers bytegraph --iters 10 --warmup 2 --json $OUT/warm.json 2>&1 | grep -v "^\s*$" | tail -30
