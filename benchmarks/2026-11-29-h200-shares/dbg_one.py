import sys, torch
import mla_verify.kernel as K
from mla_verify.testing import make_batch, check_close
from mla_verify.config import hopper_config
kern, vext, sms, lens, fp8 = sys.argv[1], sys.argv[2] == "view", int(sys.argv[3]), [int(x) for x in sys.argv[4].split(",")], sys.argv[5] == "fp8"
H = int(sys.argv[6]) if len(sys.argv) > 6 else 16
K.sm_count = lambda d: sms
kw = {"kv_dtype": torch.float8_e4m3fn} if fp8 else {}
b = make_batch(H, 4, lens, device="cuda", v_extend_from_k=vext, **kw)
o = b.new_output()
b.run(o, hopper_config(H, 4, len(lens), kern))
torch.cuda.synchronize()
try:
    check_close(o, b.reference()); print("OK", flush=True)
except AssertionError as e:
    print("WRONG", str(e)[:200], flush=True)
