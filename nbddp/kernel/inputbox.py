"""The notebook's input box for a rank's prompt: an ``input_request`` on the kernel's stdin
channel, as ``input()`` in a plain cell sends, answered without blocking the launch.

ipykernel's own ``raw_input`` waits for the reply deaf to everything else, but a launch must go on
(other ranks' output, the stop button), so the request is sent here and the reply looked for at
each turn of the supervisor's loop (``answer``, which never waits). It goes to the front end of the
cell running now, only where that front end can answer (``allow_stdin``: not papermill, nbclient
or ``nbddp.run`` outside a kernel): ``InputBox.for_this_cell()`` is None otherwise."""
from __future__ import annotations

import sys
import threading


class InputBox:
    """The stdin channel of the front end that sent the running cell."""

    def __init__(self, kernel, ident, parent):
        self.kernel, self.ident, self.parent = kernel, ident, parent
        self.waiting: str | None = None  # the msg_id of the input_request shown now

    @classmethod
    def for_this_cell(cls) -> InputBox | None:
        """The running cell's front end, if it can answer input requests; else None (also for a
        launch from another thread: the cell's request, and the stop button, are the main thread's)."""
        if threading.current_thread() is not threading.main_thread():
            return None
        try:
            from IPython import get_ipython
        except ImportError:
            return None
        kernel = getattr(get_ipython(), "kernel", None)
        if kernel is None or not getattr(kernel, "_allow_stdin", False) \
                or getattr(kernel, "stdin_socket", None) is None or getattr(kernel, "session", None) is None:
            return None
        try:
            parent = kernel.get_parent("shell")
            box = cls(kernel, kernel._parent_ident["shell"], parent)
        except Exception:  # an ipykernel without these: no input box, as under papermill
            return None
        return box if parent and parent.get("header") else None

    def ask(self, prompt: str) -> None:
        """Show ``prompt`` in the input box (what the kernel printed before goes out first)."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        self._discard_replies()  # to a request the stop button had ended
        sent = self.kernel.session.send(self.kernel.stdin_socket, "input_request",
                                        {"prompt": prompt, "password": False}, self.parent, ident=self.ident)
        self.waiting = sent["header"]["msg_id"]

    def answer(self) -> str | None:
        """The line typed for the request shown now, once it has come; never waits."""
        import zmq

        if self.waiting is None:
            return None
        session, socket = self.kernel.session, self.kernel.stdin_socket
        while socket.poll(0, zmq.POLLIN):
            try:
                _, reply = session.recv(socket, mode=zmq.NOBLOCK)
            except Exception:  # a message that is not a reply: ignored, as ipykernel does
                continue
            # the reply to this request (jupyter_client's own input() names no parent; ipykernel
            # takes any: stale ones were discarded before the request)
            if reply and reply.get("msg_type", reply.get("header", {}).get("msg_type")) == "input_reply" \
                    and reply.get("parent_header", {}).get("msg_id", self.waiting) in (self.waiting, None):
                self.waiting = None
                value = reply.get("content", {}).get("value", "")
                return value if isinstance(value, str) else str(value)
        return None

    def cancel(self) -> None:
        """No answer is wanted any more (the rank ended, the launch stops)."""
        self.waiting = None

    def _discard_replies(self) -> None:
        import zmq

        socket = self.kernel.stdin_socket
        while socket.poll(0, zmq.POLLIN):
            try:
                socket.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:
                break
