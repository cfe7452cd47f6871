"""``python -m ckptio.engine.writer FD NICE``: the writer process's entry. It lowers its priority by ``NICE``
before it imports the writer (:mod:`ckptio.engine.writer.process` does the rest).

Why first: booting the interpreter and importing the writer costs a fraction of a CPU-second, and the trainer starts
its writer when it builds the ``Checkpointer`` — just before a resumed job's restore, when every rank of the host
wants its cores. Taken at the trainer's priority, the boots of a host's writers come out of the restore's time.
"""

import sys

from ckptio._proc import lower_priority

lower_priority(int(sys.argv[2]))

from ckptio.engine.writer.process import main  # noqa: E402 - after the priority, on purpose

main()
