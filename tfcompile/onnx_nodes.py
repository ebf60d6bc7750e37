"""Walking an ONNX graph's nodes (onnx alone: export, optimize and the runtime's loader share it
without needing each other's dependencies)."""

from __future__ import annotations

from collections.abc import Iterator

import onnx


def graph_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """A graph's nodes and, after each, those of the subgraphs its attributes hold, at any depth."""
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for subgraph in [*([attribute.g] if attribute.HasField("g") else []), *attribute.graphs]:
                yield from graph_nodes(subgraph)
