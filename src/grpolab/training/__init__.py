"""Layer 6, the run: settings (Config), the Run a step reads, the step itself (collect -> reference ->
shape -> advantages -> update), the loop around it (trainer), checkpoints, stop signals, metrics and
diagnostics.
"""
