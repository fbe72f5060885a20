"""One shape, one contender (ours | fi), run warm twice, then once between
cudaProfilerStart/Stop (ncu --profile-from-start off profiles that run)."""
import sys, torch
sys.path.insert(0, "scripts")
import bench
who, shape = sys.argv[1], sys.argv[2]
spec = bench.parse_shape(shape)
lens = bench.prefix_lengths(spec)
dev = torch.device("cuda")
rot, slots = bench.plan_pool(lens, spec.draft_len, l2_bytes=50 << 20, pool_min_bytes=4 << 30, max_rotations=1)
b = bench.build_batch(spec, lens, rotations=rot, slots=slots, device=dev, seed=0)
if who.startswith("ours"):
    if ":" in who:  # ours:<variant module in scratch/>
        import importlib.util, mla_verify.kernel as K
        name = who.split(":")[1]
        spec_ = importlib.util.spec_from_file_location(name, f"scratch/{name}.py")
        mod = importlib.util.module_from_spec(spec_); spec_.loader.exec_module(mod)
        K.kernel_sm90 = mod
    c = bench.kernel_contender("tuned", b, "sm90")
else:
    c = bench.FlashInfer(True, dev).contender(b)
for _ in range(2):
    c.launches[0]()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
c.launches[0]()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print("ran", who, shape, c.config_source, c.config)
