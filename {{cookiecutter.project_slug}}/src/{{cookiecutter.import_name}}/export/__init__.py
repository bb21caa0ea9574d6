"""Ship the model: FLOPs and parameter counts, ONNX export verified with onnxruntime, a model card."""
