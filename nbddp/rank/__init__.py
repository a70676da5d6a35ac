"""Runs inside a rank process: the worker that executes the cell, display() in a rank, the stack
watch, stdin, the user's rendezvous helpers, teardown, and torchrun's rank entry point. Nothing
here imports kernel-side modules."""
