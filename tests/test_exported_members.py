"""The public surface is exactly ``__all__`` (httpx's habit), and every name resolves."""

from __future__ import annotations

import subprocess
import sys
import types

import ckptio


def test_all_names_resolve():
    for name in ckptio.__all__:
        assert getattr(ckptio, name) is not None, name


def test_public_names_equal_all():
    # Submodules become attributes when imported; only `errors` is part of the API among them.
    plumbing = {"annotations", "TYPE_CHECKING", "Any"}
    eager = {n for n, v in vars(ckptio).items()
             if not n.startswith("_") and n not in plumbing and (not isinstance(v, types.ModuleType) or n == "errors")}
    assert eager | set(ckptio._LAZY) | {"__version__"} == set(ckptio.__all__)


def test_importing_storage_does_not_import_torch():
    code = "import sys, ckptio.storage, ckptio.errors; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_every_error_is_a_ckpt_error_and_pickles_with_context():
    import pickle

    from ckptio import errors

    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.CkptError), name
        exc = cls("boom", root="file:///r", step=3, rank=1, path="p")
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is cls and back.step == 3 and back.rank == 1 and "step=3" in str(back)
