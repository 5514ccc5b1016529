"""Kernel (or CPU op) tables across one trace or many: `rankscope kernels`."""
