/* An engine *client* connection inherited over fork, used by the child with kernel calls
 * (through the parent's relay, see preload/src/fork.rs).
 *
 * usage: fork_client PEER_IP PORT FILE
 * Parent: connect (engine), TCP_NODELAY, send "hello-from-parent\n", fork, close its copy
 * at once, wait for the child, exit (the shim's exit hook lets the relay finish).
 * Child: its own epoll set waits for the peer's "send\n" (O_NONBLOCK read), checks
 * SO_DOMAIN, getpeername and TCP_NODELAY, sendfile()s FILE, shutdown(SHUT_WR), reads to
 * end of stream, exit(0).
 * Prints "OK child=0 sent=N" on success, "FAIL <what>" otherwise. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void fail(const char *what) {
    printf("FAIL %s: %s\n", what, strerror(errno));
    fflush(stdout);
    _exit(1);
}

static int child(int fd, const char *file, int port) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) fail("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = fd};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) fail("epoll_ctl");
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) fail("O_NONBLOCK");
    char req[64];
    size_t got = 0;
    while (got < 5) {
        struct epoll_event out;
        int n = epoll_wait(ep, &out, 1, 10000);
        if (n <= 0) fail("epoll_wait (no request)");
        ssize_t k = read(fd, req + got, sizeof req - got);
        if (k < 0 && errno == EAGAIN) continue;
        if (k <= 0) fail("read request");
        got += (size_t)k;
    }
    if (memcmp(req, "send\n", 5) != 0) {
        errno = EPROTO;
        fail("request");
    }
    int v = 0;
    socklen_t len = sizeof v;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &len) < 0 || v != AF_INET) fail("SO_DOMAIN");
    len = sizeof v;
    if (getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &len) < 0 || v != 1) fail("TCP_NODELAY");
    struct sockaddr_in peer;
    socklen_t plen = sizeof peer;
    if (getpeername(fd, (struct sockaddr *)&peer, &plen) < 0 || ntohs(peer.sin_port) != port)
        fail("getpeername");
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0) fail("blocking");
    int in = open(file, O_RDONLY);
    if (in < 0) fail("open");
    struct stat st;
    if (fstat(in, &st) < 0) fail("fstat");
    off_t off = 0;
    while (off < st.st_size) {
        ssize_t k = sendfile(fd, in, &off, (size_t)(st.st_size - off));
        if (k <= 0) fail("sendfile");
    }
    if (shutdown(fd, SHUT_WR) < 0) fail("shutdown");
    char buf[256];
    for (;;) {
        ssize_t k = read(fd, buf, sizeof buf);
        if (k == 0) break;
        if (k < 0) fail("read to end of stream");
    }
    close(fd);
    printf("child sent=%lld\n", (long long)off);
    fflush(stdout);
    exit(0);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: fork_client PEER_IP PORT FILE\n");
        return 2;
    }
    int port = atoi(argv[2]);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) fail("address");
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) fail("connect");
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) fail("nodelay");
    const char *hello = "hello-from-parent\n";
    if (write(fd, hello, strlen(hello)) != (ssize_t)strlen(hello)) fail("write hello");
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid == 0) return child(fd, argv[3], port);
    close(fd);
    int status = 0;
    if (waitpid(pid, &status, 0) < 0) fail("waitpid");
    printf("OK child=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    return 0;
}
