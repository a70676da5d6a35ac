"""Kernel side: the process sources that run a cell's ranks (fresh forked ranks, the pool,
torchrun's agent, Slurm's srun) and the supervisor that decides when a launch ends."""
