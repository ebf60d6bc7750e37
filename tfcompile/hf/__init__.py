"""Hugging Face folders in and out, without transformers: ``tfcompile import`` (importer.py) and
``tfcompile export-hf`` (exporter.py), over one ``Architecture`` per model type (gpt2.py,
llama.py, bert.py, vit.py, t5.py)."""
