"""Layer 0, the ground: helpers that know nothing of models or training (atomic file writes, process
groups, typed settings fields, type-strict comparison of plain values). Imports no other grpolab layer.
"""
