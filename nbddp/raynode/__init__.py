"""``--launcher ray``'s processes on the Ray side: the driver the kernel starts (driver.py) and the
actor it places on each node (nodeagent.py)."""
