/* A thread spinning in epoll_wait must leave its core to another runnable thread.
 *
 * Under the shim in inline mode (XWARP_MODE=inline) an epoll_wait on a set holding an
 * engine socket spins for XWARP_SPIN_US, running engine iterations, before it blocks. A
 * spin that never gives the core away competes as an equal with a thread that needs that
 * core (a local client the spinner's transmit just woke, the engine's keeper): the
 * scheduler splits the core between them, and the other thread waits while the spinner
 * finds nothing to do. redis-benchmark against an inline redis-server lost half its rate
 * that way (preload/README.md).
 *
 * Both threads are pinned to one CPU. The helper thread is always runnable (it counts in
 * a loop); the main thread calls epoll_wait ROUNDS times with a timeout of TIMEOUT_MS on
 * a set holding only an engine listener nobody connects to (with XWARP_SPIN_US at least
 * the timeout the whole call spins). Each thread's CPU time over that stretch is printed:
 * "OK rounds=N cpu=C spinner_us=S helper_us=H". A spin that yields on every round gets a
 * small share (its rounds between the helper's time slices); one that keeps the core gets
 * about half.
 *
 * usage: inline_spin_yields PORT ROUNDS TIMEOUT_MS
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static atomic_int stop, started;
static int64_t helper_cpu_ns;
static int cpu;

static int64_t ns_of(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "FAIL %s: %s\n", what, strerror(errno));
    exit(1);
}

static void pin(int c) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(c, &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
        fprintf(stderr, "FAIL pin to cpu %d\n", c);
        exit(1);
    }
}

static void *helper(void *arg) {
    (void)arg;
    pin(cpu);
    volatile uint64_t count = 0;
    atomic_store(&started, 1);
    int64_t t0 = ns_of(CLOCK_THREAD_CPUTIME_ID);
    while (!atomic_load_explicit(&stop, memory_order_relaxed))
        count++;
    helper_cpu_ns = ns_of(CLOCK_THREAD_CPUTIME_ID) - t0;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s PORT ROUNDS TIMEOUT_MS\n", argv[0]);
        return 2;
    }
    int port = atoi(argv[1]), rounds = atoi(argv[2]), timeout_ms = atoi(argv[3]);
    if (port <= 0 || port > 65535 || rounds <= 0 || rounds > 10000 || timeout_ms <= 0) {
        fprintf(stderr, "FAIL bad arguments\n");
        return 2;
    }
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0)
        die("sched_getaffinity");
    for (cpu = 0; cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed); cpu++)
        ;
    if (cpu == CPU_SETSIZE) {
        fprintf(stderr, "FAIL no cpu\n");
        return 1;
    }
    pin(cpu);

    int l = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0)
        die("socket");
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (bind(l, (struct sockaddr *)&a, sizeof a) != 0)
        die("bind");
    if (listen(l, 16) != 0)
        die("listen");
    int ep = epoll_create1(0);
    if (ep < 0)
        die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = l};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev) != 0)
        die("epoll_ctl");
    /* One wait first: the engine is up and the set known before the measured stretch. */
    struct epoll_event out[8];
    if (epoll_wait(ep, out, 8, 1) < 0)
        die("epoll_wait");

    pthread_t th;
    if (pthread_create(&th, NULL, helper, NULL) != 0) {
        fprintf(stderr, "FAIL pthread_create\n");
        return 1;
    }
    while (!atomic_load(&started))
        sched_yield();
    int64_t t0 = ns_of(CLOCK_THREAD_CPUTIME_ID);
    for (int i = 0; i < rounds; i++) {
        int n = epoll_wait(ep, out, 8, timeout_ms);
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        if (n > 0) {
            fprintf(stderr, "FAIL the idle listener was reported readable\n");
            return 1;
        }
    }
    int64_t spinner_cpu_ns = ns_of(CLOCK_THREAD_CPUTIME_ID) - t0;
    atomic_store(&stop, 1);
    pthread_join(th, NULL);
    printf("OK rounds=%d cpu=%d spinner_us=%lld helper_us=%lld\n", rounds, cpu,
           (long long)(spinner_cpu_ns / 1000), (long long)(helper_cpu_ns / 1000));
    return 0;
}
