"""The kernel code hashes: what they read (code alone, constexpr functions
too), and which family's hash a change to a kernel, a helper or a host
constant moves. CPU only: the code is read, never run."""

from __future__ import annotations

import pytest

from mla_verify import VerifyConfig, code_hash, hopper, kernel
from mla_verify.config import hopper_config

FAMILIES = ("triton", "gluon_sm90")
GLUON = hopper.gluon_kernel()
needs_gluon = pytest.mark.skipif(GLUON is None, reason="needs Triton's Gluon")
TRITON = VerifyConfig(BLOCK_H=4, BLOCK_N=16, NUM_KV_SPLITS=3, num_warps=4, num_stages=1)


def test_kernel_hash_reads_code_alone():
    """The hash reads each jitted function's syntax tree with no decorator,
    comment or formatting, and none of the empty fields some Python versions
    add (3.12's type_params): the same code hashes alike everywhere."""
    text = code_hash._kernel_source(kernel._add_drafts)
    assert text.startswith("Module(body=[FunctionDef(name='_add_drafts'")
    assert "type_params" not in text and "decorator_list" not in text and "#" not in text


@needs_gluon
def test_kernel_hash_covers_constexpr_functions():
    # A table's kernel hash must change with anything that shapes the
    # kernel, the producer's copy layout (a constexpr function) included.
    hashed = {fn.fn.__name__ for fn in code_hash._jitted(vars(GLUON))}
    assert {"_copy_layout", "_produce", "_consume_values", "_prefix_kernel_sm90"} <= hashed


def _changed(monkeypatch, module_name: str, name: str) -> dict[str, str]:
    """The family hashes after a change to the code of ``module.name``: its
    hashed text gains a statement, as an edit to it would."""
    module = {"kernel": kernel, "kernel_sm90": GLUON}[module_name]
    target = getattr(module, name)
    read = code_hash._kernel_source
    edited = lambda jitted: read(jitted) + ("Pass()" if jitted is target else "")  # noqa: E731
    monkeypatch.setattr(code_hash, "_kernel_source", edited)
    return code_hash.kernel_hashes()


# (module, jitted function) -> the families whose hash its code is in
CODE_FAMILIES = {
    "triton_stage1_helper": ("kernel", "_requests_met", {"triton"}),
    "triton_stage1_kernel": ("kernel", "_prefix_kernel", {"triton"}),
    "triton_stage2_helper": ("kernel", "_add_drafts", {"triton"}),
    "shares_stage2_helper": ("kernel", "_share_positions", {"gluon_sm90"}),
    "shares_plan_helper": ("kernel", "_prefix_lens", {"gluon_sm90"}),
    "shared_merge_helper": ("kernel", "_merge_pieces", {"triton", "gluon_sm90"}),
    "gluon_partition": ("kernel_sm90", "_consume_values", {"gluon_sm90"}),
    "gluon_constexpr_function": ("kernel_sm90", "_copy_layout", {"gluon_sm90"}),
    "gluon_stage1_kernel": ("kernel_sm90", "_prefix_kernel_sm90", {"gluon_sm90"}),
}


@pytest.mark.parametrize(
    "module, name, families",
    [
        pytest.param(*case, marks=needs_gluon if case[0] == "kernel_sm90" else ())
        for case in CODE_FAMILIES.values()
    ],
    ids=CODE_FAMILIES.keys(),
)
def test_a_code_change_changes_the_hashes_of_the_families_that_run_it(
    monkeypatch, module, name, families
):
    """A Triton-only helper changes the triton hash alone, a Gluon-only one
    gluon_sm90's alone, one both families call both: tuned records of the
    other family stay current."""
    assert code_hash.kernel_hashes() == code_hash.KERNEL_HASHES  # the same code, the same hashes
    after = _changed(monkeypatch, module, name)
    assert {f for f in FAMILIES if after[f] != code_hash.KERNEL_HASHES[f]} == families


# (module, constant, new value) -> the families whose launches it shapes
CONSTANT_FAMILIES = {
    "plan_block": ("kernel", "PLAN_BLOCK", 64, {"triton", "gluon_sm90"}),
    "merge_warps": ("kernel", "MERGE_WARPS", 8, {"triton", "gluon_sm90"}),
    "merge_shares_tile": ("kernel", "MERGE_SHARES_TILE", 4096, {"gluon_sm90"}),
    "merge_max_blocks": ("kernel", "MERGE_MAX_BLOCKS", 8, {"gluon_sm90"}),
    "merge_wide_pieces": ("kernel", "MERGE_WIDE_PIECES", 8, {"gluon_sm90"}),
    "merge_shares_wide_tile": ("kernel", "MERGE_SHARES_WIDE_TILE", 8192, {"gluon_sm90"}),
    "hopper_shape": ("hopper", "SHAPE", (), {"gluon_sm90"}),
}


@pytest.mark.parametrize(
    "module, name, value, families", CONSTANT_FAMILIES.values(), ids=CONSTANT_FAMILIES.keys()
)
def test_a_host_constant_changes_the_hashes_of_the_families_it_shapes(
    monkeypatch, module, name, value, families
):
    monkeypatch.setattr({"kernel": kernel, "hopper": hopper}[module], name, value)
    after = code_hash.kernel_hashes()
    assert {f for f in FAMILIES if after[f] != code_hash.KERNEL_HASHES[f]} == families


@needs_gluon
def test_a_constant_the_gluon_kernel_reads_is_in_its_hash(monkeypatch):
    """Module constants are followed from the code that reads them (a
    constexpr by its value), not listed."""
    monkeypatch.setattr(GLUON, "TOKENS", GLUON.gl.constexpr(32))
    after = code_hash.kernel_hashes()
    assert after["gluon_sm90"] != code_hash.KERNEL_HASHES["gluon_sm90"]
    assert after["triton"] == code_hash.KERNEL_HASHES["triton"]
    monkeypatch.setattr(GLUON, "TOKENS", GLUON.gl.constexpr(GLUON.hopper.TOKENS))
    assert code_hash.kernel_hashes() == code_hash.KERNEL_HASHES


@needs_gluon
def test_every_jitted_function_is_in_some_familys_hash():
    """The walk from the launched kernels reaches every jitted and constexpr
    function of both modules (partitions passed to warp_specialize as
    values included): one it missed would change no hash when edited."""
    reached = set()
    for kernels, _ in code_hash._families().values():
        reached |= set(code_hash._code_closure(kernels))
    defined = code_hash._jitted(vars(kernel)) + code_hash._jitted(vars(GLUON))
    names = {code_hash._local_name(f.fn.__module__, f.fn.__qualname__) for f in defined}
    assert names - reached == set()


def test_without_gluon_the_gluon_family_still_has_a_hash(monkeypatch):
    """Where kernel_sm90 cannot be imported, its family hashes what can be
    read (stage 2 and the host constants): defined and the same on every
    such machine, and never a Gluon build's; the Triton kernel's is as
    everywhere."""
    monkeypatch.setattr(code_hash, "kernel_sm90", None)
    hashes = code_hash.kernel_hashes()
    assert hashes == code_hash.kernel_hashes()
    assert set(hashes) == set(FAMILIES) and all(len(h) == 16 for h in hashes.values())
    assert hashes["triton"] == code_hash.KERNEL_HASHES["triton"]
    if GLUON is not None:
        assert hashes["gluon_sm90"] != code_hash.KERNEL_HASHES["gluon_sm90"]
    assert _changed(monkeypatch, "kernel", "_share_positions") != hashes  # stage 2 still counts


def test_kernel_hash_of_a_config_is_its_familys():
    hopper_config_ = hopper_config(16, 4, 8, "gluon_sm90_sv")
    assert code_hash.kernel_hash(hopper_config_) == code_hash.KERNEL_HASHES["gluon_sm90"]
    assert code_hash.kernel_hash("gluon_sm90") == code_hash.KERNEL_HASHES["gluon_sm90"]
    assert code_hash.kernel_hash(TRITON) == code_hash.KERNEL_HASHES["triton"]
    assert code_hash.KERNEL_HASHES["triton"] != code_hash.KERNEL_HASHES["gluon_sm90"]
