"""``python -m ckptio.engine.writer_main FD``: the writer process's entry point.

The writer is started as a fresh interpreter (not multiprocessing's spawn) so it never re-imports the user's
``__main__`` — training scripts without an ``if __name__ == "__main__"`` guard, notebooks and torchrun entry points
all work. The trainer passes one end of a socketpair as ``FD``; the first message is the WriterSpec.
"""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

from ckptio.engine.writer import writer_main


def main() -> None:
    conn = Connection(int(sys.argv[1]))
    spec = conn.recv()
    writer_main(conn, spec)


if __name__ == "__main__":
    main()
