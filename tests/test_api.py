"""The gate (shapes and scalars only, meta tensors too), the drop-in's
refusals, and the errors for malformed input."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest
import torch

from mla_verify import api, can_handle, set_debug, verify_mla_fwd, workspace
from mla_verify.testing import make_batch

BS, L, H = 2, 3, 4


def gate_args(
    device="meta",
    head_dims=(576, 512),
    rows=BS * L,
    separate_v=False,
    kv_dtype=torch.bfloat16,
    **over,
):
    """can_handle's arguments for a valid call, built on ``device``: ``rows``
    query rows (ragged below BS * L), V a view of K unless ``separate_v``."""
    t = lambda *shape, dtype=torch.bfloat16: torch.empty(*shape, dtype=dtype, device=device)  # noqa: E731
    qk, v = head_dims
    k_buffer = t(100, 1, qk, dtype=kv_dtype)
    args = dict(
        q_extend=t(rows, H, qk),
        k_extend=t(rows, 1, qk),
        v_extend=t(rows, 1, v),
        k_buffer=k_buffer,
        v_buffer=t(100, 1, v, dtype=kv_dtype) if separate_v else k_buffer[..., :v],
        qo_indptr=t(BS + 1, dtype=torch.int32),
        kv_indptr=t(BS + 1, dtype=torch.int32),
        kv_indices=t(50, dtype=torch.int32),
        custom_mask=None,
        is_causal=True,
        mask_indptr=None,
        max_len_extend=L,
    )
    args.update(over)
    return args


def test_gate_accepts_mla_on_meta_tensors():
    assert can_handle(**gate_args())


def _mask(device="meta", dtype=torch.bool, n=1000):
    return {
        "custom_mask": torch.empty(n, dtype=dtype, device=device),
        "mask_indptr": torch.empty(BS + 1, dtype=torch.int32, device=device),
    }


@pytest.mark.parametrize(
    "kwargs",
    [
        {"head_dims": (256, 256)},
        {"head_dims": (256, 256), "separate_v": True},
        {"head_dims": (128, 128), "separate_v": True},
        {"head_dims": (128, 128)},
        {"head_dims": (256, 256), "separate_v": True, "kv_dtype": torch.float8_e4m3fn},
        {"rows": BS * L - 2},  # ragged: fewer drafts than max_len_extend in some requests
        {"rows": BS},
        _mask(),
        _mask(dtype=torch.uint8),
        {**_mask(), "is_causal": False},  # the mask decides
        {**_mask(), "rows": BS * L - 1, "head_dims": (256, 256), "separate_v": True},
    ],
    ids=[
        "256_v_view",
        "256_v_separate",
        "128_v_separate",
        "128_v_view",
        "256_fp8",
        "ragged",
        "one_draft_each",
        "tree_bool_mask",
        "tree_uint8_mask",
        "tree_mask_not_causal",
        "tree_ragged_256",
    ],
)
def test_gate_accepts_on_meta_tensors(kwargs):
    assert can_handle(**gate_args(**kwargs))


@pytest.mark.parametrize(
    "over",
    [
        {"sinks": torch.empty(H, device="meta")},
        {"sliding_window_size": 128},
        {"logit_cap": 30.0},
        {"xai_temperature_len": 4},
        {"is_causal": False},
        {"custom_mask": torch.empty(10, dtype=torch.int32, device="meta")},
        {"max_len_extend": L - 1},  # more rows than bs * max_len_extend
        {"max_len_extend": 0},
        {"q_extend": torch.empty(BS * L, H, 192, dtype=torch.bfloat16, device="meta")},
        {"head_dims": (256, 128), "separate_v": True},
        {"k_buffer": torch.empty(100, 2, 576, dtype=torch.bfloat16, device="meta")},
        {"q_extend": torch.empty(BS * L, H, 576, dtype=torch.float32, device="meta")},
        {"k_buffer": torch.empty(100, 1, 576, dtype=torch.float16, device="meta")},
        {"q_extend": torch.empty(BS * L, 576, H, dtype=torch.bfloat16).transpose(1, 2)},
    ],
    ids=[
        "sinks",
        "sliding_window",
        "logit_cap",
        "xai_temperature",
        "non_causal_without_mask",
        "int32_custom_mask",
        "rows_past_batch_x_max_len",
        "draft_len_0",
        "q_head_dim_192",
        "qk_256_v_128",
        "two_kv_heads",
        "fp32_q",
        "fp16_kv_with_bf16_q",
        "q_last_dim_strided",
    ],
)
def test_gate_refuses(over):
    assert not can_handle(**gate_args(**over))


def test_gate_accepts_draft_len_16_and_fp8_kv():
    fp8 = torch.empty(100, 1, 576, dtype=torch.float8_e4m3fn, device="meta")
    args = gate_args(k_buffer=fp8, v_buffer=fp8[..., :512])
    assert can_handle(**args)
    q = torch.empty(BS * 16, H, 576, dtype=torch.bfloat16, device="meta")
    ke = torch.empty(BS * 16, 1, 576, dtype=torch.bfloat16, device="meta")
    ve = torch.empty(BS * 16, 1, 512, dtype=torch.bfloat16, device="meta")
    assert can_handle(**gate_args(q_extend=q, k_extend=ke, v_extend=ve, max_len_extend=16))


def test_gate_reads_no_values(monkeypatch):
    """No .item() / .tolist() / .cpu() on any argument."""
    for name in ("item", "tolist", "cpu", "numpy", "__bool__"):
        monkeypatch.setattr(
            torch.Tensor, name, lambda *a, **k: pytest.fail("gate read a value"), raising=True
        )
    assert can_handle(**gate_args(device="cpu"))


def _call(batch, out, **over):
    args = dict(
        q_extend=batch.q,
        k_extend=batch.k_extend,
        v_extend=batch.v_extend,
        o_extend=out,
        k_buffer=batch.k_buffer,
        v_buffer=batch.v_buffer,
        qo_indptr=batch.qo_indptr,
        kv_indptr=batch.kv_indptr,
        kv_indices=batch.kv_indices,
        custom_mask=batch.custom_mask,
        is_causal=True,
        mask_indptr=batch.mask_indptr,
        max_len_extend=batch.draft_len,
        skip_prefix_custom_mask=batch.skip_prefix_custom_mask,
    )
    args.update(over)
    return verify_mla_fwd(**args)


@pytest.mark.parametrize(
    "over", [{"sliding_window_size": 64}, {"window_kv_offsets": torch.zeros(BS, dtype=torch.int32)}]
)
def test_refusal_writes_nothing(device, over):
    batch = make_batch(H, L, [10, 5], device=device)
    out = batch.new_output()
    assert _call(batch, out, **over) is False
    assert bool(out.isnan().all())


def test_signature_follows_sglangs_verify_launcher():
    """Positional order past max_len_extend as SGLang's newer launcher
    passes it (extend_attention_fwd's, then max_bs)."""
    names = list(inspect.signature(verify_mla_fwd).parameters)
    start = names.index("max_len_extend") + 1
    assert names[start : names.index("config")] == [
        "k_scale",
        "v_scale",
        "sm_scale",
        "logit_cap",
        "skip_prefix_custom_mask",
        "sliding_window_size",
        "sinks",
        "window_kv_offsets",
        "xai_temperature_len",
        "max_bs",
    ]


def test_max_bs_sizes_the_workspace_once(monkeypatch):
    """max_bs= sizes the workspace for every batch up to it, on the first
    call with that value; later calls do not size it again."""
    prepared = []

    def spy(*args, **kwargs):
        prepared.append(args)
        return workspace.prepare_workspace(*args, **kwargs)

    monkeypatch.setattr(api, "prepare_workspace", spy)
    monkeypatch.setattr(api, "_reserved", set())
    batch = make_batch(H, L, [10, 5])
    for _ in range(2):
        assert _call(batch, batch.new_output(), max_bs=48) is True
    assert len(prepared) == 1
    needed = workspace.workspace_bytes(48, H, L, torch.bfloat16, "cpu")
    assert workspace.get_workspace(torch.device("cpu")).nbytes >= needed
    with pytest.raises(ValueError, match="max_bs"):
        _call(batch, batch.new_output(), max_bs=0)


@pytest.mark.parametrize(
    "over,match",
    [
        (lambda b: {"o_extend": torch.empty(BS * L, H, 576, dtype=b.q.dtype)}, "o_extend.shape"),
        (
            lambda b: {"o_extend": torch.empty(BS * L, H, 512, dtype=torch.float16)},
            "o_extend.dtype",
        ),
        (lambda b: {"kv_indices": b.kv_indices.float()}, "kv_indices.dtype"),
        (lambda b: {"kv_indptr": b.kv_indptr.to(torch.int16)}, "kv_indptr.dtype"),
        (lambda b: {"kv_indptr": b.kv_indptr[:-1]}, "kv_indptr.shape"),
        (lambda b: {"k_extend": b.k_extend[:-1]}, "k_extend.shape"),
        (lambda b: {"v_buffer": b.v_buffer[:-1]}, "v_buffer.shape"),
        (lambda b: {"kv_indices": b.kv_indices.to("meta")}, "kv_indices.device"),
        (lambda b: {"k_scale": torch.tensor(1.0)}, "k_scale"),
        (lambda b: {"sm_scale": float("nan")}, "sm_scale"),
        (lambda b: {"k_scale": -0.5}, "k_scale"),
        (lambda b: {"sm_scale": 0.0}, "sm_scale"),
        (lambda b: {"v_extend_scale": 0.0}, "v_extend_scale"),
        (lambda b: {"mask_indptr": _mask_indptr(b)}, "custom_mask"),
        (lambda b: {"custom_mask": torch.ones(100, dtype=torch.bool)}, "mask_indptr"),
        (lambda b: _tree(mask_indptr=_mask_indptr(b)[:-1]), "mask_indptr.shape"),
        (lambda b: _tree(mask_indptr=_mask_indptr(b).float()), "mask_indptr.dtype"),
        (lambda b: _tree(custom_mask=torch.ones(BS * L * L - 1, dtype=torch.bool)), "numel"),
        (lambda b: _tree(custom_mask=torch.ones(10, 10, dtype=torch.bool)), "custom_mask.dim"),
        (lambda b: _tree(custom_mask=torch.ones(100, dtype=torch.bool, device="meta")), "device"),
        (lambda b: {"page_size": 0}, "page_size"),
    ],
    ids=[
        "o_wrong_shape",
        "o_wrong_dtype",
        "float_indices",
        "int16_indptr",
        "indptr_length",
        "k_extend_rows",
        "v_buffer_slots",
        "indices_on_other_device",
        "tensor_scale",
        "nan_sm_scale",
        "negative_k_scale",
        "zero_sm_scale",
        "zero_v_extend_scale",
        "mask_indptr_without_mask",
        "mask_without_mask_indptr",
        "mask_indptr_length",
        "float_mask_indptr",
        "mask_shorter_than_any_uniform_batch",
        "mask_not_flat",
        "mask_on_other_device",
        "page_size_zero",
    ],
)
def test_malformed_input_names_the_argument(over, match):
    batch = make_batch(H, L, [10, 5])
    with pytest.raises(ValueError, match=match) as info:
        _call(batch, batch.new_output(), **over(batch))
    assert "expected" in str(info.value) and "got" in str(info.value)


def _mask_indptr(batch):
    # The right one for a batch without prefix bits: E * (P + E) a request.
    sizes = [L * (p + L) for p in batch.prefix_lens]
    return torch.tensor([0, *sizes]).cumsum(0).to(torch.int32)


def _tree(**over):
    args = {"custom_mask": torch.ones(1000, dtype=torch.bool), "mask_indptr": None}
    args.update(over)
    if args["mask_indptr"] is None:
        args["mask_indptr"] = torch.zeros(BS + 1, dtype=torch.int32)
    return args


def test_debug_mode_checks_draft_counts_and_mask_indptr():
    batch = make_batch(H, L, [10, 5], draft_counts=[2, 3], mask="tree")  # 5 rows < BS * L
    set_debug(True)
    try:
        assert _call(batch, batch.new_output()) is True
        qo = lambda *v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
        for bad, match in [
            (qo(0, L + 1, 5), "qo_indptr"),  # a count over max_len_extend
            (qo(0, 0, 5), "qo_indptr"),  # a request without drafts
            (qo(0, 3, 6), r"qo_indptr\[-1\]"),  # past q_extend's rows
        ]:
            with pytest.raises(ValueError, match=match):
                _call(batch, batch.new_output(), qo_indptr=bad)
        shifted = batch.mask_indptr + torch.tensor([0, 1, 1], dtype=torch.int32)
        with pytest.raises(ValueError, match="mask_indptr"):
            _call(batch, batch.new_output(), mask_indptr=shifted)
        with pytest.raises(ValueError, match=r"mask_indptr\[-1\]"):
            _call(batch, batch.new_output(), custom_mask=batch.custom_mask[:-1])
        # q holds BS * L rows: a uniform call, every count L.
        uniform = make_batch(H, L, [10, 5])
        with pytest.raises(ValueError, match="uniform"):
            _call(uniform, uniform.new_output(), qo_indptr=qo(0, 2, 5))
    finally:
        set_debug(False)


def test_debug_mode_checks_values():
    batch = make_batch(H, L, [10, 5])
    bad = batch.kv_indices.clone()
    bad[3] = batch.k_buffer.shape[0]  # one past the pool
    set_debug(True)
    try:
        with pytest.raises(ValueError, match="kv_indices"):
            _call(batch, batch.new_output(), kv_indices=bad)
        shuffled = batch.qo_indptr.flip(0)
        with pytest.raises(ValueError, match="qo_indptr"):
            _call(batch, batch.new_output(), qo_indptr=shuffled)
    finally:
        set_debug(False)


def test_huge_batches_keep_the_grid_within_cuda_limits():
    from mla_verify.config import VerifyConfig
    from mla_verify.plan import fit_grid
    from mla_verify.problem import MAX_BATCH_SIZE as MAX_GRID_Y

    config = VerifyConfig(BLOCK_H=16, BLOCK_N=64, NUM_KV_SPLITS=64, num_warps=8, num_stages=2)
    assert fit_grid(config, 256) == config
    fitted = fit_grid(config, 4096)
    assert fitted.NUM_KV_SPLITS == MAX_GRID_Y // 4096 and 4096 * fitted.NUM_KV_SPLITS <= MAX_GRID_Y
    assert fit_grid(config, 40000).NUM_KV_SPLITS == 1
    # The Triton kernel's launches keep two units a request (a ragged
    # batch's long request split), where the grid allows.
    one = config.with_splits(1)
    assert fit_grid(one, 32) == one
    assert fit_grid(one, 32, triton_kernel=True).NUM_KV_SPLITS == 2
    assert fit_grid(config, 32, triton_kernel=True) == config
    assert fit_grid(one, 40000, triton_kernel=True).NUM_KV_SPLITS == 1
    assert not can_handle(
        **gate_args(
            q_extend=torch.empty(70000 * L, H, 576, dtype=torch.bfloat16, device="meta"),
            k_extend=torch.empty(70000 * L, 1, 576, dtype=torch.bfloat16, device="meta"),
            v_extend=torch.empty(70000 * L, 1, 512, dtype=torch.bfloat16, device="meta"),
            qo_indptr=torch.empty(70001, dtype=torch.int32, device="meta"),
            kv_indptr=torch.empty(70001, dtype=torch.int32, device="meta"),
        )
    )


# --- devices ----------------------------------------------------------------------


def test_gate_refuses_cpu_tensors_without_the_interpreter(monkeypatch):
    """Without Triton's interpreter a CPU call cannot run: the gate says so
    up front (the call would die inside Triton with '0 active drivers')."""
    from mla_verify import kernel

    monkeypatch.setattr(kernel, "INTERPRETED", False)
    assert not can_handle(**gate_args(device="cpu"))
    assert can_handle(**gate_args(device="meta"))  # fake-tensor tracing asks the gate
    batch = make_batch(H, L, [10, 5])
    out = batch.new_output()
    assert _call(batch, out) is False
    assert bool(out.isnan().all())


def test_gate_refuses_cpu_tensors_in_a_fresh_process_without_the_interpreter():
    script = """
import os, torch
from mla_verify import can_handle
from mla_verify.testing import make_batch
b = make_batch(4, 3, [10, 5])
args = (b.q, b.k_extend, b.v_extend, b.k_buffer, b.v_buffer, b.qo_indptr, b.kv_indptr,
        b.kv_indices, None, True, None, 3)
print(can_handle(*args), b.run(b.new_output()))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


def test_call_on_meta_tensors_names_the_device():
    args = gate_args(device="meta")
    args["o_extend"] = torch.empty(BS * L, H, 512, dtype=torch.bfloat16, device="meta")
    assert can_handle(**{k: v for k, v in args.items() if k != "o_extend"})
    with pytest.raises(ValueError, match=r"q_extend.device: expected a CUDA/ROCm device.*got meta"):
        verify_mla_fwd(**args)
