"""The demo's save interval is the planner's: the shortest at which its flush keeps up with the demo's headroom."""

from __future__ import annotations

import pytest

from ckptio.demo.demo_config import DemoConfig
from ckptio.demo.predict import HEADROOM, MIN_EVERY, choose_every, given_every, plan_demo
from ckptio.errors import ConfigError

MiB = 2**20

CASES = [
    # (checkpoint bytes, world, store bytes/s, step s): the quiet machine, a busy one, a tiny model,
    # a slow store, many ranks.
    (320 * MiB, 2, 200 * MiB, 0.11),
    (320 * MiB, 2, 200 * MiB, 0.35),
    (27 * MiB, 2, 96 * MiB, 0.02),
    (1024 * MiB, 4, 50 * MiB, 0.5),
    (64 * MiB, 16, 1024 * MiB, 0.001),
]


@pytest.mark.parametrize(("nbytes", "world", "bandwidth", "step_s"), CASES)
def test_chosen_interval_keeps_up_with_headroom_and_a_much_shorter_one_does_not(
    nbytes: float, world: int, bandwidth: float, step_s: float
) -> None:
    choice = choose_every(nbytes, world=world, bytes_per_s=bandwidth, step_time_s=step_s, copy_bytes_per_s=8e9)
    assert choice.chosen and choice.every >= MIN_EVERY
    # The planner, asked independently at the chosen interval, says the flush keeps up with the headroom.
    plan = plan_demo(nbytes, world=world, bytes_per_s=bandwidth, every=choice.every, step_time_s=step_s,
                     copy_bytes_per_s=8e9)
    assert plan.keeps_up
    assert plan.flush_s <= HEADROOM * plan.interval_s
    assert not {"flush-behind", "flush-tight"} & set(plan.reason_codes)
    assert choice.keeps_up and "chosen by the planner" in choice.reason()
    # It is the shortest such interval (unless the floor set it) ...
    if choice.every > MIN_EVERY:
        shorter = plan_demo(nbytes, world=world, bytes_per_s=bandwidth, every=choice.every - 1, step_time_s=step_s,
                            copy_bytes_per_s=8e9)
        assert shorter.flush_s > HEADROOM * shorter.interval_s
    # ... and a much shorter one falls behind: the planner's verdict fails there.
    much_shorter = max(1, choice.every // 4)
    if much_shorter * step_s < plan.flush_s:
        behind = given_every(nbytes, every=much_shorter, world=world, bytes_per_s=bandwidth, step_time_s=step_s,
                             copy_bytes_per_s=8e9)
        assert not behind.plan.keeps_up and "flush-behind" in behind.plan.reason_codes
        assert not behind.keeps_up and "does NOT keep up" in behind.reason()


def test_the_interval_scales_with_the_flush() -> None:
    def every(nbytes: float, bandwidth: float) -> int:
        return choose_every(nbytes, world=2, bytes_per_s=bandwidth, step_time_s=0.1, copy_bytes_per_s=8e9).every

    assert every(640 * MiB, 200 * MiB) > every(320 * MiB, 200 * MiB) > every(320 * MiB, 800 * MiB)


def test_given_interval_is_judged_not_changed() -> None:
    choice = given_every(320 * MiB, every=12, world=2, bytes_per_s=200 * MiB, step_time_s=0.11, copy_bytes_per_s=8e9)
    assert choice.every == 12 and not choice.chosen
    assert not choice.keeps_up  # the default: 1.6 s of flush every 1.3 s


def test_steps_follow_the_interval_unless_given() -> None:
    assert DemoConfig().with_every(30).steps == 6 * 30
    assert DemoConfig(saves=3).with_every(10).steps == 40
    assert DemoConfig(steps=50).with_every(10).steps == 50
    with pytest.raises(ConfigError):
        DemoConfig(saves=1)
    with pytest.raises(ConfigError):
        DemoConfig(steps=10).with_every(10)
