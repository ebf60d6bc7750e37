"""Bundles handed to other servers, without torch: a Triton Inference Server model repository
(triton.py) and an ONNX Runtime GenAI folder (genai.py)."""
