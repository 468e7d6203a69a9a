"""The shared learning-rate schedule of the training modules (lightning_modules/lr_schedule.py)."""
import math

import pytest
import torch

from lightning_modules.lr_schedule import stepped_schedule, warmup_then_decay


@pytest.mark.parametrize("decay", ["constant", "cosine", "linear"])
def test_warmup_rises_linearly_to_the_base_rate(decay):
    factor = warmup_then_decay(4, 20, decay)
    assert [factor(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert factor(4) == 1.0     # the first step after the warm-up runs at the base rate


def test_cosine_halves_at_the_middle_and_ends_at_zero():
    factor = warmup_then_decay(2, 12, "cosine")
    assert factor(7) == pytest.approx(0.5)                      # 5 of the 10 steps after the warm-up
    assert factor(12) == pytest.approx(0.0, abs=1e-12)
    assert factor(30) == pytest.approx(0.0, abs=1e-12)          # capped after the end
    values = [factor(s) for s in range(2, 13)]
    assert all(a >= b for a, b in zip(values, values[1:]))      # never rises again
    assert factor(5) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.3)))


def test_linear_decay_and_constant():
    linear = warmup_then_decay(0, 10, "linear")
    assert [linear(s) for s in (0, 5, 10, 11)] == [1.0, 0.5, 0.0, 0.0]
    constant = warmup_then_decay(0, 10, "constant")
    assert {constant(s) for s in range(15)} == {1.0}


def test_unknown_decay_is_named():
    with pytest.raises(ValueError, match="decay must be one of .*'step'"):
        warmup_then_decay(1, 10, "step")


def test_stepped_schedule_drives_the_optimizer_per_step():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    config = stepped_schedule(opt, 2, 6, "linear")
    assert config["lr_scheduler"]["interval"] == "step"
    scheduler = config["lr_scheduler"]["scheduler"]
    rates = []
    for _ in range(6):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    assert rates == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25])
