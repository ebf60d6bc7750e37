"""Hugging Face folders in and out, without transformers: ``tfcompile import`` (importer.py) and
``tfcompile export-hf`` (exporter.py), over one ``Architecture`` per family of model types, each
in its own module (families.py lists them)."""
