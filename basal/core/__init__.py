"""Everything a decision needs except the forward pass: pure Python + numpy, imports no backend."""
