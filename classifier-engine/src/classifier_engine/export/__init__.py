"""Ship the model: fp32 ONNX, int8 ONNX and a torch.export program, each checked and judged on the test split."""
