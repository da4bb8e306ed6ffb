"""DeepSpec core library: targets, drafts and the speculative decoding engine.

The library never parses arguments or prints; the stages (`training`, `export`, `service`, `loadtest`) do.
"""

__version__ = "0.1.0"
