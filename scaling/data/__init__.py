"""Text and tasks to batches: corpora, tokenizers, the token cache (python -m scaling.data)."""
