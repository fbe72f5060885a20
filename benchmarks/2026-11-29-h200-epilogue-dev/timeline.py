"""Per-CTA timeline of stage 1 (globaltimer and clock64 at each CTA's start
and end, scratch/ksm90t.py: the shipped kernel plus those reads), with the
share's segments and positions; and graph times of the full call, stage 1
alone and stage 2 alone (the shipped kernels)."""
import sys, torch, numpy as np
sys.path.insert(0, "scripts"); sys.path.insert(0, "scratch")
import mla_verify
from mla_verify import kernel, kernel_sm90
import ksm90t
from mla_verify.testing import make_batch, make_pool, check_close
from mla_verify.timing import graph_time_us
from bench import parse_shape, prefix_lengths

real_prefix = kernel_sm90.launch_prefix
real_merge = kernel.launch_merge_shares
DBG = torch.full((65536 + 16 * 256 * 128,), -1, dtype=torch.int64, device="cuda")

def call(b, o):
    return mla_verify.verify_mla_fwd(b.q, b.k_extend, b.v_extend, o, b.k_buffer, b.v_buffer,
        b.qo_indptr, b.kv_indptr, b.kv_indices, None, True, None, b.draft_len,
        k_scale=b.k_scale, v_scale=b.v_scale, sm_scale=b.sm_scale)

pool = make_pool(6 << 20, torch.bfloat16, "cuda")
clock_ghz = torch.cuda.get_device_properties(0).clock_rate / 1e6 if hasattr(torch.cuda.get_device_properties(0), "clock_rate") else None
for name in sys.argv[1:]:
    spec = parse_shape(name)
    lens = prefix_lengths(spec)
    n_rot = max(1, min(4, (6 << 20) // sum(lens) // 2))
    bs = [make_batch(spec.num_heads, spec.draft_len, lens, device="cuda", pool=pool, seed=i) for i in range(n_rot)]
    outs = [b.new_output() for b in bs]
    ref = bs[0].reference()
    calls = [lambda b=b, o=o: call(b, o) for b, o in zip(bs, outs)]
    t_full = min(graph_time_us(calls) for _ in range(3))
    kernel.launch_merge_shares = lambda *a, **k: None
    t_s1 = min(graph_time_us(calls) for _ in range(3))
    kernel.launch_merge_shares = real_merge
    kernel_sm90.launch_prefix = lambda *a, **k: None
    t_s2 = min(graph_time_us(calls) for _ in range(3))
    LAUNCH = {}
    def timed_prefix(*a, **k):
        LAUNCH["ctas"] = k["ctas"]
        return ksm90t.launch_prefix(*a, **k, dbg=DBG)
    kernel_sm90.launch_prefix = timed_prefix
    outs[0].fill_(float("nan")); call(bs[0], outs[0]); torch.cuda.synchronize()
    check_close(outs[0], ref, what=f"{name} timed kernel")
    t_inst = min(graph_time_us(calls) for _ in range(3))
    rows = []
    for rep in range(3):
        DBG.fill_(-1); torch.cuda.synchronize()
        call(bs[0], outs[0]); torch.cuda.synchronize()
        full = DBG.cpu().numpy()
        d = full[:65532].reshape(-1, 6)
        slots = np.nonzero(d[:, 0] >= 0)[0]
        rows.append(d[slots])
        seg = full[65536:].reshape(16, 256, 8, 16)
    kernel_sm90.launch_prefix = real_prefix
    d = rows[-1]
    start, end, segs, pos = d[:, 0], d[:, 1], d[:, 2], d[:, 3]
    cyc = (d[:, 5] - d[:, 4]).astype(float)
    t0 = start.min()
    dur = (end - start) / 1e3
    A = np.stack([np.ones(len(d)), pos, segs], 1).astype(float)
    coef = np.linalg.lstsq(A, dur, rcond=None)[0]
    coef_c = np.linalg.lstsq(A, cyc, rcond=None)[0]
    print(f"== {name}: full {t_full:.1f} us, stage 1 alone {t_s1:.1f}, stage 2 alone {t_s2:.1f}, instrumented full {t_inst:.1f}; CTAs {len(d)}", flush=True)
    print(f"   CTA starts spread {(start.max() - t0) / 1e3:.2f} us; ends at {(end.min() - t0) / 1e3:.1f} .. {(end.max() - t0) / 1e3:.1f} us after the first start; "
          f"duration us min/med/max {dur.min():.1f}/{np.median(dur):.1f}/{dur.max():.1f}; Mcycles med {np.median(cyc) / 1e6:.3f} max {cyc.max() / 1e6:.3f}")
    print(f"   fit duration_us = {coef[0]:.2f} + {coef[1]:.3f} * positions + {coef[2]:.2f} * segments   (cycles: {coef_c[0]:.0f} + {coef_c[1]:.0f} pos + {coef_c[2]:.0f} seg)")
    print(f"   positions per CTA {pos.min()}..{pos.max()}, segments {segs.min()}..{segs.max()}")
    order = np.argsort(-dur)
    def show_segments(i):
        # CTA i of the flattened (head_block, cta) order: head block i // per, cta i % per
        hb, c = divmod(int(slots[i]), LAUNCH["ctas"])
        st = seg[hb, c]
        base = start[i]
        names = ["S:open", "S:q staged", "S:1st QK", "S:tiles", "S:drafts", "S:sums", "S:stored", "P:seg", "V:seg", "V:1st P", "V:tiles", "V:drafts", "V:sums", "V:stored", "P:1st empty", "P:drafts issued"]
        print(f"       cta {i} (head block {hb}, cta {c}): per segment, us after the CTA's start: " + ", ".join(names))
        for j in range(min(8, int(segs[i]))):
            print("         seg %d: " % j + " ".join("%7.2f" % ((v - base) / 1e3) if v >= 0 else "      -" for v in st[j]))
    for i in list(order[:4]) + [order[len(order) // 2]]:
        print(f"     cta {i:4d}: start +{(start[i] - t0) / 1e3:6.2f} dur {dur[i]:7.2f} us, {cyc[i] / 1e6:.3f} Mcyc, segments {segs[i]}, positions {pos[i]}")
    show_segments(order[0]); show_segments(order[len(order) // 2])
    import os; np.save(os.path.join(os.environ.get("OUT", "/tmp"), f"tl_{name}.npy"), d)
