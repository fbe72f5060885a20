"""Run scripts/bench.py with stage 2's warps / unroll set (A/B of merge variants)."""
import runpy, sys
import triton.language as tl
import mla_verify.kernel as k
k.MERGE_WARPS = int(sys.argv[1])
k.MERGE_UNROLL = tl.constexpr(int(sys.argv[2]))
sys.argv = ["scripts/bench.py"] + sys.argv[3:]
runpy.run_path("scripts/bench.py", run_name="__main__")
