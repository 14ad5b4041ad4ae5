"""Inputs of a pack and of the raw-text reader: files, compressed streams, documents.

Below both the writer (:mod:`wdstream.write`, :mod:`wdstream.ray`) and the raw-text reader
(:mod:`wdstream.read.sources.text`), so neither imports the other to read text.
"""

from wdstream.inputs.compressed import decompressed
from wdstream.inputs.files import INPUT_SUFFIXES, InputFile, InputPosition, expand_inputs
from wdstream.inputs.records import DocumentReader

__all__ = [
    "INPUT_SUFFIXES",
    "DocumentReader",
    "InputFile",
    "InputPosition",
    "decompressed",
    "expand_inputs",
]
