/*
 * epoll_late_kernel_fd: a level-triggered epoll echo server whose engine connections stay
 * readable all the time (it reads at most CHUNK bytes per event and echoes in 4 KiB
 * pieces, so it takes the bytes in slower than the peers send them and the sockets are
 * ready again at every epoll_wait), and a kernel pipe in the same set that becomes
 * readable late, while that traffic flows: a helper thread writes one byte once 256 KiB
 * have been read. The pipe must be reported promptly even though every epoll_wait has engine
 * events to return (under libxwarp_preload.so those come from the shim's user-space
 * ready list, and the kernel, which alone knows about the pipe, is asked only now and
 * then).
 *
 * usage: epoll_late_kernel_fd PORT CONNECTIONS [MAXEVENTS]
 *   MAXEVENTS (default 16) is epoll_wait's buffer; below CONNECTIONS, the readable
 *   connections alone could fill every call's buffer.
 *   Serves CONNECTIONS echo connections until each is closed by its peer, then prints
 *     OK conns=N bytes=B late_us=L live=K waits=W
 *   (L: microseconds between the pipe write and epoll_wait reporting it; K: connections
 *   still open at that moment; W: epoll_wait calls made from the moment the write had
 *   returned up to the one that reported it) and
 *   exits 0. Any unexpected condition prints "FAIL ..." and exits 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXC 64
#define CHUNK 16
#define FLUSH 4096
#define OUTMAX (64 << 10)
#define TRIGGER (256 << 10)

struct conn {
    int fd;
    char out[OUTMAX];
    size_t len, off;
    int rd_eof;
    int want_out;
};

static struct conn conns[MAXC];
static int pipefd[2];
static atomic_int go;
static atomic_llong written_ns; /* before the pipe write */
static atomic_int written;       /* after it returned */

static void fail(const char *what) {
    printf("FAIL %s: %s\n", what, strerror(errno));
    fflush(stdout);
    exit(1);
}

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Waits until the main loop says the traffic flows, then makes the pipe readable. */
static void *late_writer(void *arg) {
    (void)arg;
    while (!atomic_load(&go))
        usleep(200);
    usleep(2000);
    atomic_store(&written_ns, now_ns());
    if (write(pipefd[1], "p", 1) != 1)
        fail("pipe write");
    atomic_store(&written, 1);
    return NULL;
}

static void set_events(int ep, struct conn *c, int out) {
    struct epoll_event ev = {.events = out ? EPOLLOUT : EPOLLIN, .data.ptr = c};
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev) < 0)
        fail("epoll_ctl mod");
    c->want_out = out;
}

static void close_conn(int ep, struct conn *c, int *live) {
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    (*live)--;
}

/* Write what is queued; 1 when all of it went out. */
static int flush_out(struct conn *c) {
    while (c->off < c->len) {
        ssize_t n = write(c->fd, c->out + c->off, c->len - c->off);
        if (n < 0) {
            if (errno == EAGAIN)
                return 0;
            fail("write");
        }
        c->off += (size_t)n;
    }
    c->off = c->len = 0;
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s PORT CONNECTIONS [MAXEVENTS]\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]);
    int want = atoi(argv[2]);
    int maxev = argc == 4 ? atoi(argv[3]) : 16;
    if (maxev < 1 || maxev > 16) {
        fprintf(stderr, "MAXEVENTS must be 1..16\n");
        return 2;
    }
    if (want < 1 || want > MAXC) {
        fprintf(stderr, "CONNECTIONS must be 1..%d\n", MAXC);
        return 2;
    }
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (ls < 0)
        fail("socket");
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0)
        fail("bind");
    if (listen(ls, 64) < 0)
        fail("listen");
    if (pipe2(pipefd, O_NONBLOCK) < 0)
        fail("pipe2");
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        fail("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    ev.data.u64 = 1;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev) < 0)
        fail("epoll_ctl listener");
    ev.data.u64 = 2;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, pipefd[0], &ev) < 0)
        fail("epoll_ctl pipe");
    pthread_t th;
    if (pthread_create(&th, NULL, late_writer, NULL) != 0)
        fail("pthread_create");

    int accepted = 0, live = 0, seen_pipe = 0;
    long long bytes = 0, late_us = -1, waits_between = 0;
    int live_at_pipe = -1;
    struct epoll_event evs[16];
    while (accepted < want || live > 0 || !seen_pipe) {
        int n = epoll_wait(ep, evs, maxev, 5000);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            fail("epoll_wait");
        }
        if (n == 0) {
            printf("FAIL idle 5 s: accepted=%d live=%d pipe=%d bytes=%lld\n", accepted, live,
                   seen_pipe, bytes);
            return 1;
        }
        if (atomic_load(&written) && !seen_pipe)
            waits_between++;
        for (int i = 0; i < n; i++) {
            uint64_t tag = evs[i].data.u64;
            if (tag == 1) {
                for (;;) {
                    int fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
                    if (fd < 0) {
                        if (errno == EAGAIN)
                            break;
                        fail("accept4");
                    }
                    int k = 0;
                    while (k < MAXC && conns[k].fd > 0)
                        k++;
                    if (k == MAXC || accepted == want) {
                        printf("FAIL more connections than %d\n", want);
                        return 1;
                    }
                    struct conn *c = &conns[k];
                    c->fd = fd;
                    c->len = c->off = 0;
                    c->rd_eof = 0;
                    c->want_out = 0;
                    struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) < 0)
                        fail("epoll_ctl conn");
                    accepted++;
                    live++;
                }
                continue;
            }
            if (tag == 2) {
                char b;
                if (read(pipefd[0], &b, 1) != 1)
                    fail("pipe read");
                long long w = atomic_load(&written_ns);
                if (!w) {
                    printf("FAIL pipe readable before it was written\n");
                    return 1;
                }
                late_us = (now_ns() - w) / 1000;
                live_at_pipe = live;
                seen_pipe = 1;
                continue;
            }
            struct conn *c = evs[i].data.ptr;
            if (c->fd < 0)
                continue;
            if (c->want_out) {
                if (flush_out(c)) {
                    if (c->rd_eof) {
                        close_conn(ep, c, &live);
                        continue;
                    }
                    set_events(ep, c, 0);
                }
                continue;
            }
            /* One small read per event: the socket stays readable (level-triggered). */
            ssize_t r = read(c->fd, c->out + c->len, CHUNK);
            if (r < 0) {
                if (errno == EAGAIN)
                    continue;
                fail("read");
            }
            if (r == 0)
                c->rd_eof = 1;
            c->len += (size_t)r;
            bytes += r;
            if (bytes >= TRIGGER)
                atomic_store(&go, 1);
            if (c->len < FLUSH && !c->rd_eof)
                continue;
            if (!flush_out(c)) {
                set_events(ep, c, 1);
                continue;
            }
            if (c->rd_eof)
                close_conn(ep, c, &live);
        }
    }
    pthread_join(th, NULL);
    printf("OK conns=%d bytes=%lld late_us=%lld live=%d waits=%lld\n", accepted, bytes, late_us,
           live_at_pipe, waits_between);
    return 0;
}
