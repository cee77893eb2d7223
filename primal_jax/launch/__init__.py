"""How a process is started: nothing here is model or training code.

`primal_jax.launch.host_allocator`: re-execute the current command with tcmalloc or jemalloc preloaded (the
`--allocator` flag of the training binary and of the efficiency benchmark).
"""
