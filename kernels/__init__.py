"""Attention and sampling kernels: a plain-torch implementation of each (the CPU path and the
reference that Triton kernels are tested against)."""
