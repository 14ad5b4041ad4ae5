"""The writer: input documents -> parallel tokenisation -> samples -> tar shards -> ``index.json``."""
