"""Pure rules and data, importable from any process: the launch spec and its checks, the torchrun
environment, device placement, results, summaries and diagnosis. Nothing here starts a process,
opens a pipe or draws anything."""
