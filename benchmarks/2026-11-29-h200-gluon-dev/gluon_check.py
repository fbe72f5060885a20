"""Device check of the sm90 Gluon stage 1: correctness, then timing vs Triton."""
import math, sys, time, json, os
import torch
from mla_verify import kernel_sm90
import mla_verify.kernel as mk
sys.path.insert(0, os.path.dirname(__file__))
from mla_verify.config import VerifyConfig, split_candidates, units_for_chunks
from mla_verify.lookup import block_config
from mla_verify.testing import make_batch, make_pool, check_close
from mla_verify.timing import graph_time_us

dev = "cuda"
out_dir = os.environ.get("OUT", "/tmp")
def gcfg(h, l, splits):
    return VerifyConfig(BLOCK_H=kernel_sm90.block_heads(h, l), BLOCK_N=64, NUM_KV_SPLITS=splits,
                        num_warps=8, num_stages=2, kernel="gluon_sm90")

fails = 0
cases = [(16, 4, [1000, 64, 1, 4097]), (128, 4, [3000, 70]), (8, 2, [5000] * 4), (64, 1, [777, 2048]),
         (128, 8, [513]), (16, 3, [1500, 33]), (40, 4, [2000]), (16, 4, [0, 300]), (32, 2, [130, 64, 65]),
         (16, 4, [65536] + [512] * 63), (128, 2, [16384] * 3)]
t0 = time.time()
for h, l, lens in (cases if os.environ.get("SKIP_CORRECT") is None else []):
    b = make_batch(h, l, lens, device=dev, seed=1)
    ref = b.reference()
    for s in (1, 2, 5, 17):
        o = b.new_output()
        b.run(o, gcfg(h, l, s))
        try:
            err = check_close(o, ref)
            print(f"ok   H{h} L{l} lens{lens[:4]}.. S{s} err {err:.2e}", flush=True)
        except AssertionError as e:
            fails += 1
            print(f"FAIL H{h} L{l} lens{lens[:4]}.. S{s}: {e}", flush=True)
print(f"correctness: {fails} failures, {time.time() - t0:.0f} s", flush=True)

pool = make_pool(5 << 20, torch.bfloat16, dev)  # 5M slots, 6 GB
shapes = [(16, 4, [16384] * 32), (64, 4, [16384] * 32), (128, 4, [16384] * 32), (8, 2, [65536] * 64),
          (16, 4, [65536] + [512] * 63), (128, 4, [65536]), (16, 4, [16384] * 64), (128, 2, [16384] * 32),
          (32, 2, [16384] * 32), (8, 2, [2048] * 8), (16, 4, [16384]), (64, 4, [4096] * 64)]
g = torch.Generator().manual_seed(0)
logn = [max(1, int(x)) for x in torch.distributions.LogNormal(math.log(16384) - 0.5, 1.0).sample((32,)).tolist()]
shapes.append((16, 4, logn))
rows = []
for h, l, lens in shapes:
    n_rot = max(1, min(8, (5 << 20) // max(1, sum(lens)) // 2, 2 if sum(lens) > 1 << 18 else 8))
    batches = [make_batch(h, l, lens, device=dev, pool=pool, seed=i) for i in range(n_rot)]
    outs = [bt.new_output() for bt in batches]
    bs = len(lens)
    tcfg = block_config(h, l, bs, "bf16")
    res = {}
    def t(cfg):
        return graph_time_us([lambda bt=bt, o=o: bt.run(o, cfg) for bt, o in zip(batches, outs)])
    res["triton_tuned"] = (t(tcfg), str(tcfg))
    from mla_verify.config import default_config
    dcfg = default_config(h, l, bs, "sm90")
    for cols, stages in ((512, 1), (128, 1), (512, 3), (128, 3)):
        mk.MERGE_COLUMNS, mk.MERGE_STAGES = cols, stages
        res[f"merge{cols}x{stages}"] = (t(dcfg), "")
    bh = kernel_sm90.block_heads(h, l)
    best = None
    for s in split_candidates(h, bs, bh, "sm90"):
        us = t(gcfg(h, l, s))
        res[f"gluon_S{s}"] = (us, "")
        if best is None or us < best[0]:
            best = (us, s)
    # correctness of the best on this shape
    o = batches[0].new_output(); batches[0].run(o, gcfg(h, l, best[1]))
    try:
        check_close(o, batches[0].reference())
    except AssertionError as e:
        print("FAIL timing-shape", h, l, e)
    name = f"H{h}L{l}B{bs}" + (f"C{lens[0]}" if len(set(lens)) == 1 else f"R{sum(lens)}")
    tt = res["triton_tuned"][0]
    flops = 2 * h * l * sum(lens) * (576 + 512)
    kvb = sum(lens) * 576 * 2
    print(f"{name:24s} S{dcfg.NUM_KV_SPLITS} " + " ".join(f"{k} {res[k][0]:7.1f}" for k in res if k.startswith("merge")) + f" | triton {tt:9.1f} us ({tcfg.BLOCK_H}/{tcfg.NUM_KV_SPLITS})  gluon best {best[0]:9.1f} us S{best[1]}  "
          f"speedup {tt / best[0]:.2f}x  gluon {flops / best[0] / 1e6:.0f} TFLOP/s {kvb / best[0] / 1e6:.2f} TB/s", flush=True)
    rows.append({"shape": name, **{k: v[0] for k, v in res.items()}})
json.dump(rows, open(os.path.join(out_dir, "gluon_check.json"), "w"), indent=1)
