"""Entry point of the ``ckptio`` command; each subcommand lives in its own module with ``register(subparsers)``.

Owns the top-level parser, the help a user sees, and the mapping of errors to exit codes. Must never hold a
subcommand's logic: each ``*_cmd`` module parses its own flags and calls the library.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ckptio.errors import CkptError, ConfigError

# Module names under ckptio._cli, in the order ``ckptio --help`` lists their commands; each defines
# register(subparsers) and sets a ``func`` default returning an int.
SUBCOMMAND_MODULES = ("steps_cmd", "plan_cmd", "probe_cmd", "admit_cmd", "simulate_cmd", "report_cmd", "demo_cmd")

DESCRIPTION = (
    "ckptio keeps checkpoint I/O bursts off the training critical path, and tells you before a job starts "
    "whether its storage can take them."
)
EPILOG = (
    "Run 'ckptio COMMAND --help' for a command's options. "
    "Exit codes: 0 success, 1 a finding (verify failed, admit refused), 2 usage error."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ckptio", description=DESCRIPTION, epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f"ckptio._cli.{name}").register(sub)
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
