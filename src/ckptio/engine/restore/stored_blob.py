"""From an item's stored bytes to the ``torch.save`` blob they hold: DCP stream extensions undone, and a plain DCP
item's zip CRC-32 checked, before anything is handed to ``torch.load`` or the allowlisted unpickler.

DCP's ``FileSystemWriter`` can store items through *stream extensions* (``_extensions=[ZStandard()]``, or a user's
own ``StreamTransformExtension``), recording each item's ``transform_descriptors`` in ``.metadata``. They are undone
here in the order DCP's own reader undoes them, with the classes of the reader's ``ExtensionRegistry`` (DCP's
default holds ZStandard; a user registers their own and passes the registry). A descriptor the registry does not
know, or whose module is missing, is :class:`~ckptio.errors.UnknownExtensionError` naming it: the encoded bytes
never reach ``torch.load``, whose message would blame ``weights_only``.
"""

from __future__ import annotations

import io
from typing import Any

from torch.distributed.checkpoint._extension import ExtensionRegistry, StreamTransformExtension
from torch.distributed.checkpoint.planner import ReadItem

from ckptio.errors import ChecksumError, CorruptCheckpointError, UnknownExtensionError
from ckptio.format.torchsave import zip_crc_problem


class BlobOpener:
    """``opener(req, stored) -> blob`` for the items of one reader's ``storage_data``."""

    def __init__(self, storage_data: dict[Any, Any], *, registry: ExtensionRegistry | None, check_zip: bool,
                 root: str, step: int | None) -> None:
        self.storage_data, self.check_zip, self.root, self.step = storage_data, check_zip, root, step
        """``check_zip``: hold each blob to the zip CRC-32s torch.save recorded (a plain DCP checkpoint's only
        checksums; ckptio's own items carry crc32c blocks, checked as they were read)."""
        self.registry = registry if registry is not None else ExtensionRegistry()

    def __call__(self, req: ReadItem, stored: bytes | memoryview) -> bytes | memoryview:
        fqn = req.storage_index.fqn
        descriptors = getattr(self.storage_data.get(req.storage_index), "transform_descriptors", None) or ()
        blob = self._decode(fqn, list(descriptors), stored) if descriptors else stored
        if self.check_zip:
            problem = zip_crc_problem(blob)
            if problem is not None:
                raise ChecksumError(f"{fqn!r}: {problem}", root=self.root, step=self.step, path=fqn)
        return blob

    def _decode(self, fqn: str, descriptors: list[str], stored: bytes | memoryview) -> bytes:
        try:
            extensions = self.registry.from_descriptor_list(descriptors)
        except (ValueError, ImportError) as exc:
            raise UnknownExtensionError(
                f"{fqn!r} was stored through the DCP extension(s) {descriptors}, which this reader cannot decode "
                f"({exc}); register the extension in an ExtensionRegistry and pass it as extension_registry",
                root=self.root, step=self.step, path=fqn) from exc
        stream: Any = io.BytesIO(stored)
        for extension in extensions:
            if isinstance(extension, StreamTransformExtension):
                stream = extension.transform_from(stream)
        try:
            return bytes(stream.read())
        except Exception as exc:  # a damaged compressed stream raises its codec's own errors
            raise CorruptCheckpointError(f"{fqn!r}: its {descriptors} stream does not decode: {exc}",
                                         root=self.root, step=self.step, path=fqn) from exc
