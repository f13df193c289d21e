"""Tokenized documents to packs: the numba kernels, plans, packed datasets, the online packer."""
