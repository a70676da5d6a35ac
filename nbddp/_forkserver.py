"""Imported only in the forkserver (it is in nbddp.preload's list): from then on the forkserver
takes the notebook's modules the kernel offers it (nbddp/preload.py)."""
from .preload import serve

serve()
