/*
 * rpc_async.c - client calls from a libuv loop without blocking it: the
 * call runs on libuv's thread pool, the answer comes back on the loop.
 */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "daemon/rpc.h"

typedef struct acall {
	uv_work_t w;
	char *target;
	rpc_client_opts_t opts;
	char *token;
	const ProtobufCServiceDescriptor *svc;
	const ProtobufCMethodDescriptor *md;
	uint8_t *req;
	size_t len;
	int64_t timeout_ms;
	ProtobufCMessage *resp;
	refit_err_t err;
	rpc_done_fn done;
	void *arg;
} acall_t;

static void
work(uv_work_t *w)
{
	acall_t *a = w->data;
	ProtobufCMessage *req = protobuf_c_message_unpack(a->md->input, NULL, a->len, a->req);
	rpc_client_t *cli;

	refit_err_clear(&a->err);
	if (req == NULL) {
		refit_err_set(&a->err, REFIT_ERR_INTERNAL, "rpc: cannot re-read a request");
		return;
	}
	cli = rpc_client_new(a->target, &a->opts, &a->err);
	if (cli != NULL) {
		rpc_client_call(cli, a->svc, a->md->name, req, &a->resp, a->timeout_ms, &a->err);
		rpc_client_free(cli);
	}
	protobuf_c_message_free_unpacked(req, NULL);
}

static void
after(uv_work_t *w, int status)
{
	acall_t *a = w->data;

	if (status == UV_ECANCELED && a->err.status == REFIT_OK)
		refit_err_set(&a->err, REFIT_ERR_ABORTED, "rpc: call cancelled");
	a->done(a->arg, a->err.status, a->err.msg, a->resp);
	if (a->resp)
		protobuf_c_message_free_unpacked(a->resp, NULL);
	free(a->target);
	free(a->token);
	free(a->req);
	free(a);
}

refit_status_t
rpc_call_async(uv_loop_t *loop, const char *target, const rpc_client_opts_t *o,
	       const ProtobufCServiceDescriptor *svc, const char *method,
	       const ProtobufCMessage *req, int64_t timeout_ms, rpc_done_fn done,
	       void *arg, refit_err_t *err)
{
	acall_t *a;
	const ProtobufCMethodDescriptor *md = NULL;

	for (unsigned i = 0; i < svc->n_methods; i++)
		if (strcmp(svc->methods[i].name, method) == 0)
			md = &svc->methods[i];
	if (md == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rpc: %s has no method %s",
				     svc->name, method);
	a = xcalloc(1, sizeof(*a));
	a->target = xstrdup(target);
	if (o != NULL)
		a->opts = *o;
	if (o && o->token) {
		a->token = xstrdup(o->token);
		a->opts.token = a->token;
	}
	a->svc = svc;
	a->md = md;
	a->len = protobuf_c_message_get_packed_size(req);
	a->req = xmalloc(a->len ? a->len : 1);
	protobuf_c_message_pack(req, a->req);
	a->timeout_ms = timeout_ms;
	a->done = done;
	a->arg = arg;
	a->w.data = a;
	if (uv_queue_work(loop, &a->w, work, after) != 0) {
		free(a->target);
		free(a->token);
		free(a->req);
		free(a);
		return refit_err_set(err, REFIT_ERR_SYS, "rpc: cannot queue a call");
	}
	return REFIT_OK;
}
