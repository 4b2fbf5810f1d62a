"""Facts derived from the extracted structure, between extraction and matching: shapes, ranks and
which axis is which (engine.analysis.shapes)."""

from engine.analysis.shapes import Axis, Shape, ShapeFacts

__all__ = ["Axis", "Shape", "ShapeFacts"]
