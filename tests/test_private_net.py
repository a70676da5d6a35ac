

def test_nothing_of_a_private_kernel_outlives_it(private_kernel):
    """The store host ends with the kernel like every other helper (its pipe closes)."""
    import psutil

    k = private_kernel
    k.ok("%%ddp -n 2\npass")
    k.settle()
    helpers = psutil.Process(k.pid).children(recursive=True)
    assert "nbddp-stores" in [p.name() for p in helpers]
    os.kill(k.pid, 9)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                                              for p in helpers):
        time.sleep(0.1)
    assert not [p.name() for p in helpers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
