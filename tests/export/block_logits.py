"""Runs a draft block graph with the logits its ArgMax picks from exposed (export.verify's
with_block_logits, on an in-memory copy): the bundle itself returns token ids only."""

import onnx
import onnxruntime as ort

from dflash_trt.export.verify import with_block_logits


def run_with_logits(path, feed: dict, options: ort.SessionOptions | None = None) -> tuple:
    """draft_block.onnx at `path` on onnxruntime's CPU -> (block logits [b, B-1, V'], draft_tokens)."""
    model, logits = with_block_logits(onnx.load(str(path)))
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    tokens, values = session.run(["draft_tokens", logits], feed)
    return values, tokens
