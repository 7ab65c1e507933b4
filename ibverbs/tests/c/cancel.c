/* pthread_cancel of threads blocked in ibv_get_cq_event and ibv_get_async_event (as
 * rping's server error path cancels its CQ thread): the threads unwind (their cleanup
 * handlers run), pthread_join sees PTHREAD_CANCELED, and the process goes on using the
 * library. Run with libxwarp_ibverbs.so preloaded and XWARP_IFACE=lo (no engine is
 * started: a channel without CQs and the async fd need none). */
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct ibv_context *ctx;
static struct ibv_comp_channel *ch;
static volatile int entered[2], cleaned[4], returned[4];

static void cleanup(void *arg) { cleaned[(long)arg] = 1; }

static void *cq_waiter(void *arg) {
	struct ibv_cq *cq;
	void *cq_ctx;
	(void)arg;
	pthread_cleanup_push(cleanup, (void *)0L);
	entered[0] = 1;
	ibv_get_cq_event(ch, &cq, &cq_ctx);
	pthread_cleanup_pop(0);
	return (void *)1L; /* returned: not cancelled */
}

static void *async_waiter(void *arg) {
	struct ibv_async_event ev;
	(void)arg;
	pthread_cleanup_push(cleanup, (void *)1L);
	entered[1] = 1;
	ibv_get_async_event(ctx, &ev);
	pthread_cleanup_pop(0);
	return (void *)1L;
}

/* A cancel already pending when the thread enters the library: the library's own
 * cancellation points (the warning line's write, the attempt's epoll_wait) must not act
 * on it inside the panic guard; the thread is cancelled at its next cancellation point
 * outside (pthread_testcancel), or in the verb's own wait. */
static void *pending_then_warning(void *arg) {
	(void)arg;
	pthread_cleanup_push(cleanup, (void *)2L);
	pthread_cancel(pthread_self());
	struct ibv_ah *ah = ibv_create_ah(NULL, NULL); /* first call: writes a warning */
	returned[2] = (ah == NULL);
	pthread_testcancel();
	pthread_cleanup_pop(0);
	return (void *)1L;
}

static void *pending_then_get_cq_event(void *arg) {
	struct ibv_cq *cq;
	void *cq_ctx;
	(void)arg;
	pthread_cleanup_push(cleanup, (void *)3L);
	pthread_cancel(pthread_self());
	ibv_get_cq_event(ch, &cq, &cq_ctx); /* cancelled in its wait */
	returned[3] = 1;
	pthread_cleanup_pop(0);
	return (void *)1L;
}

#define CHECK(c)                                                               \
	do {                                                                   \
		if (!(c)) {                                                    \
			fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); \
			return 1;                                              \
		}                                                              \
	} while (0)

int main(void) {
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1);
	ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	ch = ibv_create_comp_channel(ctx);
	CHECK(ch);
	pthread_t t[2];
	CHECK(pthread_create(&t[0], NULL, cq_waiter, NULL) == 0);
	CHECK(pthread_create(&t[1], NULL, async_waiter, NULL) == 0);
	for (int i = 0; i < 200 && !(entered[0] && entered[1]); i++)
		usleep(10000);
	usleep(200000); /* let both block inside the library */
	for (int i = 0; i < 2; i++) {
		void *ret = NULL;
		CHECK(pthread_cancel(t[i]) == 0);
		CHECK(pthread_join(t[i], &ret) == 0);
		CHECK(ret == PTHREAD_CANCELED);
		CHECK(cleaned[i]);
	}
	pthread_t p[2];
	CHECK(pthread_create(&p[0], NULL, pending_then_warning, NULL) == 0);
	CHECK(pthread_create(&p[1], NULL, pending_then_get_cq_event, NULL) == 0);
	for (int i = 0; i < 2; i++) {
		void *ret = NULL;
		CHECK(pthread_join(p[i], &ret) == 0);
		CHECK(ret == PTHREAD_CANCELED);
		CHECK(cleaned[2 + i]);
	}
	CHECK(returned[2] == 1);  /* ibv_create_ah returned (NULL) before the cancel acted */
	CHECK(returned[3] == 0);  /* ibv_get_cq_event did not return */
	/* The library still works after the cancellations. */
	struct ibv_comp_channel *ch2 = ibv_create_comp_channel(ctx);
	CHECK(ch2);
	CHECK(ibv_destroy_comp_channel(ch2) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	printf("cancel: both waiters cancelled and joined, 0 failures\n");
	return 0;
}
