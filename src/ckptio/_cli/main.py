"""Entry point of the ``ckptio`` command; each subcommand lives in its own module with ``register(subparsers)``.

Owns the top-level parser, the help a user sees, and the mapping of errors to exit codes (:data:`EPILOG`). Must
never hold a subcommand's logic: each ``*_cmd`` module parses its own flags and calls the library. No input may
end in a Python traceback: bad input is a :class:`~ckptio.errors.ConfigError` raised where it is read (exit 2);
anything else unexpected is reported in one line as an internal error (exit 3) — a bug to fix at its cause,
never a way to hide one.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from ckptio.errors import CkptError, ConfigError

# Module names under ckptio._cli, in the order ``ckptio --help`` lists their commands; each defines
# register(subparsers) and sets a ``func`` default returning an int.
SUBCOMMAND_MODULES = ("steps_cmd", "plan_cmd", "probe_cmd", "admit_cmd", "simulate_cmd", "report_cmd", "demo_cmd")

#: Exit codes, as ``--help`` documents them.
EXIT_OK, EXIT_FINDING, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: Set to print the traceback of an internal error (for a bug report).
TRACEBACK_ENV = "CKPTIO_TRACEBACK"

DESCRIPTION = (
    "ckptio keeps checkpoint I/O bursts off the training critical path, and tells you before a job starts "
    "whether its storage can take them."
)
EPILOG = (
    "Run 'ckptio COMMAND --help' for a command's options. "
    "Exit codes: 0 success; 1 a finding or a failed run (verify found damage, admit refused, the store failed); "
    "2 usage error (a bad argument, or a file named on the command line that cannot be read or written); "
    f"3 internal error (a bug in ckptio: please report it; {TRACEBACK_ENV}=1 prints the traceback); "
    "130 interrupted."
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
    where = f"ckptio {args.command}"
    try:
        return int(args.func(args))
    except ConfigError as exc:  # only a bad option or argument is a usage error
        print(f"{where}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CkptError as exc:  # a refusal or failure of the run (VolumePolicyError, StorageError, …)
        print(f"{where}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FINDING
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of our output went away (`ckptio ls root | head -1`): stop quietly, and keep the
        # interpreter's final flush from raising the same error again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FINDING
    except Exception as exc:  # the safety net: a bug, reported as one, never as a traceback to a user
        if os.environ.get(TRACEBACK_ENV):
            traceback.print_exc()
        print(f"{where}: internal error: {type(exc).__name__}: {_one_line(exc)}. This is a bug in ckptio: "
              f"please report it with the command line (set {TRACEBACK_ENV}=1 to print the traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else f"{text[:297]}..."


if __name__ == "__main__":
    sys.exit(main())
