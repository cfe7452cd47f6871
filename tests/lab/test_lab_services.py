"""The lab's plumbing: each flow is counted by the htb class of its peer on both ends of the link, the host
reaches the lab's S3 only through its loopback forwarder, and moto stands in where SeaweedFS is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckptio.testing.cluster import Lab, LabConfig, netns
from ckptio.testing.cluster.jobs import RankJob, measure_mbit
from tests.lab.conftest import start_lab

pytestmark = pytest.mark.lab


def test_a_transfer_is_counted_by_its_peers_class_on_both_ends(lab: Lab) -> None:
    src, dst = lab.nodes
    before_up, before_down = lab.link_bytes(0)["up"], lab.link_bytes(1)["down"]
    result = measure_mbit(lab, 0, 1, seconds=1.0)
    up, down = lab.link_bytes(0)["up"], lab.link_bytes(1)["down"]
    assert result["bytes"] > 0
    # Node 0's upload class for node 1 and node 1's download class for node 0 carried it, headers included...
    assert up[dst.address] - before_up[dst.address] >= result["bytes"]
    assert down[src.address] - before_down[src.address] >= result["bytes"]
    # ...and not the classes of other peers (the storage): the filters match flows by address.
    assert up[lab.storage_address] - before_up[lab.storage_address] < result["bytes"] // 10


S3_CLIENT = """
import boto3, json
s3 = boto3.client("s3")
s3.put_object(Bucket="lab", Key="from-node", Body=b"payload")
print(json.dumps({"read": s3.get_object(Bucket="lab", Key="from-node")["Body"].read().decode()}), flush=True)
"""


def test_moto_stands_in_for_seaweedfs_and_serves_the_nodes() -> None:
    lab = start_lab(LabConfig(nodes=1, pfs="none", s3="moto"))
    try:
        assert lab.s3 is not None and lab.s3.kind == "moto"
        assert lab.s3.url.startswith(f"http://{lab.storage_address}:")  # in the storage namespace, not loopback
        client = RankJob([lab.launch(0, [sys.executable, "-c", S3_CLIENT], stdout=subprocess.PIPE)], [0])
        assert client.line(0, "read", timeout=120) == {"read": "payload"}
        assert lab.s3.client().get_object(Bucket="lab", Key="from-node")["Body"].read() == b"payload"  # forwarder
        assert client.wait() == [0]
    finally:
        lab.close()


def _addresses(ns: str | None) -> set[str]:
    argv = ["ip", "-o", "-4", "addr"] if ns is None else ["ip", "-n", ns, "-o", "-4", "addr"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return {line.split()[3].split("/")[0] for line in out.splitlines()}


def test_every_lab_address_lives_in_a_lab_namespace(lab: Lab) -> None:
    """The host gets no lab address (it reaches S3 through its loopback forwarder), and each lab address is
    where it belongs. (Never probe a lab address from the host: it would leave through the host's default route.)"""
    assert lab.s3 is not None and lab.s3.host_url is not None and lab.s3.host_url.startswith("http://127.0.0.1:")
    lab_addresses = {lab.storage_address, *(n.address for n in lab.nodes)}
    assert not _addresses(None) & lab_addresses
    assert _addresses(lab.storage_ns) == {"127.0.0.1", lab.storage_address}
    for node in lab.nodes:
        assert _addresses(node.ns) == {"127.0.0.1", node.address}
    assert _addresses(lab.fabric) == {"127.0.0.1"}  # the bridge has no address: it only switches


def _htb_rates(ns: str, dev: str) -> set[str]:
    out = subprocess.run(["tc", "-n", ns, "class", "show", "dev", dev], capture_output=True, text=True,
                         check=True).stdout
    return {line.split(" ceil ")[1].split()[0] for line in out.splitlines() if " ceil " in line}


def test_reshape_sets_both_directions_of_a_link(lab: Lab) -> None:
    assert _htb_rates(lab.storage_ns, "eth0") == {"800Mbit"}
    try:
        lab.reshape("store", 200)
        assert _htb_rates(lab.storage_ns, "eth0") == {"200Mbit"}  # the store's upload: what nodes read
        assert _htb_rates(lab.fabric, "st") == {"200Mbit"}  # its download: what nodes write
        assert _htb_rates(lab.nodes[0].ns, "eth0") == {"400Mbit"}  # the nodes' links are untouched
    finally:
        lab.reshape("store", 800)
    assert _htb_rates(lab.fabric, "st") == {"800Mbit"}


def test_the_forwarder_is_not_one_of_its_nodes_processes(lab: Lab) -> None:
    """Its connections go out through node 0, but the process stays in the host's namespace: losing node 0
    (which kills every process of that namespace) does not cut the host off from S3."""
    forwarders = [p for p in lab.procs() if p.name.startswith("forward-")]
    assert forwarders and all(p.alive() for p in forwarders)
    assert not {p.pid for p in forwarders} & set(netns.pids(lab.nodes[0].ns))
    assert lab.s3 is not None and lab.s3.client().list_objects_v2(Bucket=lab.s3.bucket)["ResponseMetadata"]
