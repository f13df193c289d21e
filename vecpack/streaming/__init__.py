"""Packing while training runs, with exact resume: StreamingPackedDataset."""
