set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
git log --oneline -1
timeout 300 python3 scratch/ab_sv.py > $OUT/ab_sv.txt 2>&1
tail -16 $OUT/ab_sv.txt
timeout 200 python3 -m pytest -q -m gpu tests/test_kernel.py -k "hopper" -p no:cacheprovider > $OUT/gpu_hopper_tests.txt 2>&1
tail -5 $OUT/gpu_hopper_tests.txt
