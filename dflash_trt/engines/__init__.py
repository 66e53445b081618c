"""Engine builders (TensorRT, TensorRT-RTX, ONNX Runtime) and the engine bundle manifest. Not built yet."""
