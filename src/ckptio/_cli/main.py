"""Entry point of the ``ckptio`` command: each subcommand lives in its own module with ``register(subparsers)``.

Exit codes: 0 success, 1 a finding (verify failed, admit refused), 2 usage error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ckptio.errors import CkptError, ConfigError

# Module names under ckptio._cli; each defines register(subparsers) and sets a ``func`` default returning an int.
SUBCOMMAND_MODULES = ("inspect", "plan_cmd", "probe_cmd", "admit_cmd", "simulate_cmd", "report_cmd", "demo_cmd")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ckptio", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"ckptio._cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"ckptio._cli.{name}":
                continue  # subcommand not built yet
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:  # only a bad option or argument is a usage error
        print(f"ckptio {args.command}: {exc}", file=sys.stderr)
        return 2
    except CkptError as exc:  # a refusal or failure of the run (VolumePolicyError, StorageError, …)
        print(f"ckptio {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ckptio {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
