"""Training frameworks: collators for each attention path, masks, export, Trainer / SFTTrainer helpers."""
