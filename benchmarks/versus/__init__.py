"""The algorithms benchmarks/vs_cleanrl.py compares with CleanRL, one description a file."""
