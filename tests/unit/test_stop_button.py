"""The stop button from the moment the kernel takes a message (nbddp/magic.py's hooks on the
kernel), with a real IPython shell and ipykernel's own hook: no moment where Python's handler is
installed outside the message handler (a SIGINT there ended the kernel: ipykernel's event loop
takes KeyboardInterrupt for Ctrl-C in a terminal and returns), and an interrupt that came before
a plain cell began is that cell's KeyboardInterrupt, with a reply."""
import asyncio
import signal

import pytest
from ipykernel.kernelbase import Kernel as IPyKernel
from IPython.core.interactiveshell import InteractiveShell

from nbddp.magic import install_interrupt_line


class KernelHooks:
    """ipykernel's pre/post handler hooks (its own code) and a do_execute that runs the cell in
    the shell as ipykernel's does, returning the reply's status."""

    pre_handler_hook = IPyKernel.pre_handler_hook
    post_handler_hook = IPyKernel.post_handler_hook

    def __init__(self, shell):
        self.shell = shell

    async def do_execute(self, code, *args, **kwargs):
        result = self.shell.run_cell(code, store_history=False)
        return {"status": "ok" if result.success else "error",
                "ename": type(result.error_in_exec).__name__ if result.error_in_exec else None}


@pytest.fixture
def shell():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a kernel's idle handler
    sh = InteractiveShell()
    sh.kernel = KernelHooks(sh)
    install_interrupt_line(sh)
    yield sh
    signal.signal(signal.SIGINT, previous)


def installed_during(call) -> list:
    """Every SIGINT handler ``call`` installs, in order."""
    seen, real = [], signal.signal

    def recording(signum, handler):
        if signum == signal.SIGINT:
            seen.append(handler)
        return real(signum, handler)

    signal.signal = recording
    try:
        call()
    finally:
        signal.signal = real
    return seen


def test_taking_a_message_never_installs_pythons_handler_outside_the_handler(shell):
    installed = installed_during(shell.kernel.pre_handler_hook)
    assert installed and signal.default_int_handler not in installed, installed
    signal.raise_signal(signal.SIGINT)  # counted, not raised
    shell.kernel.post_handler_hook()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # the idle handler again


def test_an_interrupt_before_a_plain_cell_began_is_its_keyboard_interrupt_with_a_reply(shell):
    shell.kernel.pre_handler_hook()
    signal.raise_signal(signal.SIGINT)  # the stop button, before the cell's code began
    reply = asyncio.run(shell.kernel.do_execute("ran = True"))
    shell.kernel.post_handler_hook()
    assert reply == {"status": "error", "ename": "KeyboardInterrupt"}
    assert "ran" not in shell.user_ns
    shell.kernel.pre_handler_hook()  # the next cell runs as usual
    assert asyncio.run(shell.kernel.do_execute("ran = True"))["status"] == "ok"
    shell.kernel.post_handler_hook()
    assert shell.user_ns["ran"] is True and shell.ast_transformers == []
