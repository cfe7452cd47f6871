"""The writer's torch-free framing is byte-identical to torch.save's (CRC off), and torch.load reads it exactly.

torch.save's CRC setting is process-wide, so every comparison runs in a fresh interpreter.
"""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys

import pytest
import torch

from ckptio.format import torchsave
from ckptio.format.serialize import TensorFramer

SHAPES = [(), (0,), (5,), (3, 4), (0, 5), (3, 0), (2, 3, 4), (2, 3, 4, 5), (1, 1, 1, 1, 1, 1), (70000,), (300, 70),
          (1 << 16, 3), (257,), (65537,)]

_COMPARE = """
import io, json, sys, torch
from ckptio.format import torchsave
torch.serialization.set_crc32_options(False)  # what the writer's torch.save fallback (and the old framer) ran with
shapes = [tuple(s) for s in json.loads(sys.argv[1])]
checked, differ = 0, []
for name in torchsave.DTYPES:
    dtype = getattr(torch, name)
    for shape in shapes:
        flat = torch.randint(0, 256, (torchsave.nbytes(name, shape),), dtype=torch.uint8)
        tensor = flat.view(dtype).view(shape)
        out = io.BytesIO()
        torch.save(tensor, out)
        prefix, suffix = torchsave.framing(name, shape)
        if prefix + flat.numpy().tobytes() + suffix != out.getvalue():
            differ.append([name, list(shape)])
        checked += 1
print(json.dumps({"checked": checked, "differ": differ}))
"""


def test_framing_is_byte_identical_to_torch_save_for_every_listed_dtype():
    out = subprocess.run([sys.executable, "-c", _COMPARE, json.dumps(SHAPES)], capture_output=True, check=True,
                         text=True).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report["checked"] == len(torchsave.DTYPES) * len(SHAPES)
    assert report["differ"] == []


CASES = {
    "f32": torch.randn(300, 70),
    "bf16": torch.randn(1000).bfloat16(),
    "f16_0d": torch.tensor(1.5, dtype=torch.float16),
    "bool": torch.rand(77) > 0.5,
    "i64_scalar": torch.tensor(12345),
    "f64_3d": torch.randn(4, 5, 6, dtype=torch.float64),
    "u8_big": torch.randint(0, 255, (3 << 20,), dtype=torch.uint8),
    "c64": torch.randn(9, dtype=torch.complex64),
    "f8": torch.randn(33).to(torch.float8_e4m3fn),
    "u16": torch.randint(0, 1 << 16, (10,), dtype=torch.int32).to(torch.uint16),
    "empty": torch.empty(0, 7),
    "transposed": torch.randn(6, 4).t(),  # non-contiguous: staged contiguously, as copy_into_slot does
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_framed_bytes_load_exactly(name):
    tensor = CASES[name]
    staged = tensor.contiguous()
    raw = memoryview(staged.reshape(-1).view(torch.uint8).numpy()) if staged.numel() else memoryview(b"")
    framer = TensorFramer()
    parts = framer.frame(str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), raw)
    assert len(parts) == 3 and parts[1] is raw, "the slot bytes are spliced, not copied"
    assert not framer.torch_imported
    loaded = torch.load(io.BytesIO(b"".join(bytes(p) for p in parts)), weights_only=True)
    assert loaded.dtype == tensor.dtype and loaded.shape == tensor.shape
    assert torch.equal(loaded.reshape(-1).view(torch.uint8), staged.reshape(-1).view(torch.uint8))  # the bits


@pytest.mark.parametrize("value", [0, 1, 255, 256, 65535, 65536, (1 << 31) - 1, 1 << 31, (1 << 40) + 3, 1 << 63,
                                   (1 << 64) - 1])
def test_pickled_ints_match_cpythons(value):
    # Shapes and storage sizes of huge tensors take the wider opcodes: the same ones pickle itself picks.
    p = torchsave._Pickle()
    p.int_(value)
    assert bytes(p.out[2:]) == pickle.dumps(value, protocol=2)[2:-1]


_FALLBACK = """
import sys, torch
from ckptio.format import serialize, torchsave
torchsave._ZIP32_LIMIT = 16  # pretend every tensor is too big for the torch-free path
framer = serialize.TensorFramer()
t = torch.arange(100, dtype=torch.float32)
raw = memoryview(t.numpy().view("uint8"))
first = framer.frame("float32", (100,), raw)
second = framer.frame("float32", (100,), raw)
assert framer.torch_imported and len(first) == 1 and len(second) == 3
assert b"".join(bytes(p) for p in second) == first[0]
sys.stdout.buffer.write(first[0])
"""


def test_fallback_uses_torch_save_and_splices_after_the_first_blob():
    out = subprocess.run([sys.executable, "-c", _FALLBACK], capture_output=True, check=True).stdout
    assert torch.equal(torch.load(io.BytesIO(out), weights_only=True), torch.arange(100, dtype=torch.float32))


def test_unknown_dtype_is_not_framed_here():
    assert torchsave.framing("qint8", (4,)) is None
