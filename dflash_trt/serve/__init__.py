"""Serving: Triton model repository and the OpenAI-compatible front. Not built yet."""
