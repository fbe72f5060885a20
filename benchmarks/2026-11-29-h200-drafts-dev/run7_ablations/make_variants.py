"""Ablations of the Hopper kernel's main loop, for timing only (outputs are wrong):
each variant removes one piece of work so its time shows what that piece costs."""
import pathlib, re

src = pathlib.Path("mla_verify/kernel_sm90.py").read_text()
out = pathlib.Path("scratch/ablate")

def once(s, old, new):
    assert old in s, old
    return s.replace(old, new, 1)

variants = {"base": src}
loop_softmax = "            p, m_i, l_elem, acc = _softmax_step(qk, m_i, l_elem, acc, o_rows)\n            acc = _add_pv(p, p_smem, kv_nope, acc)\n            mbarrier.arrive(empty.index(stage), count=1)"
variants["no_softmax"] = once(src, loop_softmax, "            p = qk\n            acc = _add_pv(p, p_smem, kv_nope, acc)\n            mbarrier.arrive(empty.index(stage), count=1)")
variants["no_qk_mma"] = once(src, "            qk = _scores(q_nope, q_rope, kv_nope, kv_rope_ring.index(stage), zero_s)\n            visible", "            fence_async_shared()\n            qk = zero_s\n            visible")
variants["no_pv_mma"] = once(src, "        acc = warpgroup_mma(p_smem, v, acc)\n", "")
variants["no_2nd_barrier"] = once(src, "        acc = warpgroup_mma(p_smem, v, acc)\n        # Every consumer warp is done with the stage (and with P).\n        _warps_barrier()\n", "        acc = warpgroup_mma(p_smem, v, acc)\n")
m = re.search(r"            _gather_tile\(\n                kv_nope_ring\.index\(stage\),\n                kv_rope_ring\.index\(stage\),\n                K_BUF,.*?\n            \)\n", src, re.S)
variants["no_prefix_loads"] = src[: m.start()] + src[m.end():]
for name, text in variants.items():
    (out / f"v_{name}.py").write_text(text)
print(list(variants))

# One wait for both score products instead of one each.
v = once(src, "        warpgroup_mma,\n    )", "        warpgroup_mma,\n        warpgroup_mma_wait,\n    )")
v = once(v, "        qk = warpgroup_mma(q_nope, kv_nope.permute((1, 0)), zero_s, use_acc=False)\n        return warpgroup_mma(q_rope, kv_rope.permute((1, 0)), qk)",
         "        qk = warpgroup_mma(q_nope, kv_nope.permute((1, 0)), zero_s, use_acc=False, is_async=True)\n        qk = warpgroup_mma(q_rope, kv_rope.permute((1, 0)), qk, is_async=True)\n        return warpgroup_mma_wait(0, deps=[qk])")
(out / "v_async_scores.py").write_text(v)
v = variants["no_softmax"]
v = once(v, "            qk = _scores(q_nope, q_rope, kv_nope, kv_rope_ring.index(stage), zero_s)\n            visible", "            fence_async_shared()\n            qk = zero_s\n            visible")
v = once(v, "        acc = warpgroup_mma(p_smem, v, acc)\n", "")
(out / "v_no_compute.py").write_text(v)
