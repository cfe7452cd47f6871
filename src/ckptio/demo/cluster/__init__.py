"""``ckptio demo --cluster`` and ``bench/bench_lab.py``: the main job at cluster shape, in the cluster lab.

A lab (:mod:`ckptio.testing.cluster`) of N node namespaces behind shaped links, a parallel filesystem and S3 behind
the store's link, a loader reading on every node; the job's ranks train with an all-reduce across the nodes and save
with ckptio (local level, partner copies, every k-th save durable) or DCP-best; a node is lost for real and the job
resumes. The modules read as the demo runs: ``runner`` (phases and console) → ``planner`` (``ckptio probe`` inside
the nodes, then ``plan`` and ``admit`` on what it measured) → ``session`` (the lab, the loaders, launches, the node
loss) → ``lab_rank`` (one rank: measures only) → ``figures`` (what the records mean) → ``table`` (how they show).

Imports the lab kit, never the reverse; needs what the lab needs (root, network namespaces, FUSE, ``make labdeps``).
"""
