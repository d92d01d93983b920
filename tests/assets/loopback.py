"""The threaded loopback HTTP server every test's stand-in server is built on.

`http.server`'s servers listen with a backlog of 5. When more connections arrive at once than the
accept loop has taken, Linux drops the overflow (TcpExtListenOverflows) and the client's SYN or the
server's SYN-ACK is sent again on TCP's timers: 1 s, then 2, 4, 8, 16. Whether a request is served in
milliseconds or after 31 s then depends on when the accept thread last ran, so a test that opens many
connections together (30 requests held at a barrier, a fleet's concurrent reads) failed on a busy host
by wall time. With a backlog above any test's concurrency every connection waits in the queue instead.
"""

from __future__ import annotations

from http.server import ThreadingHTTPServer


class LoopbackServer(ThreadingHTTPServer):
    """`ThreadingHTTPServer` with a listen backlog no test's burst of connections overflows."""

    request_queue_size = 1024
    daemon_threads = True
