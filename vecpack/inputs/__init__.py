"""Reading inputs: which files a call names, and one reader per format (see docs/architecture.md)."""
