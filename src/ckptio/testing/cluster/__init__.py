"""The cluster lab (issue 19): nodes, a shaped fabric and a real distributed store on one machine.

- :class:`Lab` / :class:`LabConfig`: N node network namespaces and a storage namespace on a bridge, every link
  shaped with ``tc htb``; MooseFS (or GlusterFS) mounted in every node; S3 from SeaweedFS (or moto).
- :mod:`ckptio.testing.cluster.jobs`: processes in a node (``launch``), gloo ranks across nodes
  (``launch_ranks``), a loader per node (``start_loader``).
- :func:`cleanup_stale`: remove what labs whose owner died left behind.
- :class:`LabUnavailable`: raised, with the reason, where the lab cannot run (tests skip on it).

Needs root, iproute2, util-linux's ``nsenter``, ``/dev/fuse`` and the packages ``make labdeps`` installs.
"""

from ckptio.testing.cluster.checks import LabUnavailable
from ckptio.testing.cluster.lab import Lab, cleanup_stale
from ckptio.testing.cluster.procs import LabError, Proc
from ckptio.testing.cluster.topology import LabConfig, LabNode

__all__ = ["Lab", "LabConfig", "LabError", "LabNode", "LabUnavailable", "Proc", "cleanup_stale"]
