"""Compute backends: a `PackedForward` in, letter logits out. They never choose what is in a forward."""
