"""PyTorch modules -> ONNX graphs (``export``), and the proof that onnxruntime computes what
PyTorch does on fresh inputs (``parity``). Tasks declare which of these graphs their bundles hold;
tfcompile.export assembles the bundle."""
