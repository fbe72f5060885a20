import torch
from mla_verify import kernel, lookup
from mla_verify.testing import make_batch, make_pool
from mla_verify.timing import graph_time_us
pool = make_pool(5 << 20, torch.bfloat16, "cuda")
for name, h, l, lens in [("H128L4B64C2048", 128, 4, [2048] * 64), ("H16L4B64Rlong", 16, 4, [65536] + [512] * 63),
                         ("H64L4B32C16384", 64, 4, [16384] * 32), ("H8L2B8C2048", 8, 2, [2048] * 8)]:
    bs = [make_batch(h, l, lens, device="cuda", pool=pool, seed=i) for i in range(2)]
    outs = [b.new_output() for b in bs]
    cfg = lookup.block_config(h, l, len(lens), "bf16")
    row = []
    for w in (4, 8, 4, 8):
        kernel.MERGE_WARPS = w
        row.append(graph_time_us([lambda b=b, o=o: b.run(o, cfg) for b, o in zip(bs, outs)]))
    print(f"{name:16s} merge 4 warps {row[0]:7.1f} {row[2]:7.1f} | 8 warps {row[1]:7.1f} {row[3]:7.1f}", flush=True)
