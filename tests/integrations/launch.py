"""Run code on real gloo ranks on 127.0.0.1: in-process spawned ranks, or a script under torchrun.

In-process ranks come from the shared launcher (:mod:`ckptio.testing.ranks`); this module adds torchrun.
"""

from __future__ import annotations

import os
import subprocess
import sys

from ckptio.testing.ranks import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SRC = os.path.join(REPO, "src")


def torchrun(nproc: int, script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (a file in this folder) under torchrun on 127.0.0.1, the way a user launches the stack.

    Fails the test with both ranks' output when the run fails.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SRC, REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--nnodes=1",
           "--master-addr=127.0.0.1", f"--master-port={free_port()}", os.path.join(HERE, script), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"{script} failed (exit {proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")
    return proc
