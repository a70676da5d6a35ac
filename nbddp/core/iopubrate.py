"""What a notebook server lets through to the browser, mirrored, so text output is paced below it.

jupyter_server counts, per kernel connection over a sliding ``rate_limit_window``, iopub
messages (``iopub_msg_rate_limit``) and stream bytes (``iopub_data_rate_limit``); above either
rate it drops every counted message, the end-of-cell report and the error included, until the
rate is back under a share of it (``ZMQChannelsWebsocketConnection._limit_rate``); its counters
reset when the kernel goes idle. ``RateWindow`` keeps the same window for what nbddp sends, at a
share of the server's defaults (the rest is margin). Pure: times are passed in."""
from __future__ import annotations

import json
from collections import deque

SERVER_DATA_RATE = 1_000_000   # jupyter_server's iopub_data_rate_limit default, bytes/s
SERVER_MSG_RATE = 1_000        # its iopub_msg_rate_limit default, messages/s
SERVER_WINDOW_S = 3.0          # its rate_limit_window default
SHARE = 0.5                    # of those rates nbddp's own output may use


def stream_bytes(text: str) -> int:
    """What ``text`` weighs in a stream message as the server counts it: its JSON form
    (``\\n`` two bytes, an escape code's ESC six, a CJK character three)."""
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass"))


class RateWindow:
    """Bytes and messages sent in the last ``window_s`` seconds, against a budget of
    ``share`` × the server's rates × the window."""

    def __init__(self, data_rate: float = SERVER_DATA_RATE, msg_rate: float = SERVER_MSG_RATE,
                 window_s: float = SERVER_WINDOW_S, share: float = SHARE) -> None:
        self.window_s = window_s
        self.max_bytes = data_rate * window_s * share
        self.max_msgs = msg_rate * window_s * share
        self._sent: deque[tuple[float, float, int]] = deque()   # (time, bytes, messages)
        self.bytes: float = 0
        self.msgs = 0

    def _expire(self, now: float) -> None:
        sent = self._sent
        while sent and sent[0][0] <= now - self.window_s:
            _, b, m = sent.popleft()
            self.bytes -= b
            self.msgs -= m

    def room(self, now: float) -> float:
        """Bytes that may be sent now (0 once the window is full)."""
        self._expire(now)
        if self.msgs >= self.max_msgs:
            return 0
        return max(0, self.max_bytes - self.bytes)

    def fits(self, now: float, nbytes: float, msgs: int = 1) -> bool:
        self._expire(now)
        return self.bytes + nbytes <= self.max_bytes and self.msgs + msgs <= self.max_msgs

    def charge(self, now: float, nbytes: float, msgs: int = 1) -> None:
        """``nbytes`` of stream text and ``msgs`` messages were sent at ``now``."""
        self._sent.append((now, nbytes, msgs))
        self.bytes += nbytes
        self.msgs += msgs

    def wait_for(self, now: float, nbytes: float, msgs: int = 1) -> float:
        """Seconds until ``nbytes`` and ``msgs`` more fit (0: now); at most the window."""
        self._expire(now)
        need_b = self.bytes + nbytes - self.max_bytes
        need_m = self.msgs + msgs - self.max_msgs
        if need_b <= 0 and need_m <= 0:
            return 0.0
        freed_b: float = 0
        freed_m = 0
        for t, b, m in self._sent:   # oldest first: the moment enough of them has expired
            freed_b += b
            freed_m += m
            if freed_b >= need_b and freed_m >= need_m:
                return max(0.0, t + self.window_s - now)
        return self.window_s
