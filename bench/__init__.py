"""The measurement tools that stay in the repository: the peer comparison
(bench.peers), the soak (bench/soak.py) and the GPU benchmarks
(bench/gpu_kernels.py, bench/gpu_collectives.py), all on smddp.bench's core.
Run them from the repository's root (``python -m bench.peers``)."""
