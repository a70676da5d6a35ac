"""Pure parts of the private network's fail-closed check (nbddp/forkserver/storehost.py): a launch
is refused, in one line saying why, unless the store host and the forkserver share a network
that is not the kernel's, and the forkserver entered it."""
from nbddp.forkserver.storehost import not_private, refusal

KERNEL, PRIVATE, OTHER = "net:[4026531840]", "net:[4026532100]", "net:[4026532200]"


def test_private_only_where_host_and_forkserver_share_a_network_other_than_the_kernels():
    assert not_private(PRIVATE, "", PRIVATE, KERNEL) == ""
    assert not_private(PRIVATE, "", None, KERNEL) == ""  # the forkserver ended: the ranks check
    assert "the forkserver could not" in not_private(KERNEL, "the forkserver could not enter one: x", KERNEL, KERNEL)
    assert "hosting the stores is on this kernel's own network" in not_private(KERNEL, "", PRIVATE, KERNEL)
    assert "hosting the stores is on this kernel's own network" in not_private(None, "", PRIVATE, KERNEL)
    assert "the forkserver is on this kernel's own network" in not_private(PRIVATE, "", KERNEL, KERNEL)
    assert "are in different networks" in not_private(PRIVATE, "", OTHER, KERNEL)


def test_the_refusal_is_one_line_that_says_why_and_what_to_do():
    line = refusal("the forkserver could not enter one: unshare: Operation not permitted")
    assert "\n" not in line and line.startswith("%%ddp: ")
    assert "NBDDP_PRIVATE_NET=1" in line and "Operation not permitted" in line
    assert "no rank was started" in line and "NBDDP_PRIVATE_NET=0" in line
