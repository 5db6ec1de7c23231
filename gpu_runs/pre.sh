export PYTHONPATH=$PWD/.whl/pydeps:$PWD; unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader; nproc; python -c "import torch,sys;print(torch.__version__, sys.version.split()[0])"
