"""The on-disk format, pure functions only: tar members, msgpack samples, sidecars, ``index.json``."""
