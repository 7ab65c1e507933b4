/* Warning lines with stderr closed: the library's one-line warnings must not fail the
 * call (Rust's eprintln! panics when stderr is closed; an export without the panic
 * guard then aborted the process). Run preloaded with XWARP_IFACE=lo. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
	int n = -1, fails = 0;
	close(2);
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n != 1) { printf("device list: %d\n", n); return 1; }
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx) { printf("open failed\n"); return 1; }
	errno = 0;
	if (ibv_create_ah(NULL, NULL) != NULL || errno != EOPNOTSUPP) { printf("create_ah\n"); fails++; }
	if (ibv_destroy_ah(NULL) != EOPNOTSUPP) { printf("destroy_ah\n"); fails++; }
	if (ibv_attach_mcast(NULL, NULL, 0) != EOPNOTSUPP) { printf("attach_mcast\n"); fails++; }
	if (ibv_close_device(ctx) != 0) { printf("close\n"); fails++; }
	ibv_free_device_list(list);
	printf("stderr closed: %d failures\n", fails);
	return fails != 0;
}
