"""Compute backends: a `PackedBatch` in, letter logits out. They never choose what is in a batch."""
