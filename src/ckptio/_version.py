"""The package version, in a leaf module: code inside ckptio that records it (a manifest's ``versions``) imports
it from here, not from the ``ckptio`` package, whose lazy API names the engine and would close an import circle.
Keep it equal to ``version`` in pyproject.toml."""

__version__ = "0.1.0"
