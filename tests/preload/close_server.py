"""Server for the close tests (tests/preload_programs.rs): one scenario per connection,
chosen by the connection's first byte. Runs on the kernel or under the shim unchanged.

U: read only that byte, wait for the rest of the request to arrive, close (unread input).
R: read the request line, send 1 MiB, close (everything read).
L: read the request line, send "bye", close (the peer then sends more).
F: read the request line, fork; the child closes its copy and exits without reading; the
   parent then says "go", reads the 100 kB line that follows, replies its SHA-256, closes.
Q: quit. Anything else (a port probe that sends nothing): closed, next.
"""
import hashlib
import os
import socket
import sys
import time

REPLY = bytes((i * 7 + i // 251) & 0xFF for i in range(1 << 20))


def line(c):
    b = b""
    while not b.endswith(b"\n"):
        d = c.recv(65536)
        if not d:
            raise SystemExit("early end of stream")
        b += d
    return b


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((host, port))
    l.listen(8)
    while True:
        c, _ = l.accept()
        mode = c.recv(1)
        if mode == b"U":
            time.sleep(0.3)
            c.close()
        elif mode == b"R":
            line(c)
            c.sendall(REPLY)
            c.close()
        elif mode == b"L":
            line(c)
            c.sendall(b"bye")
            c.close()
        elif mode == b"F":
            line(c)
            pid = os.fork()
            if pid == 0:
                c.close()
                os._exit(0)
            os.waitpid(pid, 0)
            c.sendall(b"go\n")
            data = line(c)
            c.sendall(hashlib.sha256(data).hexdigest().encode())
            c.close()
        elif mode == b"Q":
            c.close()
            return
        else:
            # A readiness probe (connect and close) or an unknown scenario.
            c.close()


main()
