set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
which ncu || ls /opt/nvidia/nsight-compute/*/ncu
NCU=$(which ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for v in v4 v5b; do
  arg=""; [ $v = v5b ] && arg=scratch/kernel_sm90_v5b.py
  timeout 200 $NCU --clock-control none --kernel-name regex:_prefix_kernel_sm90 --launch-skip 2 --launch-count 1 \
    --set full --import-source no -o $OUT/$v python3 scratch/ncu_one.py $arg > $OUT/ncu_$v.log 2>&1
  tail -3 $OUT/ncu_$v.log
  $NCU --import $OUT/$v.ncu-rep --page details --csv > $OUT/${v}_details.csv 2>&1
  $NCU --import $OUT/$v.ncu-rep --page raw --csv > $OUT/${v}_raw.csv 2>&1
  grep -E '"(Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|Executed Ipc Active)"' $OUT/${v}_details.csv | cut -d, -f13-16 | head -12
done
ls -la $OUT
