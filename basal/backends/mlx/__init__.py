"""The MLX backend: Metal on Apple Silicon (custom kernels), portable MLX ops elsewhere (mlx[cpu] on Linux CI)."""
