/*
 * etcd.c - the etcd v3 client of etcd.h: each call is one unary exchange
 * over rpc_client_call (LeaseKeepAlive, a stream in etcd, is one request
 * and one answer on a stream of its own: etcd answers each request and
 * ends the stream when the client closes its side).  The messages are
 * proto/etcd/'s, generated into build/gen and compiled here, their only
 * user.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "rpc/etcd.h"
#include "rpc/rpc.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include "etcd/kv.pb-c.c"
#include "etcd/etcd.pb-c.c"
#pragma GCC diagnostic pop

#define ETCD_MAX_ENDPOINTS 16

struct etcd {
	char *eps[ETCD_MAX_ENDPOINTS];
	rpc_client_t *cli[ETCD_MAX_ENDPOINTS];
	size_t n, cur;
	int64_t timeout_ms;
	bool tls;  /* a failed call names TLS: a refused handshake reads as
		      "unreachable" in gRPC's words */
};

etcd_t *
etcd_new(const char *endpoints, int64_t timeout_ms, const rpc_tls_t *tls,
	 refit_err_t *err)
{
	rpc_client_opts_t co = {0};
	etcd_t *e;
	char *list, *tok, *save = NULL;

	if (endpoints == NULL || endpoints[0] == '\0') {
		refit_err_set(err, REFIT_ERR_INVALID_ARG, "etcd: no endpoints (etcd_endpoints)");
		return NULL;
	}
	e = xcalloc(1, sizeof(*e));
	e->timeout_ms = timeout_ms;
	list = xstrdup(endpoints);
	for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		while (*tok == ' ')
			tok++;
		if (*tok == '\0')
			continue;
		if (e->n == ETCD_MAX_ENDPOINTS || strchr(tok, ':') == NULL) {
			refit_err_set(err, REFIT_ERR_INVALID_ARG, "etcd: endpoint \"%s\" of \"%s\" "
				      "is not host:port, or more than %d endpoints", tok,
				      endpoints, ETCD_MAX_ENDPOINTS);
			free(list);
			etcd_free(e);
			return NULL;
		}
		e->eps[e->n++] = xstrdup(tok);
	}
	free(list);
	if (e->n == 0) {
		refit_err_set(err, REFIT_ERR_INVALID_ARG, "etcd: no endpoints in \"%s\"", endpoints);
		etcd_free(e);
		return NULL;
	}
	/* TLS: gRPC verifies each endpoint by its host (the certificate's SAN
	 * names it: a DNS name, or an IP address), unless tls->server_name */
	if (tls != NULL)
		co.tls = *tls;
	e->tls = co.tls.ca_file != NULL && co.tls.ca_file[0] != '\0';
	for (size_t i = 0; i < e->n; i++)
		if ((e->cli[i] = rpc_client_new(e->eps[i], &co, err)) == NULL) {
			refit_err_prefix(err, "etcd");
			etcd_free(e);
			return NULL;
		}
	return e;
}

void
etcd_free(etcd_t *e)
{
	if (e == NULL)
		return;
	for (size_t i = 0; i < e->n; i++) {
		rpc_client_free(e->cli[i]);
		free(e->eps[i]);
	}
	free(e);
}

const char *
etcd_endpoint(const etcd_t *e)
{
	return e->eps[e->cur];
}

size_t
etcd_endpoint_count(const etcd_t *e)
{
	return e->n;
}

rpc_client_t *
etcd_endpoint_client(etcd_t *e, size_t i, const char **addr)
{
	*addr = e->eps[i % e->n];
	return e->cli[i % e->n];
}

bool
etcd_tls(const etcd_t *e)
{
	return e->tls;
}

void
etcd_kv_fini(etcd_kv_t *kv)
{
	free(kv->key);
	free(kv->value);
	memset(kv, 0, sizeof(*kv));
}

/* svc.method(req) on the current endpoint, then each other one once while
 * the answer is "unreachable". */
static refit_status_t
call(etcd_t *e, const ProtobufCServiceDescriptor *svc, const char *method,
     const ProtobufCMessage *req, ProtobufCMessage **resp, refit_err_t *err)
{
	refit_status_t rc = REFIT_ERR_INTERNAL;

	for (size_t tries = 0; tries < e->n; tries++) {
		refit_err_clear(err);
		rc = rpc_client_call(e->cli[e->cur], svc, method, req, resp, e->timeout_ms, err);
		if (rc != REFIT_ERR_UNAVAILABLE && rc != REFIT_ERR_TIMEOUT)
			break;
		if (tries + 1 < e->n)
			e->cur = (e->cur + 1) % e->n;
	}
	if (rc != REFIT_OK) {
		refit_err_prefix(err, e->tls ? "etcd (TLS)" : "etcd");
		/* etcd down or cut off: the caller's change cannot be made durable */
		if (rc == REFIT_ERR_TIMEOUT)
			err->status = rc = REFIT_ERR_UNAVAILABLE;
	}
	return rc;
}

static ProtobufCBinaryData
bin(const char *s, size_t len)
{
	ProtobufCBinaryData b = {len, (uint8_t *)s};

	return b;
}

static char *
dup_bin(ProtobufCBinaryData b)
{
	char *s = xmalloc(b.len + 1);

	memcpy(s, b.data, b.len);
	s[b.len] = '\0';
	return s;
}

static void
kv_take(const Mvccpb__KeyValue *kv, etcd_kv_t *out)
{
	out->key = dup_bin(kv->key);
	out->value = dup_bin(kv->value);
	out->value_len = kv->value.len;
	out->create_rev = kv->create_revision;
	out->mod_rev = kv->mod_revision;
	out->lease = kv->lease;
}

char *
etcd_prefix_end(const char *prefix)
{
	char *end = xstrdup(prefix);
	size_t n = strlen(end);

	while (n > 0 && (unsigned char)end[n - 1] == 0xff)
		end[--n] = '\0';
	if (n > 0)
		end[n - 1]++;
	return end;
}

static refit_status_t
range(etcd_t *e, Etcdserverpb__RangeRequest *rq, etcd_kv_t *out, refit_err_t *err)
{
	ProtobufCMessage *resp = NULL;
	refit_status_t rc;

	memset(out, 0, sizeof(*out));
	rc = call(e, &etcdserverpb__kv__descriptor, "Range", &rq->base, &resp, err);
	if (rc == REFIT_OK) {
		const Etcdserverpb__RangeResponse *rr = (const void *)resp;

		if (rr->n_kvs > 0)
			kv_take(rr->kvs[0], out);
		out->read_rev = rr->header ? rr->header->revision : 0;
	}
	if (resp)
		protobuf_c_message_free_unpacked(resp, NULL);
	return rc;
}

refit_status_t
etcd_get(etcd_t *e, const char *key, etcd_kv_t *out, refit_err_t *err)
{
	Etcdserverpb__RangeRequest rq = ETCDSERVERPB__RANGE_REQUEST__INIT;

	rq.key = bin(key, strlen(key));
	return range(e, &rq, out, err);
}

refit_status_t
etcd_first_created(etcd_t *e, const char *prefix, etcd_kv_t *out, refit_err_t *err)
{
	Etcdserverpb__RangeRequest rq = ETCDSERVERPB__RANGE_REQUEST__INIT;
	char *end = etcd_prefix_end(prefix);
	refit_status_t rc;

	rq.key = bin(prefix, strlen(prefix));
	rq.range_end = bin(end, strlen(end));
	rq.limit = 1;
	rq.sort_order = ETCDSERVERPB__RANGE_REQUEST__SORT_ORDER__ASCEND;
	rq.sort_target = ETCDSERVERPB__RANGE_REQUEST__SORT_TARGET__CREATE;
	rc = range(e, &rq, out, err);
	free(end);
	return rc;
}

/* Txn(compare; success: put) -> the answer (free it) */
static refit_status_t
txn_put(etcd_t *e, Etcdserverpb__Compare *cmp, Etcdserverpb__PutRequest *put,
	Etcdserverpb__RangeRequest *on_fail, Etcdserverpb__TxnResponse **out, refit_err_t *err)
{
	Etcdserverpb__TxnRequest rq = ETCDSERVERPB__TXN_REQUEST__INIT;
	Etcdserverpb__RequestOp ok = ETCDSERVERPB__REQUEST_OP__INIT;
	Etcdserverpb__RequestOp no = ETCDSERVERPB__REQUEST_OP__INIT;
	Etcdserverpb__Compare *cp[1] = {cmp};
	Etcdserverpb__RequestOp *okp[1] = {&ok}, *nop[1] = {&no};

	ok.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
	ok.request_put = put;
	rq.compare = cp;
	rq.n_compare = 1;
	rq.success = okp;
	rq.n_success = 1;
	if (on_fail) {
		no.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE;
		no.request_range = on_fail;
		rq.failure = nop;
		rq.n_failure = 1;
	}
	return call(e, &etcdserverpb__kv__descriptor, "Txn", &rq.base, (ProtobufCMessage **)out,
		    err);
}

refit_status_t
etcd_create(etcd_t *e, const char *key, const char *value, int64_t lease, int64_t *create_rev,
	    refit_err_t *err)
{
	Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT;
	Etcdserverpb__PutRequest put = ETCDSERVERPB__PUT_REQUEST__INIT;
	Etcdserverpb__RangeRequest get = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__TxnResponse *tr = NULL;
	refit_status_t rc;

	cmp.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
	cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE;
	cmp.key = bin(key, strlen(key));
	cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION;
	cmp.create_revision = 0;
	put.key = cmp.key;
	put.value = bin(value, strlen(value));
	put.lease = lease;
	get.key = cmp.key;
	*create_rev = 0;
	if ((rc = txn_put(e, &cmp, &put, &get, &tr, err)) != REFIT_OK)
		return rc;
	if (tr->succeeded && tr->header)
		*create_rev = tr->header->revision;
	else if (!tr->succeeded && tr->n_responses == 1 &&
		 tr->responses[0]->response_case ==
			 ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_RANGE &&
		 tr->responses[0]->response_range->n_kvs == 1)
		*create_rev = tr->responses[0]->response_range->kvs[0]->create_revision;
	if (*create_rev == 0)
		rc = refit_err_set(err, REFIT_ERR_REMOTE, "etcd %s: Txn creating \"%s\": no "
				   "revision in the answer", etcd_endpoint(e), key);
	protobuf_c_message_free_unpacked(&tr->base, NULL);
	return rc;
}

refit_status_t
etcd_put_if(etcd_t *e, const char *guard, int64_t guard_rev, const char *key, const char *value,
	    size_t len, bool *ok, refit_err_t *err)
{
	Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT;
	Etcdserverpb__PutRequest put = ETCDSERVERPB__PUT_REQUEST__INIT;
	Etcdserverpb__TxnResponse *tr = NULL;
	refit_status_t rc;

	cmp.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
	cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE;
	cmp.key = bin(guard, strlen(guard));
	cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION;
	cmp.create_revision = guard_rev;
	put.key = bin(key, strlen(key));
	put.value = bin(value, len);
	*ok = false;
	if ((rc = txn_put(e, &cmp, &put, NULL, &tr, err)) != REFIT_OK)
		return rc;
	*ok = tr->succeeded;
	protobuf_c_message_free_unpacked(&tr->base, NULL);
	return REFIT_OK;
}

refit_status_t
etcd_txn_if(etcd_t *e, const char *guard, int64_t guard_rev, const etcd_op_t *ops, size_t n,
	    bool *ok, refit_err_t *err)
{
	Etcdserverpb__TxnRequest rq = ETCDSERVERPB__TXN_REQUEST__INIT;
	Etcdserverpb__Compare cmp = ETCDSERVERPB__COMPARE__INIT;
	Etcdserverpb__Compare *cp[1] = {&cmp};
	Etcdserverpb__RequestOp *op = xcalloc(n ? n : 1, sizeof(*op));
	Etcdserverpb__RequestOp **opp = xcalloc(n ? n : 1, sizeof(*opp));
	Etcdserverpb__PutRequest *put = xcalloc(n ? n : 1, sizeof(*put));
	Etcdserverpb__DeleteRangeRequest *del = xcalloc(n ? n : 1, sizeof(*del));
	Etcdserverpb__TxnResponse *tr = NULL;
	refit_status_t rc;

	cmp.result = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL;
	cmp.target = ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE;
	cmp.key = bin(guard, strlen(guard));
	cmp.target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION;
	cmp.create_revision = guard_rev;
	for (size_t i = 0; i < n; i++) {
		etcdserverpb__request_op__init(&op[i]);
		opp[i] = &op[i];
		if (ops[i].del) {
			etcdserverpb__delete_range_request__init(&del[i]);
			del[i].key = bin(ops[i].key, strlen(ops[i].key));
			op[i].request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE;
			op[i].request_delete_range = &del[i];
		} else {
			etcdserverpb__put_request__init(&put[i]);
			put[i].key = bin(ops[i].key, strlen(ops[i].key));
			put[i].value = bin(ops[i].value, ops[i].len);
			op[i].request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
			op[i].request_put = &put[i];
		}
	}
	rq.compare = cp;
	rq.n_compare = 1;
	rq.success = opp;
	rq.n_success = n;
	*ok = false;
	rc = call(e, &etcdserverpb__kv__descriptor, "Txn", &rq.base, (ProtobufCMessage **)&tr,
		  err);
	if (rc == REFIT_OK) {
		*ok = tr->succeeded;
		protobuf_c_message_free_unpacked(&tr->base, NULL);
	}
	free(op);
	free(opp);
	free(put);
	free(del);
	return rc;
}

refit_status_t
etcd_keys(etcd_t *e, const char *prefix, char ***keys, size_t *n, refit_err_t *err)
{
	Etcdserverpb__RangeRequest rq = ETCDSERVERPB__RANGE_REQUEST__INIT;
	Etcdserverpb__RangeResponse *rr = NULL;
	char *end = etcd_prefix_end(prefix);
	refit_status_t rc;

	*keys = NULL;
	*n = 0;
	rq.key = bin(prefix, strlen(prefix));
	rq.range_end = bin(end, strlen(end));
	rq.keys_only = true;
	rc = call(e, &etcdserverpb__kv__descriptor, "Range", &rq.base, (ProtobufCMessage **)&rr,
		  err);
	free(end);
	if (rc != REFIT_OK)
		return rc;
	*keys = xcalloc(rr->n_kvs ? rr->n_kvs : 1, sizeof(**keys));
	for (size_t i = 0; i < rr->n_kvs; i++)
		(*keys)[i] = dup_bin(rr->kvs[i]->key);
	*n = rr->n_kvs;
	protobuf_c_message_free_unpacked(&rr->base, NULL);
	return REFIT_OK;
}

refit_status_t
etcd_delete(etcd_t *e, const char *key, refit_err_t *err)
{
	Etcdserverpb__DeleteRangeRequest rq = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
	ProtobufCMessage *resp = NULL;
	refit_status_t rc;

	rq.key = bin(key, strlen(key));
	rc = call(e, &etcdserverpb__kv__descriptor, "DeleteRange", &rq.base, &resp, err);
	if (resp)
		protobuf_c_message_free_unpacked(resp, NULL);
	return rc;
}

refit_status_t
etcd_lease_grant(etcd_t *e, int64_t ttl_s, int64_t *id, refit_err_t *err)
{
	Etcdserverpb__LeaseGrantRequest rq = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
	Etcdserverpb__LeaseGrantResponse *r = NULL;
	refit_status_t rc;

	rq.ttl = ttl_s;
	*id = 0;
	rc = call(e, &etcdserverpb__lease__descriptor, "LeaseGrant", &rq.base,
		  (ProtobufCMessage **)&r, err);
	if (rc != REFIT_OK)
		return rc;
	if (r->error && r->error[0])
		rc = refit_err_set(err, REFIT_ERR_REMOTE, "etcd %s: LeaseGrant: %s",
				   etcd_endpoint(e), r->error);
	else
		*id = r->id;
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return rc;
}

refit_status_t
etcd_lease_keepalive(etcd_t *e, int64_t id, int64_t *ttl_s, refit_err_t *err)
{
	Etcdserverpb__LeaseKeepAliveRequest rq = ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;
	Etcdserverpb__LeaseKeepAliveResponse *r = NULL;
	refit_status_t rc;

	rq.id = id;
	*ttl_s = 0;
	rc = call(e, &etcdserverpb__lease__descriptor, "LeaseKeepAlive", &rq.base,
		  (ProtobufCMessage **)&r, err);
	if (rc != REFIT_OK)
		return rc;
	*ttl_s = r->ttl;
	protobuf_c_message_free_unpacked(&r->base, NULL);
	return REFIT_OK;
}

refit_status_t
etcd_lease_revoke(etcd_t *e, int64_t id, refit_err_t *err)
{
	Etcdserverpb__LeaseRevokeRequest rq = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
	ProtobufCMessage *resp = NULL;
	refit_status_t rc;

	rq.id = id;
	rc = call(e, &etcdserverpb__lease__descriptor, "LeaseRevoke", &rq.base, &resp, err);
	if (resp)
		protobuf_c_message_free_unpacked(resp, NULL);
	return rc;
}
