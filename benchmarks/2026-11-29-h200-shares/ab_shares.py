"""New (balanced shares) vs old (units, 2b517f1) side by side. Correctness
of the new kernel first (against the float32 reference, poisoned output and
workspace, several share counts), then interleaved graph timings."""
import sys, statistics, time, faulthandler, torch
sys.path.insert(0, "scratch/oldpkg"); sys.path.insert(0, "scripts")
import mla_verify, mla_verify_old
import mla_verify.kernel as K
from mla_verify import lookup
from mla_verify.testing import make_batch, make_pool, check_close
from mla_verify.timing import graph_time_us
from mla_verify.config import hopper_config
from mla_verify.workspace import get_workspace
from bench import parse_shape, prefix_lengths

FP8 = torch.float8_e4m3fn
real_sms = K.sm_count

def poison():
    ws = get_workspace(torch.device("cuda")); ws.reserve(1 << 16)
    ws.part_o.fill_(float("nan")); ws.part_lse.fill_(float("nan"))

ok = True
cases = [(128, 4, [3000, 17, 0, 9000], {}), (16, 4, [5000, 64, 1], {}), (8, 2, [70000, 3], {}),
         (64, 8, [129, 4096], {}), (16, 4, [700, 2000, 0], {"v_extend_from_k": True}),
         (32, 2, [100, 5], {"v_scale": 1.25, "k_scale": 0.5}),
         (16, 4, [65536] + [512] * 63, {}), (8, 2, [(b * 7919) % 5000 for b in range(300)], {}),
         (128, 4, [2048] * 64, {}), (16, 4, [0, 0, 0], {}),
         (128, 4, [3000, 17, 0, 9000], {"kv_dtype": FP8, "k_scale": 0.75, "v_scale": 1.25}),
         (16, 2, [5000, 64, 1, 0], {"kv_dtype": FP8}),
         (16, 4, [3000, 1, 0, 700], {"kv_dtype": FP8, "v_extend_from_k": True}),
         (16, 4, [65536] + [512] * 63, {"kv_dtype": FP8})]
t_start = time.time()
for h, l, lens, kw in cases:
    faulthandler.dump_traceback_later(90, exit=True)
    print(f"case H{h} L{l} bs{len(lens)} {kw} at {time.time() - t_start:.0f}s", flush=True)
    b = make_batch(h, l, lens, device="cuda", pool_slots=max(sum(lens) * 2, 64), **kw)
    ref = b.reference()
    for kern in ("gluon_sm90", "gluon_sm90_sv"):
        for sms in (None, 1, 7):
            K.sm_count = real_sms if sms is None else (lambda d, s=sms: s)
            poison()
            o = b.new_output()
            b.run(o, hopper_config(h, l, len(lens), kern))
            try:
                check_close(o, ref)
            except AssertionError as e:
                ok = False
                print("FAIL", kern, h, l, lens[:6], kw, "sms", sms, str(e)[:300], flush=True)
    K.sm_count = real_sms
    faulthandler.cancel_dump_traceback_later()
print("correct:", ok, f"{time.time() - t_start:.0f}s", flush=True)
if not ok:
    sys.exit(1)

def old_run(b, o):
    return mla_verify_old.verify_mla_fwd(b.q, b.k_extend, b.v_extend, o, b.k_buffer, b.v_buffer,
        b.qo_indptr, b.kv_indptr, b.kv_indices, None, True, None, b.draft_len,
        k_scale=b.k_scale, v_scale=b.v_scale, sm_scale=b.sm_scale)

SHAPES = sys.argv[1:] or ["H128L4B32C16384", "H128L4B64C2048", "H128L4B1C65536", "H64L4B32C16384",
    "H128L2B32C16384", "H16L4B64C16384", "H16L4B32C16384", "H8L2B64C65536", "H8L2B8C2048",
    "H16L4B1C16384", "H16L4B32Rlognormal16384", "H16L4B64Rlong65536x512", "H64L4B8Rlognormal16384",
    "H128L4B32Rlognormal16384", "H128L4B32C16384-fp8", "H16L4B64C16384-fp8", "H16L4B64Rlong65536x512-fp8"]
pools = {"bf16": make_pool(6 << 20, torch.bfloat16, "cuda"), "fp8": make_pool(6 << 20, FP8, "cuda")}
print(f"{'shape':28s} {'old us':>9s} {'new us':>9s} {'old/new':>8s}  new TFLOP/s", flush=True)
ratios = []
for name in SHAPES:
    faulthandler.dump_traceback_later(120, exit=True)
    spec = parse_shape(name)
    lens = prefix_lengths(spec)
    fp8 = name.endswith("-fp8")
    pool = pools["fp8" if fp8 else "bf16"]
    n_rot = max(1, min(4, (6 << 20) // sum(lens) // 2))
    kw = {"kv_dtype": FP8} if fp8 else {}
    bs = [make_batch(spec.num_heads, spec.draft_len, lens, device="cuda", pool=pool, seed=i, **kw) for i in range(n_rot)]
    outs = [b.new_output() for b in bs]
    ref = bs[0].reference()
    o = bs[0].new_output(); bs[0].run(o); check_close(o, ref, what=name + " new")
    o = bs[0].new_output(); old_run(bs[0], o); check_close(o, ref, what=name + " old")
    runs = {"old": [lambda b=b, o=o: old_run(b, o) for b, o in zip(bs, outs)],
            "new": [lambda b=b, o=o: b.run(o) for b, o in zip(bs, outs)]}
    t = {"old": [], "new": []}
    for rnd in range(2):
        for who in (("old", "new") if rnd % 2 == 0 else ("new", "old")):
            t[who].append(graph_time_us(runs[who]))
    to, tn = min(t["old"]), min(t["new"])
    flops = 2 * spec.num_heads * spec.draft_len * sum(lens) * (576 + 512)
    ratios.append(to / tn)
    print(f"{name:28s} {to:9.1f} {tn:9.1f} {to / tn:8.3f}  {flops / tn / 1e6:6.0f}", flush=True)
g = statistics.geometric_mean(ratios)
print(f"geomean old/new {g:.3f} over {len(ratios)} shapes", flush=True)
