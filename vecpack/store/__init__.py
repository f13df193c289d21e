"""The content-addressed, memory-mapped cache, and packed datasets saved to directories."""
