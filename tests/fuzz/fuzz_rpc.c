/*
 * fuzz_rpc.c - libFuzzer harness for the RPC edge: bytes decoded as a
 * RegisterLayoutRequest (protobuf-c) and converted and validated into
 * layouts (rpc/proto_conv.c), as the coordinator does with what arrives;
 * the string check of the RPC edge runs first, as in rpc_server.c.
 */
#include <stdint.h>
#include <stdlib.h>

#include "rpc/proto_conv.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	Refit__V1__RegisterLayoutRequest *rq;
	plan_layout_set_t set;
	refit_err_t e;
	char hex[SHA256_HEX_LEN];

	refit_err_clear(&e);
	if (conv_check_strings(&refit__v1__register_layout_request__descriptor, data, size,
			       &e) != REFIT_OK) {
		if (e.msg[0] == '\0')
			abort();
		return 0;
	}
	rq = refit__v1__register_layout_request__unpack(NULL, size, data);
	if (rq == NULL)
		return 0;
	if (conv_layouts_from_proto(rq->tensors, rq->n_tensors, &set, &e) == REFIT_OK) {
		conv_layouts_digest(&set, hex);
		for (size_t i = 0; i < set.n; i++)
			(void)plan_layout_check_coverage(&set.v[i], NULL);
		plan_layout_set_fini(&set);
	} else if (e.msg[0] == '\0') {
		abort();
	}
	refit__v1__register_layout_request__free_unpacked(rq, NULL);
	return 0;
}
