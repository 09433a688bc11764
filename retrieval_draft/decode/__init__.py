"""The decode loop (``engine``), token trees (``tree``) and verification (``verify``): token ids only."""
