/* An rdma_cm client/server pair for libxwarp_ibverbs.so (tests/cm.rs), built with the system
 * cc against Debian's <rdma/rdma_cma.h> and <rdma/rdma_verbs.h> and run with the library
 * preloaded, one process per network namespace, each with its own xwarp engine.
 *
 *   cm_pair server ADDR PORT      cm_pair client SERVER_ADDR PORT UNREACHABLE_ADDR
 *   cm_pair nodev ADDR PORT       (no xwarp device: every call fails cleanly)
 *   cm_pair exit-server ADDR PORT [LISTEN_DELAY_MS]   cm_pair exit-client SERVER_ADDR PORT
 *                                 (the client exits without rdma_disconnect; the server
 *                                 starts its engine, then listens after the delay)
 *
 * Server: rejects the first connection request (checking its private data) with private
 * data, accepts the second with private data, receives the client's buffer advertisement,
 * RDMA Reads the client's pattern and checks it, RDMA Writes its own pattern into the
 * client's second buffer, Sends "done", and waits for DISCONNECTED.
 * Client: error returns first (UD port space, calls out of order, a source address the
 * engine does not own, ADDR_ERROR for an unreachable destination), then the rejected
 * connect (REJECTED, status, the server's private data), then the accepted one
 * (ESTABLISHED with the server's private data), Send/Recv through the <rdma/rdma_verbs.h>
 * helpers, the pattern written by the server checked, rdma_disconnect, DISCONNECTED.
 * Every step prints one line; any failure prints "FAIL: ..." and exits 1. */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#define BUF 65536
#define CHECK(c, ...) do { if (!(c)) { printf("FAIL: " __VA_ARGS__); printf(" (errno %d %s)\n", errno, strerror(errno)); fflush(stdout); exit(1); } } while (0)
#define STEP(...) do { printf(__VA_ARGS__); printf("\n"); fflush(stdout); } while (0)

struct adv { uint64_t addr; uint32_t rkey; uint32_t len; };

static const char REJ_REQ[] = "please reject me";
static const char REJ_REPLY[] = "rejected by cm_pair";
static const char ACC_REQ[] = "hello from the cm_pair client";
static const char ACC_REPLY[] = "welcome, says the server";

static void pattern(uint8_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)((i * 131u + seed * 7u + (i >> 8)) & 0xff);
}

static int check_pattern(const uint8_t *p, size_t n, uint32_t seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (uint8_t)((i * 131u + seed * 7u + (i >> 8)) & 0xff))
			return (int)i;
	return -1;
}

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type t)
{
	struct rdma_cm_event *e;
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	CHECK(poll(&p, 1, 20000) == 1, "no event on the channel fd (waiting for %s)", rdma_event_str(t));
	CHECK(rdma_get_cm_event(ch, &e) == 0, "rdma_get_cm_event");
	CHECK(e->event == t, "event %s (status %d), expected %s", rdma_event_str(e->event), e->status, rdma_event_str(t));
	STEP("event %s status %d private_data_len %d", rdma_event_str(e->event), e->status,
	     e->param.conn.private_data_len);
	return e;
}

static void set_addr(struct sockaddr_in *s, const char *a, int port)
{
	memset(s, 0, sizeof *s);
	s->sin_family = AF_INET;
	s->sin_port = htons(port);
	CHECK(inet_pton(AF_INET, a, &s->sin_addr) == 1, "address %s", a);
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr a = { 0 };
	a.cap.max_send_wr = 16;
	a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	a.qp_type = IBV_QPT_RC;
	/* NULL PD and NULL CQs: the id's default PD and CQs with completion channels. */
	CHECK(rdma_create_qp(id, NULL, &a) == 0, "rdma_create_qp");
	CHECK(id->qp && id->pd && id->send_cq && id->recv_cq && id->send_cq_channel && id->recv_cq_channel,
	      "rdma_create_qp left the id without qp/pd/cqs");
	CHECK(id->qp->qp_type == IBV_QPT_RC, "qp_type");
}

static void wc_ok(struct ibv_wc *wc, int r, const char *what)
{
	CHECK(r == 1, "%s: rdma_get_*_comp returned %d", what, r);
	CHECK(wc->status == IBV_WC_SUCCESS, "%s: status %s", what, ibv_wc_status_str(wc->status));
}

static int server(const char *addr, int port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel");
	struct rdma_cm_id *listen;
	CHECK(rdma_create_id(ch, &listen, (void *)0x1234, RDMA_PS_TCP) == 0, "rdma_create_id");
	struct sockaddr_in s;
	set_addr(&s, addr, port);
	CHECK(rdma_bind_addr(listen, (struct sockaddr *)&s) == 0, "rdma_bind_addr");
	CHECK(ntohs(rdma_get_src_port(listen)) == port, "rdma_get_src_port after bind");
	CHECK(listen->verbs != NULL, "bound to the engine's address, verbs set");
	CHECK(rdma_listen(listen, 4) == 0, "rdma_listen");
	STEP("listening on %s:%d", addr, port);

	/* 1: reject with private data. */
	struct rdma_cm_event *e = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(e->listen_id == listen && e->id != listen, "listen_id/id of CONNECT_REQUEST");
	CHECK(e->id->context == (void *)0x1234, "new id inherits the listener's context");
	CHECK(e->param.conn.private_data_len == sizeof REJ_REQ &&
	      memcmp(e->param.conn.private_data, REJ_REQ, sizeof REJ_REQ) == 0, "request private data");
	struct rdma_cm_id *rej = e->id;
	CHECK(rdma_reject(rej, REJ_REPLY, sizeof REJ_REPLY) == 0, "rdma_reject");
	CHECK(rdma_accept(rej, NULL) == -1 && errno == EINVAL, "accept after reject is EINVAL");
	CHECK(rdma_ack_cm_event(e) == 0, "ack");
	CHECK(rdma_ack_cm_event(e) == -1 && errno == EINVAL, "a second ack is EINVAL");
	CHECK(rdma_destroy_id(rej) == 0, "destroy rejected id");
	STEP("rejected the first request");

	/* 2: accept. */
	e = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	CHECK(e->param.conn.private_data_len == sizeof ACC_REQ &&
	      memcmp(e->param.conn.private_data, ACC_REQ, sizeof ACC_REQ) == 0, "request private data 2");
	CHECK(e->param.conn.responder_resources == 3 && e->param.conn.initiator_depth == 2,
	      "request IRD/ORD mirrored: rr %d id %d", e->param.conn.responder_resources, e->param.conn.initiator_depth);
	struct rdma_cm_id *id = e->id;
	CHECK(id->verbs != NULL, "the new id has verbs");
	struct sockaddr_in *peer = (struct sockaddr_in *)rdma_get_peer_addr(id);
	CHECK(peer->sin_family == AF_INET, "peer address family");
	STEP("request from %s:%d", inet_ntoa(peer->sin_addr), ntohs(rdma_get_dst_port(id)));
	CHECK(rdma_ack_cm_event(e) == 0, "ack 2");
	CHECK(rdma_accept(id, NULL) == -1 && errno == EINVAL, "accept without a QP is EINVAL");
	make_qp(id);

	uint8_t *rbuf = calloc(1, BUF), *wbuf = malloc(BUF);
	struct adv *msg = calloc(1, sizeof *msg);
	char *done = strdup("done");
	pattern(wbuf, BUF, 2);
	struct ibv_mr *rmr = rdma_reg_write(id, rbuf, BUF);
	struct ibv_mr *wmr = rdma_reg_msgs(id, wbuf, BUF);
	struct ibv_mr *mmr = rdma_reg_msgs(id, msg, sizeof *msg);
	struct ibv_mr *dmr = rdma_reg_msgs(id, done, 5);
	CHECK(rmr && wmr && mmr && dmr, "rdma_reg_*");
	CHECK(rdma_post_recv(id, (void *)1, msg, sizeof *msg, mmr) == 0, "rdma_post_recv");

	struct rdma_conn_param cp = { 0 };
	cp.private_data = ACC_REPLY;
	cp.private_data_len = sizeof ACC_REPLY;
	cp.responder_resources = 2;
	cp.initiator_depth = 3;
	CHECK(rdma_accept(id, &cp) == 0, "rdma_accept");
	e = expect(ch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(e->id == id, "ESTABLISHED names the new id");
	CHECK(rdma_ack_cm_event(e) == 0, "ack 3");

	struct ibv_wc wc;
	wc_ok(&wc, rdma_get_recv_comp(id, &wc), "recv adv");
	CHECK(wc.byte_len == sizeof *msg && wc.wr_id == 1, "adv length %u", wc.byte_len);
	STEP("client buffer %#llx rkey %#x len %u", (unsigned long long)msg->addr, msg->rkey, msg->len);
	CHECK(msg->len == BUF, "advertised length");

	/* RDMA Read the client's pattern (seed 1). */
	CHECK(rdma_post_read(id, (void *)2, rbuf, BUF, rmr, IBV_SEND_SIGNALED, msg->addr, msg->rkey) == 0, "rdma_post_read");
	wc_ok(&wc, rdma_get_send_comp(id, &wc), "read");
	CHECK(wc.opcode == IBV_WC_RDMA_READ && wc.wr_id == 2, "read completion opcode %d", wc.opcode);
	int bad = check_pattern(rbuf, BUF, 1);
	CHECK(bad < 0, "RDMA Read data differs at byte %d", bad);
	STEP("RDMA Read of %d bytes verified", BUF);

	/* RDMA Write our pattern (seed 2) into the client's second buffer (advertised next). */
	CHECK(rdma_post_recv(id, (void *)3, msg, sizeof *msg, mmr) == 0, "rdma_post_recv 2");
	CHECK(rdma_post_send(id, (void *)4, done, 5, dmr, IBV_SEND_SIGNALED) == 0, "send go");
	wc_ok(&wc, rdma_get_send_comp(id, &wc), "send go");
	wc_ok(&wc, rdma_get_recv_comp(id, &wc), "recv adv 2");
	CHECK(rdma_post_write(id, (void *)5, wbuf, BUF, wmr, IBV_SEND_SIGNALED, msg->addr, msg->rkey) == 0, "rdma_post_write");
	wc_ok(&wc, rdma_get_send_comp(id, &wc), "write");
	CHECK(wc.opcode == IBV_WC_RDMA_WRITE, "write completion opcode %d", wc.opcode);
	CHECK(rdma_post_send(id, (void *)6, done, 5, dmr, IBV_SEND_SIGNALED) == 0, "send done");
	wc_ok(&wc, rdma_get_send_comp(id, &wc), "send done");
	STEP("RDMA Write of %d bytes sent", BUF);

	e = expect(ch, RDMA_CM_EVENT_DISCONNECTED);
	CHECK(e->id == id, "DISCONNECTED names the id");
	CHECK(rdma_ack_cm_event(e) == 0, "ack 4");
	CHECK(rdma_disconnect(id) == 0, "rdma_disconnect after DISCONNECTED is 0");

	rdma_dereg_mr(rmr);
	rdma_dereg_mr(wmr);
	rdma_dereg_mr(mmr);
	rdma_dereg_mr(dmr);
	rdma_destroy_qp(id);
	CHECK(id->qp == NULL, "rdma_destroy_qp clears id->qp");
	CHECK(rdma_destroy_id(id) == 0, "destroy id");
	CHECK(rdma_destroy_id(listen) == 0, "destroy listener");
	CHECK(rdma_destroy_id(listen) == -1 && errno == EINVAL, "a destroyed id is EINVAL");
	rdma_destroy_event_channel(ch);
	STEP("server done");
	return 0;
}

static struct rdma_cm_id *resolved(struct rdma_event_channel *ch, const char *addr, int port)
{
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	struct sockaddr_in d;
	set_addr(&d, addr, port);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&d, 2000) == 0, "rdma_resolve_addr");
	struct rdma_cm_event *e = expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(e->id == id && e->status == 0, "ADDR_RESOLVED id");
	CHECK(id->verbs != NULL && id->port_num == 1, "resolved id has verbs, port 1");
	rdma_ack_cm_event(e);
	CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
	e = expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	rdma_ack_cm_event(e);
	return id;
}

static int client(const char *addr, int port, const char *unreachable)
{
	struct rdma_cm_id *id;
	/* Error returns. */
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_UDP) == -1 && errno == EOPNOTSUPP, "RDMA_PS_UDP is EOPNOTSUPP");
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel");
	CHECK(fcntl(ch->fd, F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");
	struct rdma_cm_event *e;
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EAGAIN, "empty non-blocking channel is EAGAIN");
	CHECK(fcntl(ch->fd, F_SETFL, 0) == 0, "blocking again");
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	CHECK(rdma_resolve_route(id, 100) == -1 && errno == EINVAL, "route before addr is EINVAL");
	struct rdma_conn_param cp = { 0 };
	CHECK(rdma_connect(id, &cp) == -1 && errno == EINVAL, "connect before resolve is EINVAL");
	struct sockaddr_in s;
	set_addr(&s, "192.0.2.99", 0);
	CHECK(rdma_bind_addr(id, (struct sockaddr *)&s) == -1 && errno == EADDRNOTAVAIL, "bind to a foreign address");
	set_addr(&s, unreachable, port);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&s, 1000) == 0, "rdma_resolve_addr (unreachable)");
	e = expect(ch, RDMA_CM_EVENT_ADDR_ERROR);
	CHECK(e->status == -ENETUNREACH, "ADDR_ERROR status %d", e->status);
	rdma_ack_cm_event(e);
	CHECK(rdma_destroy_id(id) == 0, "destroy");
	CHECK(rdma_destroy_id((struct rdma_cm_id *)&s) == -1 && errno == EINVAL, "a foreign pointer is EINVAL");
	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_REJECTED), "RDMA_CM_EVENT_REJECTED") == 0, "rdma_event_str");
	STEP("error returns as librdmacm's");

	/* Rejected connect. */
	id = resolved(ch, addr, port);
	make_qp(id);
	cp.private_data = REJ_REQ;
	cp.private_data_len = sizeof REJ_REQ;
	cp.responder_resources = 1;
	cp.initiator_depth = 1;
	CHECK(rdma_connect(id, &cp) == 0, "rdma_connect 1");
	e = expect(ch, RDMA_CM_EVENT_REJECTED);
	CHECK(e->status == -ECONNREFUSED, "REJECTED status %d", e->status);
	CHECK(e->param.conn.private_data_len == sizeof REJ_REPLY &&
	      memcmp(e->param.conn.private_data, REJ_REPLY, sizeof REJ_REPLY) == 0, "reject private data");
	rdma_ack_cm_event(e);
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0, "destroy rejected");
	STEP("rejected with the server's private data");

	/* Accepted connect. */
	id = resolved(ch, addr, port);
	make_qp(id);
	uint8_t *sbuf = malloc(BUF), *wbuf = calloc(1, BUF);
	struct adv *msg = calloc(1, sizeof *msg);
	char *go = calloc(1, 8);
	pattern(sbuf, BUF, 1);
	struct ibv_mr *smr = rdma_reg_read(id, sbuf, BUF);
	struct ibv_mr *wmr = rdma_reg_write(id, wbuf, BUF);
	struct ibv_mr *mmr = rdma_reg_msgs(id, msg, sizeof *msg);
	struct ibv_mr *gmr = rdma_reg_msgs(id, go, 8);
	CHECK(smr && wmr && mmr && gmr, "rdma_reg_*");
	CHECK(rdma_post_recv(id, (void *)10, go, 8, gmr) == 0, "post recv go");
	cp.private_data = ACC_REQ;
	cp.private_data_len = sizeof ACC_REQ;
	cp.responder_resources = 2;
	cp.initiator_depth = 3;
	CHECK(rdma_connect(id, &cp) == 0, "rdma_connect 2");
	e = expect(ch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(e->param.conn.private_data_len == sizeof ACC_REPLY &&
	      memcmp(e->param.conn.private_data, ACC_REPLY, sizeof ACC_REPLY) == 0, "accept private data");
	rdma_ack_cm_event(e);
	CHECK(rdma_connect(id, &cp) == -1 && errno == EINVAL, "a second connect is EINVAL");

	struct ibv_wc wc;
	msg->addr = (uintptr_t)sbuf;
	msg->rkey = smr->rkey;
	msg->len = BUF;
	CHECK(rdma_post_send(id, (void *)11, msg, sizeof *msg, mmr, IBV_SEND_SIGNALED) == 0, "send adv");
	wc_ok(&wc, rdma_get_send_comp(id, &wc), "send adv");
	wc_ok(&wc, rdma_get_recv_comp(id, &wc), "recv go");
	CHECK(strcmp(go, "done") == 0, "go message %s", go);
	memset(go, 0, 8);
	CHECK(rdma_post_recv(id, (void *)12, go, 8, gmr) == 0, "post recv done");
	msg->addr = (uintptr_t)wbuf;
	msg->rkey = wmr->rkey;
	CHECK(rdma_post_send(id, (void *)13, msg, sizeof *msg, mmr, IBV_SEND_SIGNALED) == 0, "send adv 2");
	wc_ok(&wc, rdma_get_send_comp(id, &wc), "send adv 2");
	wc_ok(&wc, rdma_get_recv_comp(id, &wc), "recv done");
	int bad = check_pattern(wbuf, BUF, 2);
	CHECK(bad < 0, "RDMA Written data differs at byte %d", bad);
	STEP("RDMA Write of %d bytes from the server verified", BUF);

	CHECK(rdma_disconnect(id) == 0, "rdma_disconnect");
	e = expect(ch, RDMA_CM_EVENT_DISCONNECTED);
	rdma_ack_cm_event(e);
	rdma_dereg_mr(smr);
	rdma_dereg_mr(wmr);
	rdma_dereg_mr(mmr);
	rdma_dereg_mr(gmr);
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0, "destroy id");
	rdma_destroy_event_channel(ch);
	STEP("client done");
	return 0;
}

/* Without a device (XWARP_IFACE unset): the calls that need one fail with ENODEV, the
 * others work, nothing aborts. */
static int nodev(const char *addr, int port)
{
	int n = -1;
	struct ibv_context **l = rdma_get_devices(&n);
	CHECK(l == NULL && errno == ENODEV && n == 0, "rdma_get_devices without a device");
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel");
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	struct sockaddr_in d;
	set_addr(&d, addr, port);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&d, 1000) == -1 && errno == ENODEV, "resolve without a device");
	CHECK(rdma_bind_addr(id, (struct sockaddr *)&d) == -1 && errno == ENODEV, "bind without a device");
	CHECK(rdma_listen(id, 1) == -1 && errno == ENODEV, "listen without a device");
	CHECK(rdma_destroy_id(id) == 0, "destroy");
	rdma_destroy_event_channel(ch);
	STEP("no device: every call failed with ENODEV");
	return 0;
}

/* "exit-server ADDR PORT [LISTEN_DELAY_MS]": start the engine, listen after the delay, accept one connection with a receive posted, check the one
 * Send the client queued before it exited, then wait for DISCONNECTED: the client never
 * calls rdma_disconnect, so only the library's exit hook can close its connection. */
static const char BYE[] = "bye, exiting now";

static int exit_server(const char *addr, int port, int listen_delay_ms)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel");
	struct rdma_cm_id *listen;
	CHECK(rdma_create_id(ch, &listen, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	struct sockaddr_in s;
	set_addr(&s, addr, port);
	CHECK(rdma_bind_addr(listen, (struct sockaddr *)&s) == 0, "rdma_bind_addr");
	/* A PD starts the engine: from here on its TCP refuses connects to the port until
	 * the listen (RST to the SYN). */
	struct ibv_pd *pd = ibv_alloc_pd(listen->verbs);
	CHECK(pd, "ibv_alloc_pd");
	STEP("engine up, listening in %d ms", listen_delay_ms);
	usleep((useconds_t)listen_delay_ms * 1000);
	CHECK(rdma_listen(listen, 4) == 0, "rdma_listen");
	STEP("listening on %s:%d", addr, port);
	struct rdma_cm_event *e = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *id = e->id;
	rdma_ack_cm_event(e);
	make_qp(id);
	char *msg = calloc(1, sizeof BYE);
	struct ibv_mr *mr = rdma_reg_msgs(id, msg, sizeof BYE);
	CHECK(mr, "rdma_reg_msgs");
	CHECK(rdma_post_recv(id, (void *)21, msg, sizeof BYE, mr) == 0, "post recv");
	CHECK(rdma_accept(id, NULL) == 0, "rdma_accept");
	e = expect(ch, RDMA_CM_EVENT_ESTABLISHED);
	rdma_ack_cm_event(e);
	struct ibv_wc wc;
	wc_ok(&wc, rdma_get_recv_comp(id, &wc), "recv bye");
	CHECK(wc.byte_len == sizeof BYE && memcmp(msg, BYE, sizeof BYE) == 0, "the client's last Send");
	STEP("the client's last Send arrived");
	e = expect(ch, RDMA_CM_EVENT_DISCONNECTED);
	rdma_ack_cm_event(e);
	rdma_dereg_mr(mr);
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0, "destroy id");
	CHECK(rdma_destroy_id(listen) == 0, "destroy listener");
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	rdma_destroy_event_channel(ch);
	STEP("exit-server done");
	return 0;
}

/* "exit-client ADDR PORT": connect, queue one Send and return from main at once, without
 * waiting for its completion and without rdma_disconnect. */
static int exit_client(const char *addr, int port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch, "rdma_create_event_channel");
	struct rdma_cm_id *id = resolved(ch, addr, port);
	make_qp(id);
	char *msg = malloc(sizeof BYE);
	memcpy(msg, BYE, sizeof BYE);
	struct ibv_mr *mr = rdma_reg_msgs(id, msg, sizeof BYE);
	CHECK(mr, "rdma_reg_msgs");
	struct rdma_conn_param cp = { 0 };
	cp.responder_resources = 1;
	cp.initiator_depth = 1;
	CHECK(rdma_connect(id, &cp) == 0, "rdma_connect");
	struct rdma_cm_event *e = expect(ch, RDMA_CM_EVENT_ESTABLISHED);
	rdma_ack_cm_event(e);
	CHECK(rdma_post_send(id, (void *)22, msg, sizeof BYE, mr, IBV_SEND_SIGNALED) == 0, "post send");
	STEP("exiting without rdma_disconnect");
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && strcmp(argv[1], "server") == 0)
		return server(argv[2], atoi(argv[3]));
	if (argc == 5 && strcmp(argv[1], "client") == 0)
		return client(argv[2], atoi(argv[3]), argv[4]);
	if (argc == 4 && strcmp(argv[1], "nodev") == 0)
		return nodev(argv[2], atoi(argv[3]));
	if ((argc == 4 || argc == 5) && strcmp(argv[1], "exit-server") == 0)
		return exit_server(argv[2], atoi(argv[3]), argc == 5 ? atoi(argv[4]) : 0);
	if (argc == 4 && strcmp(argv[1], "exit-client") == 0)
		return exit_client(argv[2], atoi(argv[3]));
	fprintf(stderr, "usage: cm_pair server ADDR PORT | client ADDR PORT UNREACHABLE\n");
	return 2;
}
