"""scripts/model_seesaw.py: the pair period it predicts is never shorter
than the pair's products at the tensor cores' rate, and where the refills
are slow, each cycle more of refill latency is a cycle more of period."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import model_seesaw  # noqa: E402  (scripts/ is not a package)

ORDERS = {
    "groups": {},
    "slices": {"slices": True},
    "a_first": {"a_first": True},
    "late_release": {"early": False},
}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("refill", [0, 800, 2400])
def test_no_pair_is_shorter_than_its_products(order, refill):
    step = 4  # the model's time step
    period = model_seesaw.pair_period(
        softmax=700, refill=refill, slice_cycles=200, step=step, **ORDERS[order]
    )
    assert period >= model_seesaw.PAIR - step


@pytest.mark.parametrize("order", ORDERS)
def test_slow_refills_set_the_period(order):
    def period(refill):
        return model_seesaw.pair_period(
            softmax=700, refill=refill, slice_cycles=200, **ORDERS[order]
        )

    assert period(4000) - period(3000) == pytest.approx(1000, abs=16)
