"""dflash-trt: lossless DFlash speculative decoding, from HF checkpoints to TensorRT engines."""

from dflash_trt.errors import DFlashError
from dflash_trt.runtime.beam_search import BeamSearchParams
from dflash_trt.runtime.llm import LLM
from dflash_trt.runtime.outputs import RequestOutput
from dflash_trt.spec.sampling import SamplingParams

__all__ = ["LLM", "BeamSearchParams", "DFlashError", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
