"""The writer's zero-copy framing produces bytes torch.load reads exactly like torch.save's own."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch

CASES = {
    "f32": torch.randn(300, 70),
    "bf16": torch.randn(1000).bfloat16(),
    "bool": torch.rand(77) > 0.5,
    "i64_scalar": torch.tensor(12345),
    "f64_3d": torch.randn(4, 5, 6, dtype=torch.float64),
    "u8_big": torch.randint(0, 255, (3 << 20,), dtype=torch.uint8),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_spliced_framing_loads_bit_exact(name):
    # The framer changes a process-wide torch setting: run it in a fresh interpreter.
    code = """
import io, torch, pickle, sys
from ckptio.format.serialize import TensorFramer
t = pickle.loads(sys.stdin.buffer.read())
raw = memoryview(t.contiguous().reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")
framer = TensorFramer()
first = b"".join(bytes(p) for p in framer.frame(t, raw))
second_parts = framer.frame(t, raw)
second = b"".join(bytes(p) for p in second_parts)
assert first == second, "spliced bytes differ from torch.save's"
assert framer.splice and len(second_parts) == 3, "the second frame should be prefix + slot view + suffix"
sys.stdout.buffer.write(second)
"""
    import pickle

    tensor = CASES[name]
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(tensor), capture_output=True,
                         check=True).stdout
    loaded = torch.load(io.BytesIO(out), weights_only=True)
    assert loaded.dtype == tensor.dtype and loaded.shape == tensor.shape
    assert torch.equal(loaded, tensor)
