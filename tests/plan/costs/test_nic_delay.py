"""The save's bytes beside the collectives on one NIC: what the planner charges the steps for them.

The lab of issue 19 measured it (docs/planning-measurements.md): its steps are network-bound (a 2 MiB ring
all-reduce on 400 Mbit node links) and the store is reached through the same links, so ckptio and DCP-best alike
lost what a node's checkpoint bytes take on its link, whatever their writers' CPU.
"""

from __future__ import annotations

import json

import pytest

from ckptio._cli.main import main
from ckptio.errors import ConfigError
from ckptio.plan.costs.background import nic_delay_s, predict_modes
from ckptio.plan.costs.inputs import Network, StoreTiming, Workload

MB = 1e6


def test_a_network_bound_step_loses_what_the_saves_bytes_take_on_the_nic() -> None:
    saturated = Workload(bytes_per_rank=50 * MB, interval_s=10.0, nic_share=1.0, nic_bytes_per_s=50 * MB)
    assert nic_delay_s(saturated, flush_s=2.0) == pytest.approx(1.0)
    half = Workload(bytes_per_rank=50 * MB, interval_s=10.0, nic_share=0.5, nic_bytes_per_s=50 * MB)
    assert nic_delay_s(half, flush_s=2.0) == pytest.approx(0.5)


def test_only_the_part_of_a_flush_while_training_runs_counts() -> None:
    behind = Workload(bytes_per_rank=50 * MB, interval_s=1.0, nic_share=1.0, nic_bytes_per_s=50 * MB)
    assert nic_delay_s(behind, flush_s=4.0) == pytest.approx(0.25)


def test_a_store_reached_another_way_costs_no_network_time() -> None:
    elsewhere = Workload(bytes_per_rank=50 * MB, interval_s=10.0)
    assert nic_delay_s(elsewhere, flush_s=2.0) == 0.0


def test_the_background_modes_are_charged_it_and_dcp_save_is_not() -> None:
    store = StoreTiming(store_s=1.0)
    base = Workload(bytes_per_rank=50 * MB, interval_s=10.0)
    shared = Workload(bytes_per_rank=50 * MB, interval_s=10.0, nic_share=0.8, nic_bytes_per_s=50 * MB)
    without, with_nic = predict_modes(base, store), predict_modes(shared, store)
    assert with_nic["dcp_sync"] == without["dcp_sync"]
    for mode in ("dcp_async", "dcp_best", "ckptio"):
        added = with_nic[mode].lost_per_save_s - without[mode].lost_per_save_s
        assert added == pytest.approx(nic_delay_s(shared, with_nic[mode].flush_s)), mode
        assert with_nic[mode].stolen_s > without[mode].stolen_s, mode


def test_the_collectives_share_of_the_nic_comes_from_their_bytes_and_the_step() -> None:
    nic = Network(bytes_per_s=50 * MB, ranks_per_node=2, collective_bytes_per_step=1 * MB)
    assert nic.collective_share(0.1) == pytest.approx(0.4)  # 2 ranks x 1 MB in 0.1 s of a 50 MB/s NIC
    assert nic.collective_share(0.01) == 1.0  # the network bounds the step
    assert nic.collective_share(None) == 0.0  # no step time: nothing to say
    with pytest.raises(ConfigError):
        Network(collective_bytes_per_step=-1.0)
    with pytest.raises(ConfigError):
        Workload(bytes_per_rank=1.0, nic_share=0.5)  # a share without the NIC's bandwidth


JOB = ["plan", "--params", "5.6M", "--weights-dtype", "fp32", "--optimizer", "adam-fp32", "--zero", "3",
       "--ranks", "4", "--write-bandwidth", "100MB/s", "--step-time", "0.07", "--interval", "31",
       "--network-bandwidth", "50MB/s", "--ranks-per-node", "1", "--json"]


def test_plan_charges_the_collective_bytes_given(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(JOB) == 0
    alone = json.loads(capsys.readouterr().out)["modes"]
    assert main([*JOB, "--collective-bytes", "3MiB"]) == 0
    shared = json.loads(capsys.readouterr().out)["modes"]
    # 16.8 MB per rank on a 50 MB/s link the all-reduce keeps ~90 % busy: about 0.3 s more per save.
    added = shared["ckptio"]["lost_per_save_s"] - alone["ckptio"]["lost_per_save_s"]
    assert 0.25 < added < 0.34, added
    assert shared["dcp_sync"] == alone["dcp_sync"]


@pytest.mark.parametrize("value", ["-1MiB", "lots"])
def test_a_bad_collective_bytes_exits_2(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*JOB, f"--collective-bytes={value}"]) == 2
    assert "--collective-bytes" in capsys.readouterr().err
