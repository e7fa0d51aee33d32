"""The NVIDIA production path: batch-invariant Triton kernels, a per-shape GEMM table, CUDA graphs and async
readback (docs/gpu-path.md). Modules that define Triton kernels import triton; the rest is plain Python and numpy, so
`import basal` never needs Triton (macOS has no wheels). Nothing here has run on a GPU yet."""
