"""Layer 0: errors, specs, atomic writes, seed derivation, progress. Imports nothing of stoker."""
