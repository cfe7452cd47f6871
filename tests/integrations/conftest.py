"""Integration tests never reach a model hub: everything is built from configs."""

from __future__ import annotations

import os

# Read by huggingface_hub when it is imported, so set before any test module imports transformers.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
