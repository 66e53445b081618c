"""The Triton model (model.py, copied into the repository) and what it uses inside Triton's stub."""
