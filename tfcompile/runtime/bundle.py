"""Bundle manifests: the format version, the graphs' named inputs and outputs, and file hashes.

This module imports no torch: the runtime and the exporter share it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tfcompile.runtime.errors import BundleError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(bundle: Path) -> dict[str, Any]:
    """The manifest of a bundle, after checking its format version and every file's sha256."""
    path = bundle / MANIFEST
    if not path.exists():
        raise BundleError(f"{bundle} is not a tfcompile bundle: it has no {MANIFEST}")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise BundleError(f"{path} is not valid JSON ({e}); export the bundle again") from None
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise BundleError(
            f"{bundle} has bundle format {version!r}, newer than this tfcompile reads "
            f"(format {FORMAT_VERSION}): upgrade tfcompile to load it"
        )
    for name, expected in manifest["files"].items():
        file = bundle / name
        if not file.exists():
            raise BundleError(f"{bundle} is incomplete: {name} is missing")
        if sha256_file(file) != expected:
            raise BundleError(
                f"{file} was changed after export (its sha256 differs from the manifest's); "
                f"export the bundle again"
            )
    return manifest
