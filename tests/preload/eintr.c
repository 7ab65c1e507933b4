/*
 * eintr: signal semantics of blocking calls, threads, and exit with a thread inside a
 * blocking call, on a TCP connection (an engine connection when run under the shim).
 *
 * usage: eintr HOST PORT
 * The peer accepts, waits ~1 s, sends "late", then echoes nothing and closes when it
 * reads end of stream.
 *   1. SIGALRM handler WITHOUT SA_RESTART, timer 100 ms, blocking recv -> -1/EINTR.
 *   2. handler WITH SA_RESTART, timer 100 ms, blocking recv -> restarted, returns "late".
 *   3. a second thread blocks in recv on the same socket (nothing more comes); main
 *      calls exit(0): the process must end promptly.
 * Prints "OK eintr=1 restarted=late handlers=N" before exiting, "FAIL ..." otherwise.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t handled;

static void on_alarm(int sig) {
    (void)sig;
    handled++;
}

static void arm(int restart) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGALRM, &sa, NULL) < 0) {
        printf("FAIL sigaction\n");
        exit(1);
    }
    struct itimerval it = {.it_value = {0, 100000}};
    setitimer(ITIMER_REAL, &it, NULL);
}

static int fd;

static void *blocked_reader(void *arg) {
    (void)arg;
    char b[16];
    /* Blocks until the process exits (or the peer closes). */
    (void)recv(fd, b, sizeof b, 0);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s HOST PORT\n", argv[0]);
        return 2;
    }
    fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        printf("FAIL connect: %s\n", strerror(errno));
        return 1;
    }
    char buf[16];
    arm(0);
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (!(n < 0 && errno == EINTR)) {
        printf("FAIL recv without SA_RESTART returned %zd (%s)\n", n, n < 0 ? strerror(errno) : "data");
        return 1;
    }
    arm(1);
    n = recv(fd, buf, sizeof buf, 0);
    if (n != 4 || memcmp(buf, "late", 4) != 0) {
        printf("FAIL recv with SA_RESTART returned %zd (%s)\n", n, n < 0 ? strerror(errno) : "short");
        return 1;
    }
    pthread_t th;
    pthread_create(&th, NULL, blocked_reader, NULL);
    usleep(100000);
    printf("OK eintr=1 restarted=late handlers=%d\n", (int)handled);
    fflush(stdout);
    exit(0);
}
