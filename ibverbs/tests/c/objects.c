/*
 * The verbs objects of libxwarp_ibverbs.so as a C program sees them: compiled against
 * Debian's <infiniband/verbs.h>, linked with -libverbs, run with the library preloaded
 * (tests/objects_c.rs, root, a veth in a test namespace: the engine binds AF_XDP).
 * Every header-inline call (ibv_post_send, ibv_post_recv, ibv_post_srq_recv,
 * ibv_poll_cq, ibv_req_notify_cq, ibv_query_gid_ex, the ibv_reg_mr macro) goes through
 * the structures the library handed out. Prints one line per failed check and a summary;
 * exits 1 if anything failed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

static int checks, failures;

#define CHECK(cond, ...)                                                         \
	do {                                                                     \
		checks++;                                                        \
		if (!(cond)) {                                                   \
			failures++;                                              \
			fprintf(stderr, "FAIL line %d: %s: ", __LINE__, #cond);  \
			fprintf(stderr, __VA_ARGS__);                            \
			fprintf(stderr, " (errno %d)\n", errno);                 \
		}                                                                \
	} while (0)

static volatile int destroyed;
static struct ibv_cq *doomed;
static int destroy_ret = -1;

static void *destroy_thread(void *arg)
{
	(void)arg;
	destroy_ret = ibv_destroy_cq(doomed);
	destroyed = 1;
	return NULL;
}

int main(void)
{
	int n = -1;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 1, "device list: %d", n);
	if (!list || n != 1)
		return 1;
	CHECK(strcmp(ibv_get_device_name(list[0]), "xwarp_veth-a") == 0, "name %s",
	      ibv_get_device_name(list[0]));
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL, "open");
	if (!ctx)
		return 1;
	CHECK(ibv_fork_init() == 0, "fork_init");

	/* PD: the engine starts here (AF_XDP on veth-a). */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL, "alloc_pd");
	if (!pd)
		return 1;
	errno = 0;
	CHECK(ibv_alloc_pd(NULL) == NULL && errno == EINVAL, "alloc_pd(NULL)");

	/* MRs on heap, stack and mmap memory; the macro picks reg_mr or reg_mr_iova2. */
	const int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	size_t hlen = 1 << 20;
	char *heap = malloc(hlen);
	char stack[4096];
	char *map = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(heap, 0x11, hlen);
	memset(stack, 0x22, sizeof stack);
	struct ibv_mr *mh = ibv_reg_mr(pd, heap, hlen, rw);
	struct ibv_mr *ms = ibv_reg_mr(pd, stack, sizeof stack, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mm = ibv_reg_mr(pd, map, 1 << 16, rw | IBV_ACCESS_RELAXED_ORDERING);
	CHECK(mh && ms && mm, "reg_mr heap %p stack %p mmap %p", (void *)mh, (void *)ms, (void *)mm);
	if (!mh || !ms || !mm)
		return 1;
	CHECK(mh->addr == heap && mh->length == hlen && mh->lkey == mh->rkey && mh->pd == pd,
	      "mr fields");
	CHECK(mm->addr == map, "iova2 mr addr");
	errno = 0;
	CHECK(ibv_reg_mr(pd, heap, hlen, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL,
	      "remote write without local write");
	errno = 0;
	CHECK(ibv_reg_mr(pd, heap, 0, 0) == NULL && errno == EINVAL, "length 0");
	errno = 0;
	CHECK(ibv_reg_mr(pd, (void *)0x1000, 4096, 0) == NULL && errno == EFAULT, "unmapped");
	errno = 0;
	CHECK(ibv_reg_mr(NULL, heap, 16, 0) == NULL && errno == EINVAL, "NULL pd");
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "dealloc with MRs");

	/* Completion channel and CQ. */
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch != NULL && ch->fd >= 0, "channel");
	errno = 0;
	CHECK(ibv_create_cq(ctx, 0, NULL, NULL, 0) == NULL && errno == EINVAL, "cqe 0");
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, (void *)0x1234, ch, 0);
	CHECK(cq != NULL && cq->context == ctx && cq->channel == ch, "create_cq");
	if (!ch || !cq)
		return 1;
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY, "channel in use");

	/* QPs. */
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 32 },
	};
	errno = 0;
	CHECK(ibv_create_qp(pd, &ia) == NULL && errno == EOPNOTSUPP, "UD QP");
	ia.qp_type = IBV_QPT_RC;
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp != NULL, "create_qp");
	if (!qp)
		return 1;
	CHECK(qp->state == IBV_QPS_RESET && qp->qp_type == IBV_QPT_RC && qp->pd == pd &&
	      qp->send_cq == cq && ia.cap.max_send_wr == 8 && ia.cap.max_inline_data == 32,
	      "qp fields");

	struct ibv_sge sg = { .addr = (uintptr_t)map, .length = 100, .lkey = mm->lkey };
	struct ibv_sge sg2[2] = { sg, sg };
	struct ibv_recv_wr r2 = { .wr_id = 2, .sg_list = &sg, .num_sge = 1 };
	struct ibv_recv_wr r1 = { .wr_id = 1, .next = &r2, .sg_list = &sg, .num_sge = 1 };
	struct ibv_recv_wr *rbad = NULL;
	CHECK(ibv_post_recv(qp, &r1, &rbad) == EINVAL && rbad == &r1, "post_recv in RESET");
	struct ibv_send_wr sw = { .wr_id = 9, .sg_list = &sg, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *sbad = NULL;
	CHECK(ibv_post_send(qp, &sw, &sbad) == EINVAL && sbad == &sw, "post_send in RESET");

	struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .qp_access_flags = rw, .port_num = 1 };
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PORT) == 0,
	      "to INIT");
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(qp, &qa, IBV_QP_STATE | IBV_QP_CAP, &qi) == 0 &&
	      qa.qp_state == IBV_QPS_INIT && qa.qp_access_flags == (unsigned)rw &&
	      qa.cap.max_recv_wr == 8 && qi.recv_cq == cq && qi.qp_type == IBV_QPT_RC,
	      "query INIT: state %d", qa.qp_state);
	at.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE) == EINVAL, "RTS without a connection");

	CHECK(ibv_post_recv(qp, &r1, &rbad) == 0 && rbad == NULL, "two receives in INIT");
	struct ibv_recv_wr r3 = { .wr_id = 3, .sg_list = sg2, .num_sge = 2 };
	CHECK(ibv_post_recv(qp, &r3, &rbad) == EINVAL && rbad == &r3, "too many SGEs (recv)");
	sw.sg_list = sg2;
	sw.num_sge = 2;
	CHECK(ibv_post_send(qp, &sw, &sbad) == EINVAL && sbad == &sw, "too many SGEs (send)");
	char big[64];
	memset(big, 1, sizeof big);
	struct ibv_sge isg = { .addr = (uintptr_t)big, .length = sizeof big };
	struct ibv_send_wr iw = { .wr_id = 10, .sg_list = &isg, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_INLINE };
	CHECK(ibv_post_send(qp, &iw, &sbad) == EINVAL && sbad == &iw, "inline 64 > 32");
	iw.opcode = IBV_WR_SEND_WITH_IMM;
	iw.send_flags = 0;
	iw.sg_list = &sg;
	CHECK(ibv_post_send(qp, &iw, &sbad) == EOPNOTSUPP, "send with imm");

	/* The channel fd: non-blocking on request, poll/epoll-able. */
	int fl = fcntl(ch->fd, F_GETFL);
	CHECK(fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK");
	struct ibv_cq *ecq = NULL;
	void *ectx = NULL;
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == -1 && errno == EAGAIN, "no event yet");
	int ep = epoll_create1(0);
	struct epoll_event ee = { .events = EPOLLIN }, got;
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, ch->fd, &ee) == 0, "epoll_ctl");
	CHECK(epoll_wait(ep, &got, 1, 0) == 0, "not readable yet");
	CHECK(ibv_req_notify_cq(cq, 0) == 0, "req_notify");

	/* ERROR flushes both receives; the armed CQ makes the channel readable. */
	at.qp_state = IBV_QPS_ERR;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE) == 0 && qp->state == IBV_QPS_ERR, "to ERR");
	CHECK(epoll_wait(ep, &got, 1, 5000) == 1, "epoll: readable");
	struct pollfd pfd = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 0) == 1, "poll: readable");
	CHECK(ibv_get_cq_event(ch, &ecq, &ectx) == 0 && ecq == cq && ectx == (void *)0x1234,
	      "get_cq_event");
	struct ibv_wc wc[4];
	int got_wc = 0;
	for (int i = 0; i < 1000 && got_wc < 2; i++) {
		int k = ibv_poll_cq(cq, 4 - got_wc, wc + got_wc);
		CHECK(k >= 0, "poll_cq %d", k);
		got_wc += k;
		if (got_wc < 2)
			usleep(1000);
	}
	CHECK(got_wc == 2, "two flushed receives, got %d", got_wc);
	for (int i = 0; i < got_wc; i++)
		CHECK(wc[i].wr_id == (uint64_t)(i + 1) && wc[i].status == IBV_WC_WR_FLUSH_ERR &&
		      wc[i].opcode == IBV_WC_RECV && wc[i].qp_num == qp->qp_num,
		      "wc %d: id %llu status %d opcode %d", i, (unsigned long long)wc[i].wr_id,
		      wc[i].status, wc[i].opcode);
	CHECK(ibv_poll_cq(cq, 4, wc) == 0, "nothing more");

	/* ibv_wc_status_str: the same text as the real libibverbs. */
	void *real = dlopen("libibverbs.so.1", RTLD_LAZY | RTLD_NOLOAD);
	const char *(*real_str)(enum ibv_wc_status) =
		real ? dlvsym(real, "ibv_wc_status_str", "IBVERBS_1.1") : NULL;
	CHECK(real_str != NULL && (void *)real_str != (void *)ibv_wc_status_str,
	      "the real ibv_wc_status_str");
	if (real_str)
		for (int s = 0; s <= 25; s++)
			CHECK(strcmp(real_str(s), ibv_wc_status_str(s)) == 0, "status %d: %s vs %s",
			      s, real_str(s), ibv_wc_status_str(s));

	/* Reset, destroy; the CQ's destroy waits for the unacked event. */
	at.qp_state = IBV_QPS_RESET;
	CHECK(ibv_modify_qp(qp, &at, IBV_QP_STATE) == 0 && qp->state == IBV_QPS_RESET,
	      "reset from ERR");
	CHECK(ibv_destroy_cq(cq) == EBUSY, "CQ used by a QP");
	CHECK(ibv_destroy_qp(qp) == 0, "destroy_qp");
	doomed = cq;
	pthread_t t;
	pthread_create(&t, NULL, destroy_thread, NULL);
	usleep(300000);
	CHECK(!destroyed, "destroy_cq returned with an event unacked");
	ibv_ack_cq_events(cq, 1);
	pthread_join(t, NULL);
	CHECK(destroy_ret == 0, "destroy_cq after the ack: %d", destroy_ret);
	CHECK(ibv_destroy_comp_channel(ch) == 0, "destroy channel");

	/* SRQ through the inline post. */
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	CHECK(srq != NULL && srq->pd == pd, "create_srq");
	if (srq) {
		struct ibv_recv_wr s1 = { .wr_id = 5, .sg_list = &sg, .num_sge = 1 };
		CHECK(ibv_post_srq_recv(srq, &s1, &rbad) == 0, "post_srq_recv");
		struct ibv_srq_attr sq;
		CHECK(ibv_query_srq(srq, &sq) == 0 && sq.max_wr == 4, "query_srq");
		CHECK(ibv_modify_srq(srq, &sq, IBV_SRQ_MAX_WR) == EOPNOTSUPP, "resize srq");
		CHECK(ibv_destroy_srq(srq) == 0, "destroy_srq");
	}

	/* Async fd, P_Key, GID entry, AH. */
	fl = fcntl(ctx->async_fd, F_GETFL);
	fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
	struct ibv_async_event ae;
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &ae) == -1 && errno == EAGAIN, "no async event");
	uint16_t pkey = 0;
	CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && pkey == 0xffff, "pkey");
	struct ibv_gid_entry ge;
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &ge, 0) == 0 && ge.port_num == 1 &&
	      ge.gid_type == IBV_GID_TYPE_IB && ge.ndev_ifindex > 0, "gid_ex");
	struct ibv_ah_attr aa = { .port_num = 1 };
	errno = 0;
	CHECK(ibv_create_ah(pd, &aa) == NULL && errno == EOPNOTSUPP, "create_ah");

	/* Deregistration; the memory may go right after. */
	CHECK(ibv_dereg_mr(mh) == 0 && ibv_dereg_mr(ms) == 0 && ibv_dereg_mr(mm) == 0, "dereg");
	CHECK(munmap(map, 1 << 16) == 0, "munmap");
	free(heap);
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);
	printf("xwarp-objects-test: %d checks, %d failures\n", checks, failures);
	return failures ? 1 : 0;
}
