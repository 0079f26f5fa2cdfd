"""Tools around training: the benchmark runner and the learning-curve plots."""
