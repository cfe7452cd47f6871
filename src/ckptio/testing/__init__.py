"""Shipped test kit: for backend authors, ckptio's own tests, the benchmarks and the demo alike.

- :mod:`ckptio.testing.conformance`: the storage conformance suite (``StoreTests``), a pytest plugin;
- :mod:`ckptio.testing.wrappers`: throttle, latency and fault-injection storages;
- :mod:`ckptio.testing.moto_s3`: an embedded S3-protocol server (moto) on 127.0.0.1 that honours conditional writes;
- :mod:`ckptio.testing.s3rver_s3`: s3rver (npm) on 127.0.0.1, a store that ignores conditional writes;
- :mod:`ckptio.testing.write_races`: processes racing the conditional writes round after round (exclusion across
  processes, or across clients of a shared filesystem), and filesystem stand-ins that refuse links or ``O_EXCL``;
- :mod:`ckptio.testing.ranks`: one launcher for real ``torch.distributed`` gloo ranks;
- :mod:`ckptio.testing.staging`: hold a Checkpointer's staging copy back (mutation-safety tests);
- :mod:`ckptio.testing.cluster`: the cluster lab: node namespaces behind shaped links, a parallel
  filesystem and S3 behind the store's link, ranks, loaders and node losses across them (root only).

Nothing here is imported by the engine; the demo imports it, never the reverse.
"""
