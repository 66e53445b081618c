"""Runtime: the LLM API and per-request sessions for each backend."""
