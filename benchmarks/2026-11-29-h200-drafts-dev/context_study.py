"""Does the best config depend on the context? Candidates timed at the tuner's 8K and at 64K."""
import torch
from mla_verify import VerifyConfig, lookup
from mla_verify.config import hopper_config
from mla_verify.testing import make_batch, make_pool
from mla_verify.timing import graph_time_us

pool = make_pool(5 << 20, torch.bfloat16, "cuda")
triton_h8 = VerifyConfig(BLOCK_H=8, BLOCK_N=64, NUM_KV_SPLITS=5, num_warps=4, num_stages=2)
cases = [(8, 2, 64, [lookup.block_config(8, 2, 64, "bf16"), triton_h8, hopper_config(8, 2, 64).with_splits(5)]),
         (128, 4, 1, [lookup.block_config(128, 4, 1, "bf16")] + [hopper_config(128, 4, 1).with_splits(s) for s in (16, 32)])]
print(f"{'shape':14s} {'ctx':>6s} {'us':>8s}  config")
for h, l, bs, cfgs in cases:
    for ctx in (8192, 65536):
        lens = [ctx] * bs
        n_rot = max(1, min(4, (5 << 20) // sum(lens) // 2))
        batches = [make_batch(h, l, lens, device="cuda", pool=pool, seed=i) for i in range(n_rot)]
        outs = [b.new_output() for b in batches]
        for cfg in cfgs:
            us = graph_time_us([lambda b=b, o=o, c=cfg: b.run(o, c) for b, o in zip(batches, outs)])
            print(f"H{h}L{l}B{bs:<8d} {ctx:6d} {us:8.1f}  {cfg.to_dict()}", flush=True)
