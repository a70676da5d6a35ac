"""Imported only in the forkserver (it is in nbddp.forkserver.preload's list): from then on the forkserver
takes the notebook's modules the kernel offers it (nbddp/forkserver/preload.py)."""
from nbddp.forkserver.preload import serve

serve()
