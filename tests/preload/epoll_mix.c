/*
 * epoll_mix: an edge-triggered echo server whose epoll set mixes xwarp descriptors (the
 * TCP listener and connections, when run under libxwarp_preload.so) with kernel ones (a
 * pipe fed by a helper thread, a timerfd, and a UDP socket that stays on the kernel).
 *
 * usage: epoll_mix PORT CONNECTIONS
 *   Serves CONNECTIONS echo connections (read until EAGAIN, write back with EPOLLOUT when
 *   the send side is full), then prints one line
 *     OK conns=N bytes=B pipe=P timer=T udp=U second_set=S oneshot=O
 *   and exits 0. Any unexpected condition prints "FAIL ..." and exits 1.
 *   The listener is also registered in a second epoll set (level-triggered) to check that
 *   one descriptor in several sets is reported by each, and in a third set with
 *   EPOLLONESHOT (reported once, silent until EPOLL_CTL_MOD re-arms it).
 *   UDP: a datagram sent to 127.0.0.1:PORT is echoed (kernel fallback for UDP).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#define MAXC 256
#define BUFSZ (1 << 20)

struct conn {
    int fd;
    char *buf; /* bytes read, not yet echoed */
    size_t len, off;
    int rd_eof;
};

static struct conn conns[MAXC];
static int pipefd[2];

static void fail(const char *what) {
    printf("FAIL %s: %s\n", what, strerror(errno));
    fflush(stdout);
    exit(1);
}

static void *pipe_feeder(void *arg) {
    (void)arg;
    for (int i = 0; i < 5; i++) {
        usleep(20000);
        if (write(pipefd[1], "p", 1) != 1)
            fail("pipe write");
    }
    return NULL;
}

static struct conn *conn_of(int fd) {
    for (int i = 0; i < MAXC; i++)
        if (conns[i].fd == fd)
            return &conns[i];
    return NULL;
}

/* Flush pending bytes; returns 0 when all sent, 1 when EAGAIN, -1 on error. */
static int flush(struct conn *c) {
    while (c->off < c->len) {
        ssize_t n = send(c->fd, c->buf + c->off, c->len - c->off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN)
                return 1;
            return -1;
        }
        c->off += (size_t)n;
    }
    c->off = c->len = 0;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PORT CONNECTIONS\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]);
    int want = atoi(argv[2]);
    for (int i = 0; i < MAXC; i++)
        conns[i].fd = -1;

    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (ls < 0)
        fail("socket");
    int one = 1;
    if (setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0)
        fail("SO_REUSEADDR");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0)
        fail("bind");
    if (listen(ls, 64) < 0)
        fail("listen");

    /* Kernel descriptors: UDP on loopback (never accelerated), a pipe, a timerfd. */
    int us = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in ua = {.sin_family = AF_INET, .sin_port = htons(port)};
    ua.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (us < 0 || bind(us, (struct sockaddr *)&ua, sizeof ua) < 0)
        fail("udp bind");
    if (pipe2(pipefd, O_NONBLOCK) < 0)
        fail("pipe2");
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
    struct itimerspec its = {.it_interval = {0, 50000000}, .it_value = {0, 50000000}};
    if (tfd < 0 || timerfd_settime(tfd, 0, &its, NULL) < 0)
        fail("timerfd");

    int ep = epoll_create1(EPOLL_CLOEXEC);
    int ep2 = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0 || ep2 < 0)
        fail("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.fd = ls};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev) < 0)
        fail("epoll_ctl listener");
    struct epoll_event ev2 = {.events = EPOLLIN, .data.fd = ls};
    if (epoll_ctl(ep2, EPOLL_CTL_ADD, ls, &ev2) < 0)
        fail("epoll_ctl listener set 2");
    /* A third set holds the listener with EPOLLONESHOT: one report, then silence until
     * EPOLL_CTL_MOD re-arms it. */
    int ep3 = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev3 = {.events = EPOLLIN | EPOLLONESHOT, .data.fd = ls};
    if (ep3 < 0 || epoll_ctl(ep3, EPOLL_CTL_ADD, ls, &ev3) < 0)
        fail("epoll_ctl listener set 3");
    int armed = 1, oneshot = 0, listener_events = 0;
    int kfds[3] = {pipefd[0], tfd, us};
    for (int i = 0; i < 3; i++) {
        struct epoll_event e = {.events = EPOLLIN | EPOLLET, .data.fd = kfds[i]};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, kfds[i], &e) < 0)
            fail("epoll_ctl kernel fd");
    }
    pthread_t th;
    pthread_create(&th, NULL, pipe_feeder, NULL);

    printf("READY\n");
    fflush(stdout);

    int accepted = 0, closed = 0, second_set = 0;
    long bytes = 0, pipes = 0, timers = 0, udps = 0;
    char tmp[65536];
    struct epoll_event evs[64];
    while (closed < want || pipes < 5) {
        int n = epoll_wait(ep, evs, 64, 10000);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            fail("epoll_wait");
        }
        if (n == 0) {
            printf("FAIL timeout accepted=%d closed=%d pipe=%ld\n", accepted, closed, pipes);
            return 1;
        }
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            uint32_t e = evs[i].events;
            if (fd == ls) {
                /* The same listener in the level-triggered second set must be ready too
                 * (unless another accept loop already emptied it). */
                struct epoll_event e2[4];
                if (epoll_wait(ep2, e2, 4, 0) > 0 && e2[0].data.fd == ls)
                    second_set++;
                int n3 = epoll_wait(ep3, e2, 4, 0);
                if (!armed && n3 != 0) {
                    printf("FAIL EPOLLONESHOT reported a disarmed descriptor\n");
                    return 1;
                }
                if (armed && n3 == 1) {
                    oneshot++;
                    armed = 0;
                }
                if (++listener_events % 2 == 0 && !armed) {
                    if (epoll_ctl(ep3, EPOLL_CTL_MOD, ls, &ev3) < 0)
                        fail("epoll_ctl MOD set 3");
                    armed = 1;
                }
                for (;;) {
                    int c = accept4(ls, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (c < 0) {
                        if (errno == EAGAIN)
                            break;
                        fail("accept4");
                    }
                    struct conn *slot = conn_of(-1);
                    if (!slot)
                        fail("too many connections");
                    slot->fd = c;
                    slot->buf = malloc(BUFSZ);
                    slot->len = slot->off = 0;
                    slot->rd_eof = 0;
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct epoll_event ce = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                                             .data.fd = c};
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce) < 0)
                        fail("epoll_ctl conn");
                    accepted++;
                }
            } else if (fd == pipefd[0]) {
                while (read(pipefd[0], tmp, sizeof tmp) > 0)
                    pipes++;
            } else if (fd == tfd) {
                uint64_t exp;
                while (read(tfd, &exp, 8) == 8)
                    timers += (long)exp;
            } else if (fd == us) {
                struct sockaddr_in from;
                socklen_t fl = sizeof from;
                ssize_t k;
                while ((k = recvfrom(us, tmp, sizeof tmp, 0, (struct sockaddr *)&from, &fl)) > 0) {
                    sendto(us, tmp, (size_t)k, 0, (struct sockaddr *)&from, fl);
                    udps++;
                }
            } else {
                struct conn *c = conn_of(fd);
                if (!c)
                    continue;
                if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
                    /* Edge-triggered: read until EAGAIN (or the buffer is full). */
                    while (!c->rd_eof && c->len < BUFSZ) {
                        ssize_t k = recv(fd, c->buf + c->len, BUFSZ - c->len, 0);
                        if (k > 0) {
                            c->len += (size_t)k;
                            bytes += k;
                        } else if (k == 0) {
                            c->rd_eof = 1;
                        } else if (errno == EAGAIN) {
                            break;
                        } else {
                            fail("recv");
                        }
                    }
                }
                int r = flush(c);
                if (r < 0)
                    fail("send");
                /* A full buffer with everything flushed: read more now (no new edge
                 * would come for bytes already announced). */
                if (r == 0 && !c->rd_eof) {
                    ssize_t k;
                    while ((k = recv(fd, c->buf, BUFSZ, 0)) > 0) {
                        c->len = (size_t)k;
                        bytes += k;
                        if (flush(c) != 0)
                            break;
                    }
                    if (k == 0)
                        c->rd_eof = 1;
                }
                if (c->rd_eof && c->len == 0) {
                    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
                    close(fd);
                    free(c->buf);
                    c->fd = -1;
                    closed++;
                }
            }
        }
    }
    pthread_join(th, NULL);
    printf("OK conns=%d bytes=%ld pipe=%ld timer=%ld udp=%ld second_set=%d oneshot=%d\n", closed, bytes,
           pipes, timers, udps, second_set, oneshot);
    return 0;
}
