"""Rows to conversations: the row styles and the chat template, rendered exactly."""
