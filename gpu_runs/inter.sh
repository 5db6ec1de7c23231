source gpu_runs/pre.sh
timeout 370 python bench/train_step.py --rows "$1" --compilers torch.compile,bytegraph --interleave --processes 1 --rounds 4 --iters 15 --warmup 3 --slow-host-too --json $OUT/$2.json > $OUT/$2.log 2>&1
tail -c 6000 $OUT/$2.log
