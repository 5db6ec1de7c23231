# usage: row.sh ROWWORDS NAME
source gpu_runs/pre.sh
python bench/train_step.py --rows "$1" --compilers bytegraph,torch.compile --processes 3 --iters 15 --warmup 3 --slow-host-too --json $OUT/$2.json 2>&1 | grep -v "^\s*$" | tail -30
