"""The DFlash algorithm, backend-agnostic: reference loop, acceptance rules, sampling, stopping, metrics."""
