"""Kernel peer for the close tests: runs each scenario of close_server.py against
HOST PORT and prints what it saw, one line per scenario."""
import hashlib
import socket
import sys
import time

REPLY = bytes((i * 7 + i // 251) & 0xFF for i in range(1 << 20))
host, port = sys.argv[1], int(sys.argv[2])


def conn():
    return socket.create_connection((host, port), timeout=10)


def read_to_end(c):
    got = b""
    while True:
        d = c.recv(65536)
        if not d:
            return got
        got += d


# A request the server never reads: its close must reset the connection.
c = conn()
c.sendall(b"U" + b"x" * 5000 + b"\n")
try:
    out = "data" if c.recv(100) else "end of stream"
except OSError as e:
    out = type(e).__name__
print("unread:", out, flush=True)
c.close()

# Everything read, then close: all the data, then FIN.
c = conn()
c.sendall(b"R" + b"y" * 1000 + b"\n")
try:
    got = read_to_end(c)
    print("read: fin", len(got), "bytes", "intact" if got == REPLY else "corrupt", flush=True)
except OSError as e:
    print("read:", type(e).__name__, flush=True)
c.close()

# Input after the server's close: the orphaned connection resets.
c = conn()
c.sendall(b"L\n")
got = read_to_end(c)
c.sendall(b"more")
# The reset takes a round trip (and, under the shim, a wakeup of its linger watcher):
# keep poking (bounded) until the socket reports it instead of sleeping a fixed time.
# recv returns end of stream at once until then (the server's FIN arrived).
out = "no reset"
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        c.sendall(b"again")
        c.recv(10)
    except OSError as e:
        out = type(e).__name__
        break
    time.sleep(0.01)
print(f"late: {got.decode()}, then {out}", flush=True)
c.close()

# A forked child closes its copy without reading: not a close of the connection.
c = conn()
c.sendall(b"F\n")
go = b""
while not go.endswith(b"\n"):
    d = c.recv(10)
    if not d:
        break
    go += d
body = b"z" * 100000 + b"\n"
try:
    c.sendall(body)
    digest = read_to_end(c).decode()
    ok = digest == hashlib.sha256(body).hexdigest()
    print("fork:", go.decode().strip(), "digest", "ok" if ok else "differs", "fin", flush=True)
except OSError as e:
    print("fork:", go.decode().strip(), type(e).__name__, flush=True)
c.close()

c = conn()
c.sendall(b"Q")
c.close()
