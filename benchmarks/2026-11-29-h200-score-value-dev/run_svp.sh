set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/platformdirs*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv,noheader
timeout 165 python3 scratch/ab_svp.py > $OUT/ab_svp.txt 2>&1
echo "rc=$?"; tail -9 $OUT/ab_svp.txt
