"""What the REST request modules (decode, inputs) and the encoder share, in a module of
its own so that neither direction imports the other."""

from __future__ import annotations

Buffer = bytes | bytearray | memoryview

HEADER_LENGTH_HEADER = "Inference-Header-Content-Length"
