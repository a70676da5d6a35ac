"""The forkserver that ranks and spares are forked from: how the kernel starts and talks to it
(starter, spares), what it imports first (preload), and the optional private network it lives in."""
