"""Serving: a Triton model repository (one decoupled model owning the engine), the tritonserver
process, and the OpenAI-compatible front that streams from it (`dflash-trt serve`)."""
