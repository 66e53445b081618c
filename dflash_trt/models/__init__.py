"""PyTorch reference models: the DFlash drafter, target adapters, checkpoint loading and pairing checks."""
