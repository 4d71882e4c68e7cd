/*
 * rpc_client.c - synchronous unary calls with a deadline (credentials:
 * rpc_tls.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "codec/json.h"
#include "common/alloc.h"
#include "rpc/rpc_internal.h"

struct rpc_client {
	grpc_channel *ch;
	char *target;
	char *auth;  /* "Bearer <token>" or NULL */
};

grpc_arg
rpc_arg_int(const char *key, int value)
{
	grpc_arg a;

	memset(&a, 0, sizeof(a));
	a.type = GRPC_ARG_INTEGER;
	a.key = (char *)key;
	a.value.integer = value;
	return a;
}

void
rpc_channel_args(grpc_arg *args, size_t max_msg)
{
	args[0] = rpc_arg_int(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, (int)max_msg);
	args[1] = rpc_arg_int(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, (int)max_msg);
	/* a restarted peer is found again within a second, not after gRPC's
	 * default back-off (up to two minutes); the minimum is also the time a
	 * connection attempt gets (TLS over a slow link needs a few seconds) */
	args[2] = rpc_arg_int(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
	args[3] = rpc_arg_int(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
	args[4] = rpc_arg_int(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
	/* gRPC retries off (refit's callers retry themselves): gRPC 1.51's
	 * retry filter dereferences the grpc-status of an answer's trailers
	 * unchecked and aborts the process when a peer ends a call without one
	 * (seen once as etcd over TLS stopped; grpc/grpc#34683).  Without it
	 * the call fails UNKNOWN "No status received", an error like any
	 * other (tests/integration/nostatus_peer.py). */
	args[5] = rpc_arg_int(GRPC_ARG_ENABLE_RETRIES, 0);
}

rpc_client_t *
rpc_client_new(const char *target, const rpc_client_opts_t *o, refit_err_t *err)
{
	size_t max = o && o->max_msg_bytes ? o->max_msg_bytes : RPC_DEFAULT_MAX_MSG;
	grpc_arg args[RPC_CHANNEL_ARGS + 1];
	grpc_channel_args ca = {RPC_CHANNEL_ARGS, args};
	grpc_channel_credentials *creds;
	rpc_client_t *c;
	rpc_tls_t none = {0};

	if (rpc_channel_creds(o ? &o->tls : &none, &creds, err) != REFIT_OK)
		return NULL;
	grpc_init();
	c = xcalloc(1, sizeof(*c));
	c->target = xstrdup(target);
	rpc_channel_args(args, max);
	if (o && o->tls.server_name && o->tls.ca_file) /* mutual TLS names */
		args[ca.num_args++] = rpc_arg_str(GRPC_SSL_TARGET_NAME_OVERRIDE_ARG,
						  o->tls.server_name);
	c->ch = grpc_channel_create(target, creds, &ca);
	grpc_channel_credentials_release(creds);
	if (o && o->token && o->token[0]) {
		size_t n = strlen(o->token) + 8;

		c->auth = xmalloc(n);
		snprintf(c->auth, n, "Bearer %s", o->token);
	}
	return c;
}

void
rpc_client_free(rpc_client_t *c)
{
	if (c == NULL)
		return;
	grpc_channel_destroy(c->ch);
	free(c->target);
	free(c->auth);
	free(c);
	grpc_shutdown();
}

const char *
rpc_client_target(const rpc_client_t *c)
{
	return c->target;
}

grpc_channel *
rpc_client_channel(rpc_client_t *c)
{
	return c->ch;
}

const ProtobufCMethodDescriptor *
rpc_method_of(const ProtobufCServiceDescriptor *svc, const char *name)
{
	for (unsigned i = 0; i < svc->n_methods; i++)
		if (strcmp(svc->methods[i].name, name) == 0)
			return &svc->methods[i];
	return NULL;
}

/* Run the whole unary exchange as one batch; wait at most timeout + 1 s. */
static refit_status_t
exchange(rpc_client_t *c, grpc_call *call, grpc_completion_queue *cq,
	 grpc_byte_buffer *req, grpc_byte_buffer **resp, grpc_status_code *code,
	 grpc_slice *details, int64_t timeout_ms, refit_err_t *err)
{
	grpc_metadata auth;
	grpc_metadata_array init_md, trail_md;
	grpc_op ops[6];
	grpc_event ev;
	refit_status_t rc = REFIT_OK;

	memset(ops, 0, sizeof(ops));
	grpc_metadata_array_init(&init_md);
	grpc_metadata_array_init(&trail_md);
	ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
	if (c->auth) {
		memset(&auth, 0, sizeof(auth));
		auth.key = grpc_slice_from_static_string("authorization");
		auth.value = grpc_slice_from_copied_string(c->auth);
		ops[0].data.send_initial_metadata.count = 1;
		ops[0].data.send_initial_metadata.metadata = &auth;
	}
	ops[1].op = GRPC_OP_SEND_MESSAGE;
	ops[1].data.send_message.send_message = req;
	ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
	ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
	ops[3].data.recv_initial_metadata.recv_initial_metadata = &init_md;
	ops[4].op = GRPC_OP_RECV_MESSAGE;
	ops[4].data.recv_message.recv_message = resp;
	ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
	ops[5].data.recv_status_on_client.trailing_metadata = &trail_md;
	ops[5].data.recv_status_on_client.status = code;
	ops[5].data.recv_status_on_client.status_details = details;
	if (grpc_call_start_batch(call, ops, 6, (void *)1, NULL) != GRPC_CALL_OK) {
		rc = refit_err_set(err, REFIT_ERR_INTERNAL, "rpc: cannot start a call");
	} else {
		ev = grpc_completion_queue_pluck(cq, (void *)1,
						 gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
							      gpr_time_from_millis(timeout_ms + 1000,
										   GPR_TIMESPAN)),
						 NULL);
		if (ev.type != GRPC_OP_COMPLETE) {
			/* gRPC enforces the deadline itself; this is a backstop */
			grpc_call_cancel(call, NULL);
			grpc_completion_queue_pluck(cq, (void *)1,
						    gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
			rc = refit_err_set(err, REFIT_ERR_TIMEOUT, "%s: no answer within %lld ms",
					   c->target, (long long)timeout_ms);
		}
	}
	if (c->auth)
		grpc_slice_unref(auth.value);
	grpc_metadata_array_destroy(&init_md);
	grpc_metadata_array_destroy(&trail_md);
	return rc;
}

refit_status_t
rpc_client_call(rpc_client_t *c, const ProtobufCServiceDescriptor *svc,
		const char *method, const ProtobufCMessage *req, ProtobufCMessage **resp,
		int64_t timeout_ms, refit_err_t *err)
{
	const ProtobufCMethodDescriptor *md = rpc_method_of(svc, method);
	grpc_completion_queue *cq;
	grpc_call *call;
	grpc_byte_buffer *rb = NULL, *sb;
	grpc_status_code code = GRPC_STATUS_UNKNOWN;
	grpc_slice details = grpc_empty_slice(), sl;
	char path[256];
	refit_status_t rc;

	*resp = NULL;
	if (md == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "rpc: %s has no method %s",
				     svc->name, method);
	snprintf(path, sizeof(path), "/%s/%s", svc->name, method);
	sl = grpc_slice_malloc(protobuf_c_message_get_packed_size(req));
	protobuf_c_message_pack(req, GRPC_SLICE_START_PTR(sl));
	sb = grpc_raw_byte_buffer_create(&sl, 1);
	grpc_slice_unref(sl);
	cq = grpc_completion_queue_create_for_pluck(NULL);
	sl = grpc_slice_from_copied_string(path); /* gRPC keeps it: path is on this stack */
	call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq, sl, NULL,
					gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
						     gpr_time_from_millis(timeout_ms, GPR_TIMESPAN)),
					NULL);
	grpc_slice_unref(sl);
	rc = exchange(c, call, cq, sb, &rb, &code, &details, timeout_ms, err);
	if (rc == REFIT_OK && code != GRPC_STATUS_OK) {
		char *d = grpc_slice_to_c_string(details);

		rc = refit_err_set(err, rpc_status_from_grpc(code), "%s %s: %s: %s", c->target,
				   method, rpc_grpc_code_name(code), d);
		gpr_free(d);
	} else if (rc == REFIT_OK) {
		grpc_byte_buffer_reader rd;
		grpc_slice all;

		if (rb == NULL || !grpc_byte_buffer_reader_init(&rd, rb)) {
			rc = refit_err_set(err, REFIT_ERR_REMOTE, "%s %s: empty answer",
					   c->target, method);
		} else {
			all = grpc_byte_buffer_reader_readall(&rd);
			grpc_byte_buffer_reader_destroy(&rd);
			*resp = protobuf_c_message_unpack(md->output, NULL, GRPC_SLICE_LENGTH(all),
							  GRPC_SLICE_START_PTR(all));
			grpc_slice_unref(all);
			if (*resp == NULL)
				rc = refit_err_set(err, REFIT_ERR_REMOTE, "%s %s: answer does not "
						   "decode as %s", c->target, method,
						   md->output->name);
		}
	}
	grpc_slice_unref(details);
	if (rb)
		grpc_byte_buffer_destroy(rb);
	grpc_byte_buffer_destroy(sb);
	grpc_call_unref(call);
	grpc_completion_queue_shutdown(cq);
	grpc_completion_queue_destroy(cq);
	return rc;
}
