/*
 * sockopts: socket options that the shim applies on engine connections.
 *
 * usage: sockopts HOST PORT
 * The peer (a kernel python server) answers three connections in order:
 *   1. echo: echoes until end of stream.
 *   2. reset: reads; reports "peer: reset" when the read fails with ECONNRESET.
 *   3. vanish: blackholes the route back to us, so our keep-alive probes go unanswered.
 * This program:
 *   1. SO_RCVBUF 8192 / SO_SNDBUF 16384 before connect -> getsockopt reports 16384 /
 *      32768 (doubled, like Linux); 50 x 64-byte ping-pong; TCP_INFO: state
 *      ESTABLISHED, 0 < rtt < 1 s, rto >= 200 ms, snd_mss plausible, bytes_acked ==
 *      bytes_received == 3200, rcv_wnd <= 16384; prints them.
 *   2. SO_LINGER {1, 0}, close -> the peer sees a reset.
 *   3. SO_KEEPALIVE with TCP_KEEPIDLE 1, TCP_KEEPINTVL 1, TCP_KEEPCNT 2 -> a blocking
 *      recv fails with ETIMEDOUT after ~3 s of silence; prints the elapsed time.
 * Prints "OK ..." lines and exits 0, or "FAIL ..." and exits 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int fail(const char *what) {
    printf("FAIL %s: %s\n", what, strerror(errno));
    fflush(stdout);
    exit(1);
}

static int check(int cond, const char *what) {
    if (!cond) {
        printf("FAIL %s\n", what);
        fflush(stdout);
        exit(1);
    }
    return 0;
}

static int dial(const char *host, int port, int rcvbuf, int sndbuf) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0)
        fail("socket");
    if (rcvbuf > 0 && setsockopt(s, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf) < 0)
        fail("SO_RCVBUF");
    if (sndbuf > 0 && setsockopt(s, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf) < 0)
        fail("SO_SNDBUF");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, host, &a.sin_addr);
    if (connect(s, (struct sockaddr *)&a, sizeof a) < 0)
        fail("connect");
    return s;
}

static int get_int(int s, int level, int name) {
    int v = -1;
    socklen_t len = sizeof v;
    if (getsockopt(s, level, name, &v, &len) < 0)
        fail("getsockopt");
    return v;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: sockopts HOST PORT\n");
        return 2;
    }
    const char *host = argv[1];
    int port = atoi(argv[2]);

    /* 1. buffers and TCP_INFO */
    int s = dial(host, port, 8192, 16384);
    int rcv = get_int(s, SOL_SOCKET, SO_RCVBUF), snd = get_int(s, SOL_SOCKET, SO_SNDBUF);
    printf("OK buffers rcvbuf=%d sndbuf=%d\n", rcv, snd);
    check(rcv == 16384 && snd == 32768, "SO_RCVBUF/SO_SNDBUF not doubled");
    char buf[64], got[64];
    for (int i = 0; i < 50; i++) {
        memset(buf, 'a' + i % 26, sizeof buf);
        if (send(s, buf, sizeof buf, 0) != (ssize_t)sizeof buf)
            fail("send");
        size_t n = 0;
        while (n < sizeof got) {
            ssize_t r = recv(s, got + n, sizeof got - n, 0);
            if (r <= 0)
                fail("recv echo");
            n += r;
        }
        check(memcmp(buf, got, sizeof buf) == 0, "echo differs");
    }
    /* Room beyond this header's struct (it may end at tcpi_snd_wnd): tcpi_rcv_wnd
     * follows tcpi_snd_wnd in newer kernels. */
    union {
        struct tcp_info ti;
        unsigned char raw[256];
    } u;
    memset(&u, 0xff, sizeof u);
    socklen_t tlen = sizeof u.raw;
    if (getsockopt(s, IPPROTO_TCP, TCP_INFO, &u, &tlen) < 0)
        fail("TCP_INFO");
    struct tcp_info ti = u.ti;
    unsigned int rcv_wnd;
    size_t rcv_wnd_off = offsetof(struct tcp_info, tcpi_snd_wnd) + 4;
    memcpy(&rcv_wnd, u.raw + rcv_wnd_off, 4);
    printf("OK tcp_info len=%u state=%u rto=%u rtt=%u rttvar=%u snd_mss=%u rcv_mss=%u "
           "unacked=%u bytes_acked=%llu bytes_received=%llu bytes_sent=%llu rcv_wnd=%u "
           "rcv_space=%u options=%#x\n",
           tlen, ti.tcpi_state, ti.tcpi_rto, ti.tcpi_rtt, ti.tcpi_rttvar, ti.tcpi_snd_mss,
           ti.tcpi_rcv_mss, ti.tcpi_unacked, (unsigned long long)ti.tcpi_bytes_acked,
           (unsigned long long)ti.tcpi_bytes_received,
           (unsigned long long)ti.tcpi_bytes_sent, rcv_wnd, ti.tcpi_rcv_space,
           ti.tcpi_options);
    check(tlen >= 104, "TCP_INFO too short");
    check(ti.tcpi_state == 1 /* TCP_ESTABLISHED */, "tcpi_state");
    check(ti.tcpi_rtt > 0 && ti.tcpi_rtt < 1000000, "tcpi_rtt");
    check(ti.tcpi_rto >= 200000 && ti.tcpi_rto <= 60000000, "tcpi_rto");
    check(ti.tcpi_snd_mss >= 536 && ti.tcpi_snd_mss <= 1460, "tcpi_snd_mss");
    check(ti.tcpi_bytes_acked == 3200 && ti.tcpi_bytes_received == 3200, "byte counters");
    check(ti.tcpi_unacked == 0, "tcpi_unacked");
    check(tlen > rcv_wnd_off && rcv_wnd <= 16384, "tcpi_rcv_wnd above SO_RCVBUF");
    if (shutdown(s, SHUT_WR) < 0)
        fail("shutdown");
    while (recv(s, got, sizeof got, 0) > 0) {
    }
    close(s);

    /* 2. linger 0 -> RST */
    s = dial(host, port, 0, 0);
    if (send(s, "x", 1, 0) != 1)
        fail("send before reset");
    usleep(100000);
    struct linger l = {.l_onoff = 1, .l_linger = 0};
    if (setsockopt(s, SOL_SOCKET, SO_LINGER, &l, sizeof l) < 0)
        fail("SO_LINGER");
    struct linger back;
    socklen_t llen = sizeof back;
    if (getsockopt(s, SOL_SOCKET, SO_LINGER, &back, &llen) < 0)
        fail("get SO_LINGER");
    check(back.l_onoff == 1 && back.l_linger == 0, "SO_LINGER readback");
    close(s);
    printf("OK linger0 closed\n");

    /* 3. keep-alive against a peer that vanishes */
    s = dial(host, port, 0, 0);
    int on = 1, idle = 1, intvl = 1, cnt = 2;
    if (setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on) < 0 ||
        setsockopt(s, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle) < 0 ||
        setsockopt(s, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl) < 0 ||
        setsockopt(s, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt) < 0)
        fail("keepalive options");
    check(get_int(s, SOL_SOCKET, SO_KEEPALIVE) == 1 && get_int(s, IPPROTO_TCP, TCP_KEEPIDLE) == 1 &&
              get_int(s, IPPROTO_TCP, TCP_KEEPINTVL) == 1 && get_int(s, IPPROTO_TCP, TCP_KEEPCNT) == 2,
          "keepalive readback");
    /* The peer says "gone" once its route back to us is blackholed. */
    ssize_t r = recv(s, got, 4, MSG_WAITALL);
    check(r == 4 && memcmp(got, "gone", 4) == 0, "peer did not announce the blackhole");
    double t0 = now();
    r = recv(s, got, sizeof got, 0);
    double took = now() - t0;
    int e = errno;
    printf("OK keepalive recv=%zd errno=%s after %.2f s\n", r, strerror(e), took);
    check(r < 0 && e == ETIMEDOUT, "keep-alive did not time out with ETIMEDOUT");
    check(took >= 2.0 && took < 8.0, "keep-alive timing");
    int so_error = get_int(s, SOL_SOCKET, SO_ERROR);
    printf("OK done so_error=%d\n", so_error);
    close(s);
    fflush(stdout);
    return 0;
}
