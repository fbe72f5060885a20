set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
run() { r=$(timeout 20 python3 scratch/dbg_one.py "$@" 2>&1 | grep -v stale | tail -2 | tr '\n' ' '); echo "$* -> ${r:-HANG}"; }
run gluon_sm90 view 16 3000,17,0,9000 bf16
run gluon_sm90 sep 1 64,64 bf16
run gluon_sm90 view 1 64,0,64 bf16
run gluon_sm90 view 1 128,64 bf16
run gluon_sm90 view 2 128,64,64 bf16
