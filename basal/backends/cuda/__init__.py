"""The torch backend: CUDA on NVIDIA servers, CPU on Linux dev machines and CI (the numerical reference)."""
