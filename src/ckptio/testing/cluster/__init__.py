"""The cluster lab: nodes, a shaped fabric and a real distributed store on one machine.

- :class:`Lab` / :class:`LabConfig`: N node network namespaces and a storage namespace on a bridge, every link
  shaped with ``tc htb`` (one class per peer and direction); MooseFS (or GlusterFS) mounted in every node; S3
  from SeaweedFS (or moto). ``with Lab(LabConfig(nodes=2)) as lab: ...`` starts it and always tears it down.
- Work on the nodes: ``lab.launch(node, argv)`` (any process), ``lab.launch_ranks(argv, nodes)`` (gloo ranks
  across nodes, with the torchrun variables, ``CKPTIO_PARTNER_HOST`` and ``CKPTIO_LAB_NODE`` set),
  ``lab.start_loader(node, directory, out)`` (a reader of the store reporting its throughput); every process sees
  its node's mount at ``lab.pfs_path`` and its local disk at ``lab.local_path``. See
  :mod:`ckptio.testing.cluster.jobs` (also ``measure_mbit``, ``write_dataset``, ``read_loader``).
- Failures and links: ``lab.lose_node(node)`` (kill its namespace, wipe its disk, remount), ``lab.reshape(link,
  mbit)``, ``lab.link_bytes(link)``; ``lab.s3`` (endpoint, bucket, ``env()``, a host ``client()``).
- :func:`cleanup_stale`: remove what labs whose owner died left behind.
- :class:`LabUnavailable`: raised, with the reason, where the lab cannot run (tests skip on it).

Needs root, iproute2, util-linux (``nsenter``, ``unshare``), FUSE and the packages ``make labdeps`` installs.
"""

from ckptio.testing.cluster.checks import LabUnavailable
from ckptio.testing.cluster.lab import Lab, cleanup_stale
from ckptio.testing.cluster.procs import LabError, Proc
from ckptio.testing.cluster.topology import LabConfig, LabNode

__all__ = ["Lab", "LabConfig", "LabError", "LabNode", "LabUnavailable", "Proc", "cleanup_stale"]
