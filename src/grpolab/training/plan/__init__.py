"""The plan of a run: what one step of a config holds in memory and costs in time on a device, before
anything is loaded (`grpolab plan`), and the same check before step 1 of `grpolab train`.

- `shapes`    a decoder's architecture: parameter counts, FLOPs, the published shapes (SHAPES).
- `memory`    the bytes of each phase of a step (resident, generation, reference, update, optimizer).
- `devices`   the devices planned for: cards (CARDS), --memory, this machine, a run's own device.
- `estimate`  a config's plan on a device (its workload and regime, the phases' seconds) and the
              settings that fit; the reference and the lean decoder are decided by the run's own
              functions (grpolab.model.reference.reference_kind, grpolab.engine.native.decoder.lean_decodes).
- `check`     the check `grpolab train` makes before step 1.
- `describe`  a plan as text and as JSON.

This __init__ imports nothing: each caller imports the module it uses.
"""
