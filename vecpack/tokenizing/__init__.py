"""Rows to flat int32 token and label arrays, on every core: encoders, engines, the pool, executors."""
