"""What stays light: the CLI, the on-storage format and storage never import torch on import.

``ckptio ls``, ``verify``, ``plan``, ``probe``, ``admit`` and ``simulate`` answer in a fraction of a second, and the
writers of ranks > 0 never load libtorch; importing torch costs seconds and hundreds of MiB. One fresh interpreter
checks every module below (this process has torch loaded already).
"""

from __future__ import annotations

import subprocess
import sys

LIGHT_MODULES = [
    "ckptio",
    "ckptio.errors",
    "ckptio.format",
    "ckptio.storage",
    "ckptio.storage.s3.s3_storage",
    "ckptio.policy.residency",
    "ckptio.policy.volumes",
    "ckptio.engine.writer.process",
    "ckptio._cli.main",
    "ckptio._cli.steps_cmd",
    "ckptio._cli.plan_cmd",
    "ckptio._cli.probe_cmd",
    "ckptio._cli.admit_cmd",
    "ckptio._cli.simulate_cmd",
    "ckptio._cli.report_cmd",
]


def test_light_modules_do_not_import_torch() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {LIGHT_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "    if 'torch' in sys.modules:\n"
        "        print(name); break\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "", f"importing {out.stdout.strip()} loads torch"
