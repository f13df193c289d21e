"""Training frameworks: collators for each attention path, masks, export for TRL and datasets."""
