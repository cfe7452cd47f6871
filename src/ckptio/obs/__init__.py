"""Observability: JSONL events (the record), Prometheus metrics and reports derived from them."""
