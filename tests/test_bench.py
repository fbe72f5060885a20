"""scripts/bench.py and its bench_*.py modules on CPU: shape specs, byte
counts, the batch every contender reads (FlashMLA's paged copy included),
the tolerance and the tidy CSV's columns. The timings themselves need a
GPU and are the benchmark's job, not a test's."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import shutil
import sys
import types
from pathlib import Path

import pytest
import torch

BENCH_PATH = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"
sys.path.insert(0, str(BENCH_PATH.parent))
import bench  # noqa: E402  (scripts/ is not a package)
import bench_batch  # noqa: E402
import bench_contenders  # noqa: E402
import bench_output  # noqa: E402
import bench_revisions  # noqa: E402
import bench_shapes  # noqa: E402
import bench_timing  # noqa: E402

SPECS = {
    "H16L4B32C16K": ("uniform", 16384, "bf16", "H16L4B32C16384"),
    "H16L4B32C16K-fp8": ("uniform", 16384, "fp8_e4m3", "H16L4B32C16384-fp8"),
    "H8L2B8Rlognormal2048-fp8": ("lognormal", 2048, "fp8_e4m3", "H8L2B8Rlognormal2048-fp8"),
    "H16L4B64Rlong64Kx512-fp8": ("long", 65536, "fp8_e4m3", "H16L4B64Rlong65536x512-fp8"),
}


@pytest.mark.parametrize("text, expected", SPECS.items(), ids=SPECS.keys())
def test_shape_spec_names_its_kv_dtype(text, expected):
    kind, ctx, kv_dtype, name = expected
    spec = bench_shapes.parse_shape(text)
    assert (spec.kind, spec.ctx, spec.kv_dtype, spec.name) == expected
    assert bench_shapes.parse_shape(spec.name) == spec  # the name parses back to the shape


@pytest.mark.parametrize("text", ["H16L4B32C16K-fp16", "H16L4B32C16K-", "H16L4B32-fp8"])
def test_bad_shape_spec_is_refused(text):
    with pytest.raises(ValueError, match="shape"):
        bench_shapes.parse_shape(text)


def test_fp8_kv_counts_one_byte_per_cache_element():
    # 1000 prefix tokens of 576 latent values: 2 bytes each in bf16, 1 in
    # fp8; q, the drafts and the output stay bf16 in both.
    lens = [600, 400]
    bf16 = bench_shapes.shape_work(16, 4, lens, kv_bytes=2)
    fp8 = bench_shapes.shape_work(16, 4, lens, kv_bytes=1)
    assert bf16.bytes - fp8.bytes == 1000 * 576
    assert bf16.flops == fp8.flops
    spec = bench_shapes.parse_shape("H16L4B2C500-fp8")
    assert spec.kv_bytes == 1 and bench_shapes.parse_shape("H16L4B2C500").kv_bytes == 2


def test_contenders_are_timed_in_rotating_rounds_and_pooled(monkeypatch):
    # Timed one after another, the contender timed first ran up to 12%
    # faster: each round starts with the next one, and every round's
    # replays count.
    calls = []

    def fake_time(contender, batch, ctx, row):
        calls.append(row["contender"])
        base = {"a": 10.0, "b": 20.0, "c": 30.0}[row["contender"]]
        return bench_timing._summarise([base + len(calls)] * 4, "cudagraph", 1)

    monkeypatch.setattr(bench, "time_contender", fake_time)
    ctx = types.SimpleNamespace(rounds=3, ceilings=bench_timing.Ceilings(None, None))
    rows = [{"contender": n, "status": None, "bytes": 1, "flops": 1} for n in "abc"]
    bench.time_interleaved([(row, object()) for row in rows], batch=None, ctx=ctx)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    a = rows[0]
    assert a["status"] == "ok" and a["replays"] == 12
    # a's rounds ran as calls 1, 6 and 8: samples 11, 16 and 18 (4 each)
    assert (a["p20_us"], a["median_us"], a["p80_us"]) == (11.0, 16.0, 18.0)


def test_two_contenders_start_as_many_rounds(monkeypatch):
    # Three rounds of two contenders had the first start two of them (and
    # lead its rival by 1-4% with the same code): they run as four.
    calls = []

    def fake_time(contender, batch, ctx, row):
        calls.append(row["contender"])
        return bench_timing._summarise([10.0] * 2, "cudagraph", 1)

    monkeypatch.setattr(bench, "time_contender", fake_time)
    ctx = types.SimpleNamespace(rounds=3, ceilings=bench_timing.Ceilings(None, None))
    rows = [{"contender": n, "status": None, "bytes": 1, "flops": 1} for n in "ab"]
    bench.time_interleaved([(row, object()) for row in rows], batch=None, ctx=ctx)
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert [row["replays"] for row in rows] == [8, 8]


@pytest.mark.parametrize(
    ("rounds", "contenders", "expected"), [(3, 2, 4), (3, 3, 3), (1, 4, 4), (5, 1, 5), (2, 0, 2)]
)
def test_balanced_rounds_round_up_to_a_multiple_of_the_contenders(rounds, contenders, expected):
    assert bench.balanced_rounds(rounds, contenders) == expected


# --- the batch every contender reads -------------------------------------------------


def small_batch(prefix_lens=(5, 0, 70), heads=2, draft_len=3, rotations=2):
    spec = bench_shapes.parse_shape(f"H{heads}L{draft_len}B{len(prefix_lens)}C1")
    per_set = sum(prefix_lens) + len(prefix_lens) * draft_len
    return bench_batch.build_batch(
        spec,
        list(prefix_lens),
        rotations=rotations,
        slots=rotations * per_set + 11,
        device=torch.device("cpu"),
        seed=3,
    )


def test_rotation_sets_share_values_on_disjoint_slots():
    batch = small_batch()
    first, second = batch.sets
    assert first.q is second.q and first.k_buffer is second.k_buffer
    assert not set(first.kv_indices.tolist()) & set(second.kv_indices.tolist())
    # v_extend: the drafts' latent, as FlashInfer reads it from the pool, in a tensor of its own
    assert torch.equal(first.v_extend, first.k_extend[..., :512])
    assert first.v_extend.data_ptr() != first.k_extend.data_ptr()
    # FlashInfer's lists: each request's prefix slots, then slots holding its drafts' K
    for r, vb in enumerate(batch.sets):
        rows = vb.k_buffer[batch.fi_kv_indices[r].long(), 0]
        start = 0
        for b, p in enumerate(batch.prefix_lens):
            prefix = vb.kv_indices[vb.kv_indptr[b] : vb.kv_indptr[b + 1]].long()
            assert torch.equal(rows[start : start + p], vb.k_buffer[prefix, 0])
            drafts = vb.k_extend[b * vb.draft_len : (b + 1) * vb.draft_len, 0]
            assert torch.equal(rows[start + p : start + p + vb.draft_len], drafts)
            start += p + vb.draft_len


@pytest.mark.parametrize("page_size", [4, 64])
@pytest.mark.parametrize("scattered", [False, True], ids=["in-order", "scattered"])
def test_flashmla_pages_hold_each_sequence_then_nan(page_size, scattered):
    vb = small_batch().sets[1]
    L = vb.draft_len
    gen = torch.Generator().manual_seed(0) if scattered else None
    kv_cache, block_table, seqlens = bench_batch.paged_kv_with_drafts(
        vb.k_buffer, vb.kv_indptr, vb.kv_indices, vb.k_extend, L, page_size=page_size, scatter=gen
    )
    assert seqlens.dtype == block_table.dtype == torch.int32
    assert seqlens.tolist() == [p + L for p in vb.prefix_lens]
    assert kv_cache.shape[1:] == (page_size, 1, 576)
    for b, n in enumerate(seqlens.tolist()):
        pages = -(-n // page_size)
        seq = kv_cache[block_table[b, :pages].long()].reshape(-1, 576)
        prefix = vb.kv_indices[vb.kv_indptr[b] : vb.kv_indptr[b + 1]].long()
        expected = torch.cat([vb.k_buffer[prefix, 0], vb.k_extend[b * L : (b + 1) * L, 0]])
        assert torch.equal(seq[:n], expected)
        assert torch.isnan(seq[n:]).all()  # the last page's tail: poisoned
        assert (block_table[b, pages:] == 0).all()
    used = block_table[block_table != 0].unique().numel()
    assert used <= kv_cache.shape[0] and kv_cache.shape[0] == sum(
        -(-n // page_size) for n in seqlens.tolist()
    )


def test_flashmla_layout_computes_the_verify_function():
    # Bottom-right causal attention over each paged sequence (FlashMLA's
    # convention, V = K's first 512 columns) equals the package's reference.
    vb = small_batch(rotations=1).sets[0]
    L, H = vb.draft_len, vb.num_heads
    kv_cache, block_table, seqlens = bench_batch.paged_kv_with_drafts(
        vb.k_buffer, vb.kv_indptr, vb.kv_indices, vb.k_extend, L, page_size=4
    )
    out = []
    for b, n in enumerate(seqlens.tolist()):
        kv = kv_cache[block_table[b, : -(-n // 4)].long()].reshape(-1, 576)[:n].float()
        q = vb.q[b * L : (b + 1) * L].float()  # [L, H, 576]
        scores = torch.einsum("lhd,td->lht", q, kv) * vb.sm_scale
        visible = torch.arange(n)[None, :] <= (n - L + torch.arange(L))[:, None]  # [L, n]
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        out.append(torch.einsum("lht,td->lhd", scores.softmax(-1), kv[:, :512]))
    torch.testing.assert_close(torch.cat(out), vb.reference(), rtol=1e-5, atol=1e-5)
    assert out[0].shape == (L, H, 512)


def test_flashmla_pages_refuse_fp8():
    vb = small_batch(rotations=1).sets[0]
    with pytest.raises(ValueError, match="bf16 or fp16"):
        bench_batch.paged_kv_with_drafts(
            vb.k_buffer.to(torch.float8_e4m3fn), vb.kv_indptr, vb.kv_indices, vb.k_extend, 3
        )


# --- contenders ---------------------------------------------------------------------------


def test_triton_contender_runs_the_portable_kernel_config(device):
    """The triton contender launches block_config(..., kernel="triton"): on
    sm90 the table's Triton winner (H16 L4 has one), not the Hopper tile."""
    import mla_verify

    spec = bench_shapes.parse_shape("H16L4B2C9")
    batch = bench_batch.build_batch(
        spec,
        bench_shapes.prefix_lengths(spec),
        rotations=1,
        slots=64,
        device=torch.device(device),
        seed=1,
    )
    contender = bench_contenders.kernel_contender("triton", batch, "sm90")
    expected, source = mla_verify.resolve_config(16, 4, 2, arch="sm90", kernel="triton")
    assert contender.config == expected and contender.config.kernel == "triton"
    assert contender.config_source == source and "(triton)" in source


def test_outputs_are_checked_with_the_package_tolerance():
    from mla_verify.testing import MAX_RELATIVE_ERROR

    ref = torch.rand(4, 2, 512) + 0.5
    assert bench_contenders.check_output(ref.bfloat16(), ref).ok
    # 0.8% off everywhere: inside the old bench's 1e-2, outside the package's 6e-3
    off = bench_contenders.check_output(ref * (1 + 0.8e-2), ref)
    assert not off.ok and off.rel_err > MAX_RELATIVE_ERROR and "relative error" in off.reason
    nan = ref.clone()
    nan[1, 1, 7] = float("nan")
    assert not bench_contenders.check_output(nan, ref).ok


# --- the tidy CSV ---------------------------------------------------------------------------


def ok_row():
    spec = bench_shapes.parse_shape("H16L4B2C500")
    ceilings = bench_timing.Ceilings(4.2e12, 780e12)
    meta = {
        "device": "NVIDIA H200",
        "torch": "2.11.0",
        "triton": "3.6.0",
        "cuda": "13.0",
        "mla_verify": "0.1.0",
        "flashinfer": "0.6.4",
        "flash_mla": "n/a",
        "git_commit": "abc1234",
        "date_utc": "2026-12-01T00:00:00+00:00",
    }
    ctx = types.SimpleNamespace(ceilings=ceilings, arch="sm90", meta=meta)
    row = bench._base_row(spec, bench_shapes.prefix_lengths(spec), ctx)
    row["contender"] = "triton"
    from mla_verify.config import hopper_config

    contender = bench_contenders.Contender(
        "triton",
        [],
        None,
        config=bench_contenders.triton_config(hopper_config(16, 4, 2, "gluon_sm90_sv")),
        config_source="sm90.json entry H16_L4_bf16, bucket 2; kernel='triton'",
    )
    bench._with_config(row, contender)
    row.update(rel_err=1.7e-3, max_abs_err=4e-4)
    bench.record_timing(
        row, bench_timing._summarise([10.0, 11.0, 12.0, 13.0, 14.0], "cudagraph", 8), ctx
    )
    return row


def test_csv_rows_carry_run_shape_config_and_rates(tmp_path):
    row = ok_row()
    path = tmp_path / "results" / "results.csv"
    bench_output.append_csv([row], path)
    bench_output.append_csv([row, row], path)  # a second run appends, no second header
    with path.open(newline="") as f:
        lines = list(csv.reader(f))
    assert tuple(lines[0]) == bench_output.CSV_FIELDS and len(lines) == 4
    written = dict(zip(lines[0], lines[1]))
    for name in ("device", "torch", "triton", "git_commit", "date_utc", "kernel", "config"):
        assert written[name], name
    assert written["kernel"] == "triton" and json.loads(written["config"])["BLOCK_H"] == 16
    assert float(written["median_us"]) == 12.0 and float(written["p20_us"]) == 10.8
    seconds = 12.0e-6
    assert float(written["bytes_per_s"]) == pytest.approx(row["bytes"] / seconds)
    assert float(written["flop_per_s"]) == pytest.approx(row["flops"] / seconds)
    assert float(written["frac_copy_bw"]) == pytest.approx(row["bytes"] / seconds / 4.2e12)
    assert float(written["frac_matmul"]) == pytest.approx(row["flops"] / seconds / 780e12)
    fracs = {"memory": float(written["frac_copy_bw"]), "compute": float(written["frac_matmul"])}
    assert float(written["frac_roofline"]) == pytest.approx(max(fracs.values()))
    assert fracs[written["bound"]] == max(fracs.values())
    assert written["status"] == "ok" and float(written["rel_err"]) == 1.7e-3


def test_csv_with_other_columns_is_refused(tmp_path):
    path = tmp_path / "old.csv"
    path.write_text("shape,contender,pct_roofline\nH8L2B8C2048,tuned,20.1\n")
    with pytest.raises(ValueError, match="columns"):
        bench_output.append_csv([ok_row()], path)
    with pytest.raises(SystemExit):  # refused before any GPU time is spent
        bench.parse_args(["--csv", str(path), "--list-shapes"])
    assert path.read_text().count("\n") == 2  # left as it was


def test_shipped_results_csv_has_the_bench_columns():
    shipped = BENCH_PATH.parents[1] / "results" / "results.csv"
    bench_output.check_csv(shipped)
    with shipped.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["git_commit"] and r["device"] for r in rows)


# --- kinds of call: tree masks, ragged drafts, head dims, paged caches ---------------------

KINDS = {
    "H16L4B32C16K-tree": ("H16L4B32C16384-tree", (576, 512), False, "tree", 0),
    "H16L4B32C16K-treefull": ("H16L4B32C16384-treefull", (576, 512), False, "treefull", 0),
    "H16L4B32C16K-ragged": ("H16L4B32C16384-ragged", (576, 512), True, "causal", 0),
    "H4L4B32C16K-d256": ("H4L4B32C16384-d256", (256, 256), False, "causal", 0),
    "H4L4B32C16K-d128-fp8": ("H4L4B32C16384-d128-fp8", (128, 128), False, "causal", 0),
    "H16L4B32C16K-page64": ("H16L4B32C16384-page64", (576, 512), False, "causal", 64),
    "H8L2B64Rlong64K-page1": ("H8L2B64Rlong65536x512-page1", (576, 512), False, "causal", 1),
    # any order in, one order out
    "h16l4b32c16k-FP8-tree-ragged-d256": (
        "H16L4B32C16384-d256-ragged-tree-fp8",
        (256, 256),
        True,
        "tree",
        0,
    ),
}


@pytest.mark.parametrize("text, expected", KINDS.items(), ids=KINDS.keys())
def test_shape_spec_suffixes_name_the_kind_of_call(text, expected):
    spec = bench_shapes.parse_shape(text)
    assert (spec.name, spec.head_dims, spec.ragged, spec.mask, spec.page_size) == expected
    assert bench_shapes.parse_shape(spec.name) == spec


BAD_KINDS = {
    "H16L4B32C16K-tree-tree": "-tree given twice",
    "H16L4B32C16K-tree-treefull": "-treefull with -tree",
    "H16L4B32C16K-d256-d128": "-d128 with -d256",
    "H16L4B32C16K-page64-page1": "-page1 with -page64",
    "H16L4B32C16K-page2": "unknown suffix '-page2'",
    "H16L4B32C16K-d512": "unknown suffix '-d512'",
    "H16L4B32C16K-causal": "unknown suffix '-causal'",
    "H16L1B32C16K-ragged": "-ragged needs L >= 2",
    "H16L4B32C16K-page64-tree": "-page64 is the paged entry point",
    "H16L4B32C16K-ragged-page1": "-page1 is the paged entry point",
    "H16L4B32C16K-d256-page16": "-page16 is the paged entry point",
    "H16L4B32C16K-page64-fp8": "paged rows are bf16",
    "H16L4B32C16K-i64-i64": "-i64 given twice",
    "H16L4B32C16K-page64-i64": "-page64 is the paged entry point",
    "H16L4B32C16K-tree-": "expected H<heads>",
}


@pytest.mark.parametrize("text, match", BAD_KINDS.items(), ids=BAD_KINDS.keys())
def test_bad_kind_suffix_is_refused(text, match):
    with pytest.raises(ValueError, match="shape") as info:
        bench_shapes.parse_shape(text)
    assert match in str(info.value)


def test_extra_set_parses_and_lists(capsys):
    assert bench.main(["--extra", "--list-shapes"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed == [bench_shapes.parse_shape(s).name for s in bench_shapes.EXTRA_SHAPES]
    specs = [bench_shapes.parse_shape(s) for s in listed]
    assert {s.mask for s in specs} == {"causal", "tree", "treefull"}
    assert any(s.ragged for s in specs)
    assert {s.head_dims for s in specs if s.num_heads in (4, 8, 16) and not s.mla} == {(256, 256)}
    assert {s.page_size for s in specs} == {0, 1, 64}
    # every tree/ragged row has its plain row in the set: its own, or a -page row's tuned
    plain = {bench_shapes.plain_name(s) for s in specs if s.plain}
    assert all(bench_shapes.plain_name(s) in plain for s in specs if s.mla)
    with pytest.raises(SystemExit):
        bench.parse_args(["--extra", "--quick"])


def test_int64_indices_are_a_kind_of_the_token_indexed_call():
    spec = bench_shapes.parse_shape("h8l2b64c64k-I64")
    assert spec.int64_indices and spec.name == "H8L2B64C65536-i64"
    assert bench_shapes.parse_shape(spec.name) == spec
    assert not spec.plain  # FlashInfer and FlashMLA take no int64 indices here
    assert bench_shapes.plain_name(spec) == "H8L2B64C65536"
    assert bench_shapes.parse_shape("H16L4B32C16K-tree-i64").name == "H16L4B32C16384-tree-i64"


def test_kinds_share_their_plain_shapes_lengths_and_draw_fixed_ragged_counts():
    for suffix in ("-tree", "-ragged", "-d256", "-i64", "-page64"):
        spec = bench_shapes.parse_shape(f"H16L4B32Rlognormal2048{suffix}")
        assert bench_shapes.prefix_lengths(spec) == bench_shapes.prefix_lengths(
            bench_shapes.parse_shape("H16L4B32Rlognormal2048")
        )
    ragged = bench_shapes.parse_shape("H16L4B32C100-ragged")
    counts = bench_shapes.draft_counts(ragged)
    assert len(counts) == 32 and set(counts) <= {1, 2, 3, 4} and len(set(counts)) > 1
    assert counts == bench_shapes.draft_counts(bench_shapes.parse_shape("H16L4B32C100-tree-ragged"))
    assert bench_shapes.draft_counts(bench_shapes.parse_shape("H16L4B32C100-tree")) == [4] * 32


# --- work counts ------------------------------------------------------------------------


def test_plain_work_is_the_mla_formula():
    lens = [600, 400]
    work = bench_shapes.shape_work(16, 4, lens)
    tokens = 8
    assert work.bytes == 2 * (1000 * 576 + tokens * 16 * (576 + 512) + tokens * (576 + 512))
    assert work.flops == 2 * 16 * 4 * 1000 * (576 + 512)
    spec = bench_shapes.parse_shape("H16L4B2C500")
    assert bench_shapes.spec_work(spec, [500, 500]) == bench_shapes.shape_work(16, 4, [500, 500])


@pytest.mark.parametrize("dims", [(256, 256), (128, 128)], ids=["d256", "d128"])
def test_head_dims_change_bytes_per_token_and_flops(dims):
    dqk, dv = dims
    lens = [600, 400]
    work = bench_shapes.shape_work(8, 4, lens, head_dims=dims)
    tokens = 8
    # K and V once (V a cache of its own), q and out of the heads, k_extend
    # and v_extend
    kv = 1000 * (dqk + dv)
    assert work.bytes == 2 * (kv + tokens * 8 * (dqk + dv) + tokens * (dqk + dv))
    assert work.flops == 2 * 8 * 4 * 1000 * (dqk + dv)
    spec = bench_shapes.parse_shape(f"H8L4B2C500-d{dqk}-fp8")
    fp8 = bench_shapes.spec_work(spec, [500, 500])
    assert bench_shapes.shape_work(8, 4, [500, 500], 2, head_dims=dims).bytes - fp8.bytes == kv


def test_ragged_work_counts_each_requests_drafts():
    lens, counts = [600, 400, 50], [1, 4, 2]
    work = bench_shapes.shape_work(16, 4, lens, draft_counts=counts)
    rows = 7
    assert work.bytes == 2 * (1050 * 576 + rows * 16 * (576 + 512) + rows * (576 + 512))
    assert work.flops == 2 * 16 * (1 * 600 + 4 * 400 + 2 * 50) * (576 + 512)
    spec = bench_shapes.parse_shape("H16L4B3C50-ragged")
    assert bench_shapes.spec_work(spec, [50] * 3) == bench_shapes.shape_work(
        16, 4, [50] * 3, draft_counts=bench_shapes.draft_counts(spec)
    )


def test_tree_work_adds_the_mask_bytes_the_kernel_reads():
    lens, counts = [600, 400], [3, 4]
    causal = bench_shapes.shape_work(16, 4, lens, draft_counts=counts)
    tree = bench_shapes.shape_work(16, 4, lens, draft_counts=counts, mask="tree")
    full = bench_shapes.shape_work(16, 4, lens, draft_counts=counts, mask="treefull")
    assert tree.bytes - causal.bytes == 3 * 3 + 4 * 4  # the draft blocks
    assert full.bytes - causal.bytes == 3 * (600 + 3) + 4 * (400 + 4)  # every row's bits
    assert causal.flops == tree.flops == full.flops


def test_paged_work_reads_the_drafts_from_the_cache():
    lens = [600, 400]
    token = bench_shapes.shape_work(16, 4, lens)
    paged = bench_shapes.shape_work(16, 4, lens, paged=True)
    # 8 drafts: 576 cache elements each instead of k_extend + v_extend (576 + 512)
    assert token.bytes - paged.bytes == 2 * 8 * 512
    assert paged.flops == token.flops


# --- each kind through the bench's own path, tiny, against the reference ---------------

# shape -> the contenders launched (each launch takes about a second in the
# interpreter): every package contender on the richest kind, ``tuned`` (and
# ``paged``) on the others; paged shapes check each rotation set's cache.
SMOKE = {
    "H2L3B3Rlognormal9-ragged-tree": ("tuned", "default", "triton", "torch_ref"),
    "H2L2B2C9-treefull": ("tuned", "torch_ref"),
    "H2L2B2C9-d256": ("tuned", "torch_ref"),
    "H2L2B2C9-d128-fp8": ("tuned",),
    "H2L2B2Rlognormal9-i64": ("tuned", "triton", "torch_ref"),
    "H2L2B2Rlong70x3-page64": ("tuned", "paged", "paged_seesaw", "paged_translated"),
    "H2L2B2C5-page1": ("paged",),
}


@pytest.mark.parametrize("text", SMOKE, ids=SMOKE.keys())
def test_each_kind_of_call_is_checked_against_the_reference(text, device):
    """build_batch and prepare_contender, as run_shape calls them: the
    contenders launched compute the reference's output; those the kind does
    not admit are skipped with a reason."""
    import mla_verify

    spec = bench_shapes.parse_shape(text)
    lens = bench_shapes.prefix_lengths(spec)
    rotations = 2 if spec.page_size else 1
    batch = bench_batch.build_batch(
        spec,
        lens,
        rotations=rotations,
        slots=rotations * (sum(lens) + spec.batch_size * spec.draft_len) + 11,
        device=torch.device(device),
        seed=5,
    )
    assert batch.q.shape[0] == sum(bench_shapes.draft_counts(spec))
    assert batch.k_buffer.shape[-1] == spec.head_dims[0]
    index_dtype = torch.int64 if spec.int64_indices else torch.int32
    assert all(vb.kv_indices.dtype == index_dtype for vb in batch.sets)
    assert (batch.sets[0].custom_mask is not None) == (spec.mask != "causal")
    assert batch.sets[0].skip_prefix_custom_mask == (spec.mask != "treefull")
    assert len(batch.paged) == (rotations if spec.page_size else 0)
    ctx = types.SimpleNamespace(
        device=torch.device(device),
        arch=mla_verify.current_arch() if device == "cuda" else "sm90",
        flashinfer=bench_contenders.FlashInfer(False, None),
        flashmla=bench_contenders.FlashMLA(False),
        sglang=bench_contenders.SGLangVerify(False),
        torch_ref_max_tokens=1 << 20,
        seed=5,
    )
    ref = batch.sets[0].reference()
    for name in bench_contenders.CONTENDERS:
        if bench_contenders.not_applicable(name, spec) is None and name not in SMOKE[text]:
            continue
        row = {}
        contender = bench.prepare_contender(name, batch, ref, ctx, row)
        if name not in SMOKE[text]:
            assert contender is None and row["status"] == "skipped" and row["reason"], name
            continue
        assert contender is not None and row["rel_err"] < 6e-3, (name, row)
        if name.startswith("paged"):  # each rotation set's cache holds that set's values
            for vb, launch in zip(batch.sets[1:], contender.launches[1:], strict=True):
                contender.out.fill_(float("nan"))
                launch()
                assert bench_contenders.check_output(contender.output(), vb.reference()).ok


def test_flashmla_reads_the_pages_the_paged_call_reads():
    spec = bench_shapes.parse_shape("H2L2B2C70-page64")
    lens = bench_shapes.prefix_lengths(spec)
    batch = bench_batch.build_batch(
        spec, lens, rotations=2, slots=2 * (sum(lens) + 4) + 3, device=torch.device("cpu"), seed=1
    )
    seen = []

    def flash_mla_with_kvcache(q, kv_cache, block_table, cache_seqlens, dv, *args, **kwargs):
        seen.append((kv_cache, block_table, cache_seqlens))
        return torch.zeros(q.shape[:3] + (dv,)), None

    flashmla = bench_contenders.FlashMLA(False)
    flashmla.module = types.SimpleNamespace(
        get_mla_metadata=lambda *args: (None, None), flash_mla_with_kvcache=flash_mla_with_kvcache
    )
    contender = flashmla.contender(batch, seed=0)
    for launch in contender.launches:
        launch()
    assert len(seen) == 2
    for (kv_cache, block_table, seqlens), paged in zip(seen, batch.paged):
        assert kv_cache is paged[0] and block_table is paged[1]
        assert torch.equal(seqlens, paged[2])


FAKE_SGLANG_VERIFY = """
from sglang.kernels.ops.attention.fp8_dot_support import dot_in_kv_dtype
from sglang.kernels.ops.attention.verify_splitkv import _AMD_LAUNCH_KWARGS

SEEN = []


def verify_shared_kv_fwd(q, k_ext, v_ext, o, *args, **kwargs):
    SEEN.append((dot_in_kv_dtype(None, 64), dict(_AMD_LAUNCH_KWARGS), len(args), sorted(kwargs)))
    o.copy_(REFERENCE)
    return True
"""


def test_sglang_kernel_is_loaded_from_its_checkout_alone(tmp_path):
    """The sglang contender reads verify_mla.py from the folder --sglang-src
    names, its two SGLang imports given their NVIDIA values, sys.modules
    left as it was; it is called as verify_mla_fwd is, less our config."""
    path = tmp_path / bench_contenders.SGLANG_VERIFY
    path.parent.mkdir(parents=True)
    path.write_text(FAKE_SGLANG_VERIFY)
    before = set(sys.modules)
    sglang = bench_contenders.SGLangVerify(True, tmp_path)
    assert sglang.available, sglang.reason
    assert not {m for m in set(sys.modules) - before if m.startswith("sglang")}
    assert sglang.version.startswith("verify_mla.py sha256 ")
    spec = bench_shapes.parse_shape("H2L2B2C9")
    lens = bench_shapes.prefix_lengths(spec)
    batch = bench_batch.build_batch(
        spec, lens, rotations=1, slots=sum(lens) + 9, device=torch.device("cpu"), seed=3
    )
    ref = batch.sets[0].reference()
    sglang.fwd.__globals__["REFERENCE"] = ref
    ctx = types.SimpleNamespace(sglang=sglang, device=torch.device("cpu"))
    row = {}
    contender = bench.prepare_contender("sglang", batch, ref, ctx, row)
    assert contender is not None and row["rel_err"] < 6e-3  # bf16 rounding of the reference
    (seen,) = sglang.fwd.__globals__["SEEN"]
    # q, k/v extend, o, then the pool, indptrs, indices, mask, causal, mask indptr, L
    assert seen[:3] == (True, {}, 9)
    assert seen[3] == ["k_scale", "skip_prefix_custom_mask", "sm_scale", "v_scale"]
    fp8 = bench_shapes.parse_shape("H2L2B2C9-fp8")
    fp8_batch = bench_batch.build_batch(
        fp8, lens, rotations=1, slots=sum(lens) + 9, device=torch.device("cpu"), seed=3
    )

    # A call its gate refuses names it (the bench skips ragged and masked rows for it).
    def verify_shared_kv_fwd(*args, **kwargs):
        return False

    refusing = types.SimpleNamespace(fwd=verify_shared_kv_fwd, version="v")
    with pytest.raises(RuntimeError, match="verify_shared_kv_fwd refused the call"):
        bench_contenders.SGLangVerify.contender(refusing, batch).launches[0]()
    row = {}
    assert bench.prepare_contender("sglang", fp8_batch, ref, ctx, row) is None
    assert row["status"] == "skipped" and "bf16" in row["reason"]


def test_sglang_contender_skips_a_pool_it_cannot_address():
    """SGLang's kernel computes slot x row stride in int32: a pool of 2^31
    elements or more is skipped with the reason, never launched."""
    sglang = bench_contenders.SGLangVerify(False)
    sglang.fwd = lambda *args, **kwargs: pytest.fail("launched")
    pool = torch.empty(1, dtype=torch.bfloat16).expand(2**31 // 576 + 1, 1, 576)
    vb = types.SimpleNamespace(v_buffer=pool[..., :512])
    batch = types.SimpleNamespace(
        spec=bench_shapes.parse_shape("H8L2B64C65536"), sets=[vb], k_buffer=pool
    )
    reason = bench._make_contender("sglang", batch, types.SimpleNamespace(sglang=sglang))
    assert isinstance(reason, str) and "int32" in reason and str(pool.numel()) in reason


def test_sglang_contender_says_why_it_is_not_there(tmp_path):
    assert "--sglang-src" in bench_contenders.SGLangVerify(True, None).reason
    missing = bench_contenders.SGLangVerify(True, tmp_path)
    assert not missing.available and "verify_mla.py" in missing.reason


def test_contenders_run_only_where_they_compute_the_call():
    def runs(text):
        spec = bench_shapes.parse_shape(text)
        return {
            c
            for c in bench_contenders.CONTENDERS
            if bench_contenders.not_applicable(c, spec) is None
        }

    package = {"tuned", "default", "triton", "torch_ref"}
    paged = {"paged", "paged_step", "paged_seesaw", "paged_translated"}
    assert runs("H16L4B32C16K") == set(bench_contenders.CONTENDERS) - paged
    bf16_only = {"flashinfer", "flashmla", "sglang"}
    assert runs("H16L4B32C16K-fp8") == set(bench_contenders.CONTENDERS) - paged - bf16_only
    assert runs("H16L4B32C16K-d256-fp8") == package
    for kind in ("-tree", "-treefull", "-ragged"):
        assert runs(f"H16L4B32C16K{kind}") == package, kind
    for kind in ("-d256", "-d128"):  # SGLang's kernel takes shared-KV head dims
        assert runs(f"H16L4B32C16K{kind}") == package | {"sglang"}, kind
    assert runs("H16L4B32C16K-i64") == package | {"sglang"}
    assert runs("H16L4B32C16K-page64") == paged | {"tuned", "flashmla"}
    assert runs("H16L4B32C16K-page128") == paged | {"tuned"}
    for page in (1, 16, 32):
        assert runs(f"H16L4B32C16K-page{page}") == {
            "paged",
            "paged_step",
            "paged_translated",
            "tuned",
        }
    for text in ("H16L4B32C16K", "H16L4B32C16K-tree-ragged", "H4L4B32C16K-d256", *KINDS):
        spec = bench_shapes.parse_shape(text)  # another revision's tuned: where tuned runs
        assert bench_contenders.not_applicable(
            "rev:0123456789ab", spec
        ) == bench_contenders.not_applicable("tuned", spec)


# --- the summary's comparisons --------------------------------------------------------------


def _row(shape, contender, median_us, frac_roofline=None):
    return {
        "shape": shape,
        "contender": contender,
        "status": "ok",
        "median_us": median_us,
        "frac_roofline": frac_roofline,
    }


def test_summary_compares_paged_with_flashmla_and_kinds_with_plain_rows():
    rows = [
        _row("H16L4B32C16384-page64", "paged", 90.0, 0.8),
        _row("H16L4B32C16384-page64", "tuned", 95.0, 0.5),
        _row("H16L4B32C16384-page64", "flashmla", 99.0),
        _row("H16L4B32C16384-page1", "paged", 100.0),
        _row("H16L4B32C16384-tree", "tuned", 100.0, 0.45),
        _row("H16L4B32C16384-d256", "tuned", 50.0, 0.3),
        _row("H64L4B32C16384-ragged", "tuned", 100.0, 0.6),  # no plain row ran
    ]
    assert bench_output.paged_vs_flashmla(rows) == [("H16L4B32C16384-page64", pytest.approx(1.1))]
    assert bench_output.kind_vs_plain(rows) == [
        ("H16L4B32C16384-tree", "H16L4B32C16384-page64", pytest.approx(0.9))
    ]
    assert "ragged drafts 1..4" in bench_output.describe_call(
        bench_shapes.parse_shape("H16L4B32C16K-ragged")
    )


def test_memory_estimate_counts_each_kinds_tensors():
    def need(text, flashmla=True):
        spec = bench_shapes.parse_shape(text)
        return bench_batch.estimate_bytes(
            spec, bench_shapes.prefix_lengths(spec), 10_000, 2, flashmla=flashmla
        )

    # FlashMLA's 64-token pages are the -page64 row's own: one paged copy, not two
    assert need("H16L4B32C1000-page64") == need("H16L4B32C1000")
    assert need("H16L4B32C1000", flashmla=False) < need("H16L4B32C1000")
    assert need("H16L4B32C1000-page1") > need("H16L4B32C1000", flashmla=False)
    # 256-wide K and V pools instead of one 576 wide, and fewer q/out columns
    assert need("H16L4B32C1000-d256") < need("H16L4B32C1000", flashmla=False)
    tree = need("H16L4B32C1000-tree") - need("H16L4B32C1000", flashmla=False)
    assert tree == 4 * 32 * (1000 + 4)  # the mask, every row's bits


def test_summary_and_table_render_the_new_kinds():
    base = ok_row()
    ceilings = bench_timing.Ceilings(4.2e12, 780e12)
    ctx = types.SimpleNamespace(ceilings=ceilings, arch="sm90", meta={})
    rows = []
    for text, contender, us in [
        ("H16L4B2C500-page64", "tuned", 10.0),
        ("H16L4B2C500-page64", "paged", 9.0),
        ("H16L4B2C500-page64", "flashmla", 9.9),
        ("H16L4B2C500-d256-ragged-treefull", "tuned", 8.0),
        ("H16L4B2C500-ragged-tree", "tuned", 11.0),
    ]:
        spec = bench_shapes.parse_shape(text)
        row = bench._base_row(spec, bench_shapes.prefix_lengths(spec), ctx)
        row.update({k: base[k] for k in bench_output.CONFIG_FIELDS})
        row.update(contender=contender, rel_err=1e-3, max_abs_err=1e-3)
        bench.record_timing(row, bench_timing._summarise([us] * 5, "cudagraph", 1), ctx)
        rows.append(row)
    bench.add_speedups(rows[:3])
    meta = {k: base[k] for k in ("device", "torch", "triton", "cuda", "flashinfer", "flash_mla")}
    meta.update(git_commit="abc1234", date_utc="2026-12-01T00:00:00+00:00")
    text = bench_output.summary_markdown(rows, meta, ceilings)
    assert "| H16L4B2C500-page64 | 1.100 |" in text  # t_flashmla / t_paged
    assert "| H16L4B2C500-ragged-tree | H16L4B2C500-page64 |" in text
    assert "H16L4B2C500-d256-ragged-treefull" in text and "every prefix bit read" in text
    table = bench_output.stdout_table(rows, ceilings)
    assert "paged vs FlashMLA (page 64, same pages): t_flashmla / t_paged geomean 1.100" in table
    assert "H16L4B2C500-d256-ragged-treefull " in table


# --- rev: contenders: this package at another commit, side by side -----------------------


@pytest.fixture(scope="module")
def head_rev(tmp_path_factory):
    """The package at HEAD, imported beside the working tree's: the first
    load in this process (a commit imports once; the tests below share it),
    with $MLA_VERIFY_CONFIG_DIR set to a value of its own, which the load
    must leave as it was."""
    if bench_revisions.run_git("rev-parse", "--verify", "HEAD").returncode != 0:
        pytest.skip("no git history here (a copy of the tree)")
    outside = str(tmp_path_factory.mktemp("outside_tables"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLA_VERIFY_CONFIG_DIR", outside)
        rev = bench_revisions.load_revision("HEAD")
        assert outside == os.environ["MLA_VERIFY_CONFIG_DIR"]
    return rev


def test_a_revision_imports_beside_the_package_with_its_own_ops_and_tables(head_rev):
    import mla_verify

    commit = bench_revisions.resolve_commit("HEAD")
    name = f"mla_verify_rev_{commit[:12]}"
    assert (head_rev.given, head_rev.commit) == ("HEAD", commit)
    assert head_rev.name == f"rev:{commit[:12]}"
    package = head_rev.module
    assert package.__name__ == name and package is not mla_verify
    assert package.verify_mla_fwd is not mla_verify.verify_mla_fwd
    # its ops under its own namespace; the working tree's where they were
    assert package.ops.verify_mla_fwd_op._qualname == f"{name}::verify_mla_fwd"
    assert hasattr(getattr(torch.ops, name), "verify_mla_paged")
    assert mla_verify.ops.verify_mla_fwd_op._qualname == "mla_verify::verify_mla_fwd"
    assert hasattr(torch.ops.mla_verify, "verify_mla_paged")
    # every entry of its exported tables was loaded from them (they took
    # precedence over any other config dir), and none of the working tree's
    export = Path(package.__file__).parents[1]
    exported = {
        (path.stem, key)
        for path in (export / "configs").glob("*.json")
        for key in json.loads(path.read_text())["entries"]
    }
    assert exported
    for arch, key in exported:
        assert Path(package.lookup._tables[arch][key].source).parent == export / "configs"
    ours = [e.source for entries in mla_verify.lookup._tables.values() for e in entries.values()]
    assert ours and not any(source.startswith(str(export)) for source in ours)
    # its shipped dir too is its export's, not the working tree's package's
    assert package.tables.shipped_table_dir() == export / "configs"
    assert bench_revisions.load_revision(commit) is head_rev  # once per commit, however named


def test_a_revision_can_be_a_directory_exported_beforehand(tmp_path):
    """Where the checkout has no git history (the GPU machines get a copy
    of the tree): a directory holding a revision's mla_verify/ and configs/
    (here the working tree's), named by the directory."""
    import mla_verify

    root = Path(bench.__file__).resolve().parents[1]
    source = tmp_path / "base-copy"
    for part in ("mla_verify", "configs"):
        shutil.copytree(root / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    rev = bench_revisions.load_revision(str(source))
    assert rev.name == "rev:base_copy"
    package = rev.module
    assert package.__name__ == "mla_verify_rev_base_copy" and package is not mla_verify
    assert hasattr(torch.ops.mla_verify_rev_base_copy, "verify_mla_paged")
    export = Path(package.__file__).parents[1]
    assert export != source and package.tables.shipped_table_dir() == export / "configs"
    assert bench_revisions.load_revision(str(source)) is rev


def test_a_revision_that_fails_to_import_leaves_the_config_dir_as_it_was(head_rev, monkeypatch):
    def fail(name):
        raise ImportError(f"{name}: broken")

    path = list(sys.path)
    monkeypatch.setattr(bench_revisions, "loaded_revisions", {})
    monkeypatch.setattr(bench_revisions.importlib, "import_module", fail)
    monkeypatch.setenv("MLA_VERIFY_CONFIG_DIR", "somewhere")
    with pytest.raises(ImportError, match="broken"):
        bench_revisions.load_revision("HEAD")
    assert os.environ["MLA_VERIFY_CONFIG_DIR"] == "somewhere"
    monkeypatch.delenv("MLA_VERIFY_CONFIG_DIR")
    with pytest.raises(ImportError, match="broken"):
        bench_revisions.load_revision("HEAD")
    assert "MLA_VERIFY_CONFIG_DIR" not in os.environ
    assert not bench_revisions.loaded_revisions and sys.path == path


def test_contenders_take_revisions_by_commit(head_rev, capsys):
    args = bench.parse_args(["--contenders", "tuned", "rev:HEAD", "--list-shapes"])
    assert args.contenders == ["tuned", head_rev.name]
    # the same commit named twice is one contender
    args = bench.parse_args(["--contenders", "rev:HEAD", head_rev.name, "--list-shapes"])
    assert args.contenders == [head_rev.name]
    assert bench.parse_args(["--list-shapes"]).contenders == list(bench_contenders.CONTENDERS)
    for bad, message in [
        ("rev:no-such-rev", "argument --contenders: rev:no-such-rev: not a commit of"),
        ("fastest", "argument --contenders: 'fastest': expected one of tuned, "),
    ]:
        with pytest.raises(SystemExit):  # refused before any GPU time is spent
            bench.parse_args(["--contenders", "tuned", bad, "--list-shapes"])
        assert message in capsys.readouterr().err


def _record_configs(package, monkeypatch) -> list:
    """The configs a revision's verify_mla_fwd is called with, in order (it
    still computes)."""
    calls = []

    def fwd(*args, **kwargs):
        calls.append(kwargs["config"])
        return package.api.verify_mla_fwd(*args, **kwargs)

    monkeypatch.setattr(package, "verify_mla_fwd", fwd)
    return calls


def test_a_revision_runs_its_own_verify_mla_fwd_and_tables(head_rev, device, monkeypatch):
    """A rev: contender through prepare_contender, as run_shape calls it:
    its own verify_mla_fwd, table lookup (config=None) on every rotation
    set, checked against the reference; its own resolve_config's config."""
    import mla_verify

    package = head_rev.module
    calls = _record_configs(package, monkeypatch)
    spec = bench_shapes.parse_shape("H2L2B2C9")
    lens = bench_shapes.prefix_lengths(spec)
    batch = bench_batch.build_batch(
        spec, lens, rotations=2, slots=2 * (sum(lens) + 4) + 5, device=torch.device(device), seed=2
    )
    ctx = types.SimpleNamespace(device=torch.device(device), arch="sm90")
    row = {}
    contender = bench.prepare_contender(head_rev.name, batch, batch.sets[0].reference(), ctx, row)
    assert contender is not None and row["rel_err"] < 6e-3, row
    assert contender.name == head_rev.name and calls == [None]
    contender.out.fill_(float("nan"))
    contender.launches[1]()
    assert calls == [None, None]
    assert bench_contenders.check_output(contender.output(), batch.sets[1].reference()).ok
    config, source = mla_verify.resolve_config(2, 2, 2, arch="sm90")
    assert dataclasses.asdict(contender.config) == dataclasses.asdict(config)
    assert row["config_source"].endswith("; rev:HEAD") and row["BLOCK_H"] == config.BLOCK_H


def test_a_revisions_triton_kernel_is_a_contender_of_its_own(head_rev, device, monkeypatch):
    """rev:<rev>:triton: that revision's portable kernel, launched with its
    own resolve_config(..., kernel="triton"), as the triton contender is;
    named apart from the revision's tuned, the same import."""
    package = head_rev.module
    args = bench.parse_args(["--contenders", "rev:HEAD", "rev:HEAD:triton", "--list-shapes"])
    name = f"{head_rev.name}:triton"
    assert args.contenders == [head_rev.name, name]
    assert bench_revisions.loaded_revisions[name].module is package
    calls = _record_configs(package, monkeypatch)
    spec = bench_shapes.parse_shape("H2L2B3Rlognormal40")
    lens = bench_shapes.prefix_lengths(spec)
    batch = bench_batch.build_batch(
        spec, lens, rotations=1, slots=sum(lens) + 12, device=torch.device(device), seed=3
    )
    ctx = types.SimpleNamespace(device=torch.device(device), arch="sm90")
    row = {}
    contender = bench.prepare_contender(name, batch, batch.sets[0].reference(), ctx, row)
    assert contender is not None and row["rel_err"] < 6e-3, row
    config, _ = package.resolve_config(2, 2, 3, arch="sm90", kernel="triton")
    assert contender.name == name and calls == [config] and config.kernel == "triton"


def test_a_revisions_step_call_is_a_contender_of_its_own(head_rev, device):
    """rev:<rev>:step: that revision's paged call given the step's metadata,
    as the paged_step contender is, on -page rows only; named apart from
    the revision's tuned, the same import."""
    args = bench.parse_args(["--contenders", "rev:HEAD", "rev:HEAD:step", "--list-shapes"])
    name = f"{head_rev.name}:step"
    assert args.contenders == [head_rev.name, name]
    assert bench_revisions.loaded_revisions[name].module is head_rev.module
    plain = bench_shapes.parse_shape("H2L2B2C9")
    assert bench_contenders.not_applicable(name, plain) == "only on -page<N> rows"
    assert bench_contenders.not_applicable(head_rev.name, plain) is None
    spec = bench_shapes.parse_shape("H2L2B2C9-page16")
    lens = bench_shapes.prefix_lengths(spec)
    batch = bench_batch.build_batch(
        spec, lens, rotations=1, slots=sum(lens) + 15, device=torch.device(device), seed=3
    )
    ctx = types.SimpleNamespace(device=torch.device(device), arch="sm90")
    row = {}
    contender = bench.prepare_contender(name, batch, batch.sets[0].reference(), ctx, row)
    assert contender is not None and row["rel_err"] < 6e-3, row
    assert contender.name == name
    assert row["config_source"].endswith("the step's metadata made once; rev:HEAD"), row


def test_the_overview_has_a_column_per_revision():
    ceilings = bench_timing.Ceilings(4.2e12, 780e12)
    rows = []
    for shape, contender, us in [
        ("H16L4B2C500", "tuned", 10.0),
        ("H16L4B2C500", "rev:0123456789ab", 11.0),
        ("H16L4B2C500", "rev:ba9876543210", 9.0),
        ("H16L4B2C900", "tuned", 10.0),
        ("H16L4B2C900", "rev:0123456789ab", 12.1),
    ]:
        row = _row(shape, contender, us)
        row.update(frac_copy_bw=None, tuned_speedup=us / 10.0)
        rows.append(row)
    assert bench_output.compared(rows)[-2:] == ["rev:0123456789ab", "rev:ba9876543210"]
    table = bench_output.stdout_table(rows, ceilings).splitlines()
    header = table[0]
    assert header.endswith(" rev:0123456789ab/t rev:ba9876543210/t")
    assert table[2].endswith("1.10".rjust(19) + "0.90".rjust(19))
    assert table[3].endswith("1.21".rjust(19) + "-".rjust(19))
    gm = bench_output.tuned_geomeans(rows)["rev:0123456789ab"]
    assert gm == (pytest.approx(1.1**1.5), 2)
    assert "rev:ba9876543210 0.900 (1 shapes)" in table[-2]
