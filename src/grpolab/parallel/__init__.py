"""Layer 4, more than one process: torch.distributed data parallelism, FSDP2 sharding hooks and the
CPU allocator setting. Imports the model layer (to find the layers it shards), never training code.
"""
