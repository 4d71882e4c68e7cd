/*
 * node_local.c - librefit clients on a node: the Local service on the
 * node's unix socket (its handlers, the held WaitVersion and BeginWrite
 * calls, start and stop).  The clients' memory is node_mem.c's, their
 * bookkeeping node_client.c's.
 *
 * RegisterClient checks a client's memory before anything is forwarded:
 * every piece of every tensor on the ranks this node serves needs memory,
 * each segment must have been passed to this node and be large enough for
 * the piece at its offset and strides (both copies for a double-buffered
 * inference client).  Memory comes only as memfds sealed against shrinking
 * (F_SEAL_SHRINK), passed with SCM_RIGHTS over the memory socket
 * (<local socket>.mem): a client cannot truncate memory the node has mapped
 * (no SIGBUS here), and no segment has a name another process could open.  Only then is the layout registered with the coordinator, and
 * the client exists here only once the coordinator accepted it: nothing
 * is half-registered.  A client whose process exits is dropped (the sweep
 * timer looks every 50 ms), and slices using its memory fail naming it;
 * the mapping stays valid until they stop.
 *
 * Who calls: the Local server accepts its connections itself and records
 * each one's SO_PEERCRED (rpc_unix.c).  RegisterClient's pid must be the
 * caller's; the client belongs to that process, and every call naming its
 * id from another process is refused PERMISSION_DENIED naming the client
 * (node_client_owned).  The memory socket's segments serve a registration
 * only when the same process passed them (node_mem.c).
 */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/log.h"
#include "daemon/metrics.h"
#include "daemon/node/node_internal.h"
#include "rpc/proto_conv.h"
#include "daemon/transport/transport.h"

#define CALL_MS 10000

static const char *
nz(const char *s)
{
	return s ? s : "";
}

/* ---- state ------------------------------------------------------------------ */

static void
state_msg(const client_t *c, Refit__V1__ClientState *s)
{
	refit__v1__client_state__init(s);
	s->version = c->version;
	s->active = c->active;
	s->valid = c->valid;
	s->reading = c->reading > 0;
	s->failure = c->failure ? c->failure : "";
	s->serving = c->serving;
}

static void
reply_state(rpc_call_t *call, const client_t *c)
{
	Refit__V1__ClientState s;

	state_msg(c, &s);
	rpc_call_reply(call, &s.base);
}

/* ---- Local service ------------------------------------------------------------ */

static void
h_hello(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	Refit__V1__HelloResponse rsp = REFIT__V1__HELLO_RESPONSE__INIT;

	(void)msg;
	rsp.node_id = n->node_id;
	rsp.ranks = n->ranks;
	rsp.n_ranks = n->nranks;
	rsp.epoch = n->epoch;
	rsp.joined = n->member_id != 0;
	rpc_call_reply(call, &rsp.base);
}

typedef struct regjob {
	node_t *n;
	rpc_call_t *call;
	client_t *c;
} regjob_t;

/* A client id is its capability on the local socket: random, so one process
 * cannot act on another's registration by counting (never 0, never one in
 * use). */
static uint64_t
new_client_id(node_t *n)
{
	uint64_t id = 0;

	while (id == 0 || node_client(n, id) != NULL)
		if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id))
			id = ++n->next_client; /* no entropy: still unique */
	return id;
}

static void
on_registered(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	regjob_t *j = arg;
	node_t *n = j->n;
	client_t *c = j->c;

	n->inflight--;
	if (st != REFIT_OK || n->closing) {
		rpc_call_fail(j->call, st != REFIT_OK ? st : REFIT_ERR_UNAVAILABLE,
			      "register model \"%s\": %s", c->model,
			      st != REFIT_OK ? msg : "the node daemon is shutting down");
		node_client_free(n, c);
	} else {
		Refit__V1__LocalRegisterResponse rsp = REFIT__V1__LOCAL_REGISTER_RESPONSE__INIT;
		const Refit__V1__RegisterLayoutResponse *r = (const void *)resp;

		snprintf(c->digest, sizeof(c->digest), "%s", nz(r->layout_digest));
		c->id = new_client_id(n);
		VEC_PUSH(&n->clients, c);
		if (c->partial)
			node_group_forwarded(n, c, c->digest, true);
		log_info("node %s: librefit client %" PRIu64 " (pid %d, uid %u): model \"%s\" %s "
			 "\"%s\", %zu tensors, %zu pieces here, %s", n->node_id, c->id, c->pid, c->uid,
			 c->model, c->role == REFIT__V1__ROLE__TRAIN ? "trainer" : "instance",
			 c->instance, c->layouts.n, c->mem.n,
			 c->role == REFIT__V1__ROLE__TRAIN ? "source" :
			 c->install == REFIT__V1__INSTALL_MODE__IN_PLACE ? "in-place" :
			 "double-buffer");
		rsp.client_id = c->id;
		rsp.layout_digest = c->digest;
		rpc_call_reply(j->call, &rsp.base);
	}
	free(j);
	node_maybe_free(n);
}

/*
 * The client's tensors' layouts into c->layouts, for this node's own use
 * (its memory checks, then slices).  The layouts themselves are validated
 * by the planner on the way, as every struct is built; the checks of the
 * registration as a whole (coverage, ranks held by members, agreement with
 * the other side) are the coordinator's.
 */
static refit_status_t
local_layouts(client_t *c, const Refit__V1__LocalRegisterRequest *rq,
	      Refit__V1__TensorLayout **v, refit_err_t *err)
{
	for (size_t i = 0; i < rq->n_tensors; i++) {
		v[i] = rq->tensors[i]->layout;
		if (v[i] == NULL)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tensors[%zu] has no "
					     "layout", i);
	}
	return conv_layouts_from_proto(v, rq->n_tensors, &c->layouts, err);
}

static void reg_continue(node_t *n, rpc_call_t *call, client_t *c,
			 const Refit__V1__LocalRegisterRequest *rq);

/*
 * A registration's CUDA IPC handles are opened on a pool thread, not the
 * loop: cudaSetDevice and cudaIpcOpenMemHandle take the driver's locks,
 * which other threads' device-wide calls hold, and a stalled loop misses
 * heartbeats (the coordinator would expire the node).  The client is not
 * shared until then (not in n->clients); the call (and its request) stay
 * alive until it is answered.
 */
typedef struct openjob {
	uv_work_t w;
	node_t *n;
	rpc_call_t *call;
	client_t *c;
	const Refit__V1__LocalRegisterRequest *rq;
	refit_err_t err;
} openjob_t;

static void
open_work(uv_work_t *w)
{
	openjob_t *j = w->data;

	refit_err_clear(&j->err);
	node_mem_open(j->n, j->c, &j->err);
}

static void
open_after(uv_work_t *w, int status)
{
	openjob_t *j = w->data;
	node_t *n = j->n;

	n->inflight--;
	if (j->err.status == REFIT_OK && (status != 0 || n->closing))
		refit_err_set(&j->err, REFIT_ERR_UNAVAILABLE, "the node daemon is shutting down");
	if (j->err.status != REFIT_OK) {
		rpc_call_fail(j->call, j->err.status, "register \"%s\": %s", nz(j->rq->model),
			      j->err.msg);
		node_client_free(n, j->c);
	} else {
		node_mem_resolve(j->c);
		reg_continue(n, j->call, j->c, j->rq);
	}
	free(j);
	node_maybe_free(n);
}

static void
open_later(node_t *n, rpc_call_t *call, client_t *c, const Refit__V1__LocalRegisterRequest *rq)
{
	openjob_t *j = xcalloc(1, sizeof(*j));

	*j = (openjob_t){.n = n, .call = call, .c = c, .rq = rq};
	j->w.data = j;
	if (uv_queue_work(n->loop, &j->w, open_work, open_after) != 0) {
		rpc_call_fail(call, REFIT_ERR_SYS, "register \"%s\": cannot queue the opening of "
			      "its CUDA memory", nz(rq->model));
		node_client_free(n, c);
		free(j);
		return;
	}
	n->inflight++;
}

/*
 * RegisterClient: the node checks what only it can (the install mode, the
 * process, its own ranks' memory), then forwards the layouts as the client
 * sent them, with its member id; the coordinator checks the registration
 * (the model's name, the role, the layouts against each other and the
 * members).  Errors from there come back prefixed "register model ...".
 */
static void
h_register(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__LocalRegisterRequest *rq = (const void *)msg;
	Refit__V1__TensorLayout **tl;
	client_t *c;
	refit_err_t err;
	rpc_peer_cred_t pc;

	/* the model's name and the role are the coordinator's to check */
	refit_err_clear(&err);
	if (rq->install != REFIT__V1__INSTALL_MODE__DOUBLE_BUFFER &&
	    rq->install != REFIT__V1__INSTALL_MODE__IN_PLACE)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "register \"%s\": unknown "
				     "install mode %d", nz(rq->model), (int)rq->install);
	if (rq->pid == 0 || kill((pid_t)rq->pid, 0) < 0)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "register \"%s\": pid %u is "
				     "not a running process", nz(rq->model), rq->pid);
	if (!rpc_call_peer_cred(call, &pc))
		return rpc_call_refuse(call, REFIT_ERR_PERMISSION_DENIED, "identity", "register "
				       "\"%s\": the calling process is not known (no "
				       "SO_PEERCRED)", nz(rq->model));
	if ((int)rq->pid != pc.pid)
		/* the process registering is the one whose memory, pid and calls
		 * the client's are: no registering for another */
		return rpc_call_refuse(call, REFIT_ERR_PERMISSION_DENIED, "identity", "register "
				       "\"%s\": pid %u is not the caller's (the caller is pid "
				       "%d, uid %u: SO_PEERCRED, in the node daemon's pid "
				       "namespace); a process registers itself only",
				       nz(rq->model), rq->pid, pc.pid, pc.uid);
	if (n->member_id == 0)
		return rpc_call_fail(call, REFIT_ERR_UNAVAILABLE, "register \"%s\": node %s has "
				     "not joined the coordinator yet: retry", nz(rq->model),
				     n->node_id);
	c = xcalloc(1, sizeof(*c));
	c->model = xstrdup(nz(rq->model));
	c->instance = xstrdup(nz(rq->instance));
	c->role = (int)rq->role;
	c->install = (int)rq->install;
	c->pid = pc.pid;
	c->uid = pc.uid;
	c->valid = true;
	c->serving = -1;
	c->xo = n->xo;
	c->x = n->x;
	tl = xcalloc(rq->n_tensors ? rq->n_tensors : 1, sizeof(*tl));
	if (local_layouts(c, rq, tl, &err) == REFIT_OK)
		node_mem_check(n, c, rq, &err);
	free(tl);
	if (err.status != REFIT_OK) {
		rpc_call_fail(call, err.status, "register \"%s\": %s", nz(rq->model), err.msg);
		node_client_free(n, c);
		return;
	}
	if (node_mem_pending(c))
		return open_later(n, call, c, rq);
	reg_continue(n, call, c, rq);
}

/* The registration once its memory is mapped: the layouts' digest, the
 * group, then the coordinator (or, for a group not yet whole, the answer). */
static void
reg_continue(node_t *n, rpc_call_t *call, client_t *c, const Refit__V1__LocalRegisterRequest *rq)
{
	Refit__V1__RegisterLayoutRequest fw = REFIT__V1__REGISTER_LAYOUT_REQUEST__INIT;
	Refit__V1__TensorLayout **tl;
	regjob_t *j;
	refit_err_t err;

	refit_err_clear(&err);
	tl = xcalloc(rq->n_tensors ? rq->n_tensors : 1, sizeof(*tl));
	for (size_t i = 0; i < rq->n_tensors; i++)
		tl[i] = rq->tensors[i]->layout;
	conv_layouts_digest(&c->layouts, c->ldigest);
	if (node_group_check(n, c, &err) != REFIT_OK) {
		rpc_call_fail(call, err.status, "register \"%s\": %s", nz(rq->model), err.msg);
		node_client_free(n, c);
		free(tl);
		return;
	}
	if (c->partial && !node_group_complete(n, c)) {
		/* the coordinator hears of the group when its last member comes */
		Refit__V1__LocalRegisterResponse rsp = REFIT__V1__LOCAL_REGISTER_RESPONSE__INIT;

		c->id = new_client_id(n);
		VEC_PUSH(&n->clients, c);
		log_info("node %s: librefit client %" PRIu64 " (pid %d): model \"%s\" %s \"%s\", "
			 "%zu pieces of some of this node's ranks; the others' clients to come",
			 n->node_id, c->id, c->pid, c->model,
			 c->role == REFIT__V1__ROLE__TRAIN ? "trainer" : "instance", c->instance,
			 c->mem.n);
		rsp.client_id = c->id;
		rsp.layout_digest = c->ldigest;
		rpc_call_reply(call, &rsp.base);
		free(tl);
		return;
	}
	/* forward the layouts as received; the client exists once the coordinator agrees */
	fw.model = c->model;
	fw.role = rq->role;
	fw.instance = c->instance;
	fw.install = rq->install;   /* in place or not: the coordinator shows it */
	fw.tensors = tl;
	fw.n_tensors = rq->n_tensors;
	c->reg_len = protobuf_c_message_get_packed_size(&fw.base);
	c->reg = xmalloc(c->reg_len ? c->reg_len : 1);
	protobuf_c_message_pack(&fw.base, c->reg);
	fw.member_id = n->member_id;
	j = xcalloc(1, sizeof(*j));
	*j = (regjob_t){n, call, c};
	if (rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
			   &refit__v1__coordinator__descriptor, "RegisterLayout", &fw.base,
			   CALL_MS, on_registered, j, &err) != REFIT_OK) {
		rpc_call_fail(call, err.status, "register \"%s\": %s", nz(rq->model), err.msg);
		node_client_free(n, c);
		free(j);
	} else {
		n->inflight++;
	}
	free(tl);
}

static client_t *
find_or_fail(node_t *n, rpc_call_t *call, uint64_t id, int role)
{
	client_t *c = node_client(n, id);

	if (c == NULL) {
		rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "node %s: no librefit client %" PRIu64
			      " (never registered, unregistered, or the node restarted)",
			      n->node_id, id);
		return NULL;
	}
	if (!node_client_owned(call, c))
		return NULL;
	if (role && c->role != role) {
		rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "client %" PRIu64 " is %s: this call "
			      "is for %s clients", id, c->role == REFIT__V1__ROLE__TRAIN ?
			      "a trainer" : "an inference instance",
			      role == REFIT__V1__ROLE__TRAIN ? "trainer" : "inference");
		return NULL;
	}
	return c;
}

typedef struct readyjob {
	node_t *n;
	rpc_call_t *call;
	uint64_t client_id, version;
	uint32_t resent;            /* to another coordinator (several: docs/ha.md) */
	const char *to;             /* the coordinator it went to (one of n->coords) */
} readyjob_t;

static refit_status_t send_ready(node_t *n, const client_t *c, readyjob_t *j,
				 refit_err_t *err);

static void
on_ready_fw(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	readyjob_t *j = arg;
	node_t *n = j->n;
	client_t *c = node_client(n, j->client_id);

	refit_err_t err;

	(void)resp;
	n->inflight--;
	refit_err_clear(&err);
	if (c != NULL && !n->closing && j->resent < 2 * n->ncoords &&
	    (st == REFIT_ERR_UNAVAILABLE || st == REFIT_ERR_TIMEOUT) &&
	    strstr(msg, "etcd") == NULL &&
	    (j->to != n->coordinator || n->hooks->follow(n, st, msg))) {
		/* a standby named the leader, or this one is unreachable: there */
		j->resent++;
		if (send_ready(n, c, j, &err) == REFIT_OK)
			return;
		st = err.status;
		msg = err.msg;
	}
	if (st != REFIT_OK)
		rpc_call_fail(j->call, st, "weights ready: %s", msg);
	else if (c == NULL)
		rpc_call_fail(j->call, REFIT_ERR_NOT_FOUND, "client %" PRIu64 " went away",
			      j->client_id);
	else
		reply_state(j->call, c);
	free(j);
	node_maybe_free(n);
}

/* The CUDA events of a WeightsReady (docs/gpu.md, "Stream ordering"):
 * checked whole, then they replace the client's, or nothing changes. */
static refit_status_t
take_events(node_t *n, client_t *c, const Refit__V1__ClientRequest *rq, refit_err_t *err)
{
	xport_event_t *ev;

	if (rq->n_cuda_events > NODE_READY_EVENTS_MAX)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%zu CUDA events: at most %d "
				     "(one per device the trainer wrote on)", rq->n_cuda_events,
				     NODE_READY_EVENTS_MAX);
	if (rq->n_cuda_events > 0 && n->xo->memory != XPORT_MEM_DEVICE)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "CUDA events given, but node %s's "
				     "transport (%s) reads host memory: none is needed",
				     n->node_id, n->xo->name);
	for (size_t k = 0; k < rq->n_cuda_events; k++)
		if (rq->cuda_events[k].len != XPORT_EVENT_BYTES)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "CUDA event %zu has %zu "
					     "bytes, not %d (a cudaIpcEventHandle_t)", k,
					     rq->cuda_events[k].len, XPORT_EVENT_BYTES);
	ev = rq->n_cuda_events ? xcalloc(rq->n_cuda_events, sizeof(*ev)) : NULL;
	for (size_t k = 0; k < rq->n_cuda_events; k++) {
		memcpy(ev[k].handle, rq->cuda_events[k].data, XPORT_EVENT_BYTES);
		ev[k].client = c->id;
	}
	free(c->events);
	c->events = ev;
	c->nevents = rq->n_cuda_events;
	return REFIT_OK;
}

static void
h_ready(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__ClientRequest *rq = (const void *)msg;
	client_t *c = find_or_fail(n, call, rq->client_id, REFIT__V1__ROLE__TRAIN);
	readyjob_t *j;
	refit_err_t err;

	if (c == NULL)
		return;
	if (rq->version <= c->version && c->readable)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "weights ready: version %"
				     PRIu64 " is not newer than %" PRIu64, rq->version,
				     c->version);
	refit_err_clear(&err);
	if (take_events(n, c, rq, &err) != REFIT_OK)
		return rpc_call_fail(call, err.status, "weights ready: %s", err.msg);
	c->version = rq->version;
	c->readable = true;
	if (c->partial && !(c->forwarded && node_group_ready(n, c, rq->version)))
		/* the coordinator hears of it when every member of the group holds it */
		return reply_state(call, c);
	refit_err_clear(&err);
	j = xcalloc(1, sizeof(*j));
	*j = (readyjob_t){n, call, c->id, rq->version, 0, NULL};
	if (send_ready(n, c, j, &err) != REFIT_OK) {
		free(j);
		return rpc_call_fail(call, err.status, "weights ready: %s", err.msg);
	}
}

/* WeightsReady for j (c's version j->version) to the coordinator. */
static refit_status_t
send_ready(node_t *n, const client_t *c, readyjob_t *j, refit_err_t *err)
{
	Refit__V1__WeightsReadyRequest fw = REFIT__V1__WEIGHTS_READY_REQUEST__INIT;

	fw.member_id = n->member_id;
	fw.model = c->model;
	fw.version = j->version;
	fw.layout_digest = (char *)c->digest;
	j->to = n->coordinator;
	CHECK(rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
			     &refit__v1__coordinator__descriptor, "WeightsReady", &fw.base,
			     CALL_MS, on_ready_fw, j, err));
	n->inflight++;
	return REFIT_OK;
}

static void
add_waiter(node_t *n, rpc_call_t *call, const Refit__V1__ClientRequest *rq, bool bw)
{
	waiter_t w = {call, rq->client_id, rq->version,
		      xport_now_ms() + (int64_t)rq->timeout_ms, bw};

	VEC_PUSH(&n->waiters, w);
	node_waiters_sweep(n);
}

static void
h_begin_write(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__ClientRequest *rq = (const void *)msg;

	if (find_or_fail(n, call, rq->client_id, REFIT__V1__ROLE__TRAIN) == NULL)
		return;
	add_waiter(n, call, rq, true);
}

static void
h_wait(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__ClientRequest *rq = (const void *)msg;

	if (find_or_fail(n, call, rq->client_id, REFIT__V1__ROLE__INFER) == NULL)
		return;
	add_waiter(n, call, rq, false);
}

static void
h_state(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__ClientRequest *rq = (const void *)msg;
	client_t *c = find_or_fail(n, call, rq->client_id, 0);

	if (c != NULL)
		reply_state(call, c);
}

/* The engine reading a double-buffered instance now serves `version`, the
 * one installed (the active copy): slices that would write that copy are
 * refused until it serves another (node_run.c). */
static void
h_serve(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__ClientRequest *rq = (const void *)msg;
	client_t *c = find_or_fail(n, call, rq->client_id, REFIT__V1__ROLE__INFER);

	if (c == NULL)
		return;
	if (c->install != REFIT__V1__INSTALL_MODE__DOUBLE_BUFFER)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "client %" PRIu64 " of model "
				     "\"%s\" is installed in place: Serve is for double buffers",
				     c->id, c->model);
	if (rq->version != c->version || !c->valid || c->version == 0)
		return rpc_call_fail(call, REFIT_ERR_STALE_EPOCH, "client %" PRIu64 " of model "
				     "\"%s\": version %" PRIu64 " is not installed here (installed: "
				     "%" PRIu64 ")", c->id, c->model, rq->version, c->version);
	c->serving = (int32_t)c->active;
	c->served_version = rq->version;
	reply_state(call, c);
}

static void
h_unregister(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__ClientRequest *rq = (const void *)msg;
	client_t *c = find_or_fail(n, call, rq->client_id, 0);

	if (c == NULL)
		return;
	reply_state(call, c);
	node_client_drop(n, c, "unregistered by the client");
}
static const rpc_method_cfg_t local_methods[] = {
	{"Hello", h_hello},
	{"RegisterClient", h_register},
	{"WeightsReady", h_ready},
	{"BeginWrite", h_begin_write},
	{"WaitVersion", h_wait},
	{"GetState", h_state},
	{"Unregister", h_unregister},
	{"Serve", h_serve},
};

/* ---- waiters ---------------------------------------------------------------- */

/* How often the sweep checks that registered clients' processes live when no
 * slice runs (while one runs: every sweep, so a refit into a client that died
 * fails instead of committing into memory nobody reads). */
#define NODE_PID_CHECK_MS 500

/* A process is gone when kill() says so or it is a zombie. */
static bool
pid_gone(int pid)
{
	char path[64], buf[256];
	FILE *f;
	bool zombie = false;

	if (kill(pid, 0) < 0 && errno == ESRCH)
		return true;
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	if ((f = fopen(path, "r")) != NULL) {
		if (fgets(buf, sizeof(buf), f)) {
			char *p = strrchr(buf, ')');

			zombie = p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
		}
		fclose(f);
	}
	return zombie;
}

void
node_waiters_sweep(node_t *n)
{
	int64_t now = xport_now_ms();

	/* Reading /proc/PID/stat for every client 20 times a second was most of
	 * an idle node's CPU (1,024 nodes on 2 cores: over a core). */
	bool check_pids = n->jobs.n || now - n->pids_checked_ms >= NODE_PID_CHECK_MS;

	if (check_pids)
		n->pids_checked_ms = now;
	for (size_t i = 0; check_pids && i < n->clients.n;) {
		client_t *c = n->clients.v[i];

		if (pid_gone(c->pid)) {
			char why[96];

			snprintf(why, sizeof(why), "its process (pid %d) exited", c->pid);
			node_client_drop(n, c, why);
		} else {
			i++;
		}
	}
	for (size_t i = 0; i < n->waiters.n;) {
		waiter_t *w = &n->waiters.v[i];
		client_t *c = node_client(n, w->client_id);
		bool done = true;

		if (c == NULL) {
			rpc_call_fail(w->call, REFIT_ERR_NOT_FOUND, "client %" PRIu64 " was "
				      "dropped while waiting", w->client_id);
		} else if (w->begin_write && c->reading == 0) {
			c->readable = false;
			reply_state(w->call, c);
		} else if (!w->begin_write && c->version >= w->min_version && c->valid &&
			   c->version > 0) {
			reply_state(w->call, c);
		} else if (rpc_call_cancelled(w->call)) {
			rpc_call_fail(w->call, REFIT_ERR_ABORTED, "cancelled by the client");
		} else if (now >= w->deadline_ms) {
			if (w->begin_write)
				rpc_call_fail(w->call, REFIT_ERR_TIMEOUT, "begin write: a refit "
					      "still reads the trainer's buffers");
			else
				rpc_call_fail(w->call, REFIT_ERR_TIMEOUT, "version %" PRIu64
					      " not installed in time (installed %" PRIu64
					      "%s%s%s)", w->min_version, c->version,
					      c->valid ? "" : ", weights invalid",
					      c->failure ? "; last failure: " : "",
					      c->failure ? c->failure : "");
		} else {
			done = false;
		}
		if (done)
			n->waiters.v[i] = n->waiters.v[--n->waiters.n];
		else
			i++;
	}
}

void
node_waiters_fail_all(node_t *n, const char *why)
{
	for (size_t i = 0; i < n->waiters.n; i++)
		rpc_call_fail(n->waiters.v[i].call, REFIT_ERR_UNAVAILABLE, "%s", why);
	n->waiters.n = 0;
}

/* ---- start / stop ----------------------------------------------------------- */

/* local_socket_group's id ((gid_t)-1: unset), looked up before anything starts */
static refit_status_t
socket_gid(const node_opts_t *o, gid_t *gid, refit_err_t *err)
{
	struct group *g;

	*gid = (gid_t)-1;
	if (o->local_socket_group == NULL || !o->local_socket_group[0])
		return REFIT_OK;
	g = getgrnam(o->local_socket_group);
	if (g == NULL)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "node: local_socket_group \"%s\" "
				     "is no group here", o->local_socket_group);
	*gid = g->gr_gid;
	return REFIT_OK;
}

/* Both local sockets mode 0660, in group gid when set: only the daemon's
 * user and that group's processes may register (and pass memory). */
static refit_status_t
socket_access(const node_opts_t *o, gid_t gid, refit_err_t *err)
{
	char mem[sizeof(((struct sockaddr_un *)0)->sun_path) + 8];
	const char *paths[2] = {o->local_socket, mem};

	snprintf(mem, sizeof(mem), "%s.mem", o->local_socket);
	for (int i = 0; i < 2; i++) {
		if (gid != (gid_t)-1 && chown(paths[i], (uid_t)-1, gid) < 0)
			return refit_err_set(err, REFIT_ERR_SYS, "node: chown %s to group %s: %s",
					     paths[i], o->local_socket_group, strerror(errno));
		if (chmod(paths[i], 0660) < 0)
			return refit_err_set(err, REFIT_ERR_SYS, "node: chmod 0660 %s: %s",
					     paths[i], strerror(errno));
	}
	return REFIT_OK;
}

refit_status_t
node_local_start(node_t *n, const node_opts_t *o, refit_err_t *err)
{
	rpc_server_opts_t so = {0};
	char addr[300];
	gid_t gid;

	if (o->local_socket == NULL || o->local_socket[0] != '/')
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "node: local_socket \"%s\" must "
				     "be an absolute path", nz(o->local_socket));
	CHECK(socket_gid(o, &gid, err));
	snprintf(addr, sizeof(addr), "unix:%s", o->local_socket);
	so.listen = addr;
	so.peer_cred = true;   /* who calls: a client acts on its own registrations */
	so.observe = metrics_observe_rpc;
	so.refused = metrics_auth_refused;
	n->local = rpc_server_new(&so, n->loop, err);
	if (n->local == NULL)
		return err->status;
	n->local_path = xstrdup(o->local_socket);
	CHECK(rpc_server_add_service(n->local, &refit__v1__local__descriptor, local_methods,
				     sizeof(local_methods) / sizeof(local_methods[0]), n, err));
	CHECK(rpc_server_add_service(n->local, &refit__v1__local__descriptor, node_engine_methods,
				     node_engine_nmethods, n, err));
	CHECK(rpc_server_start(n->local, NULL, err));
	CHECK(node_mem_listen(n, o->local_socket, err));
	return socket_access(o, gid, err);
}

void
node_local_stop(node_t *n)
{
	if (n->local) {
		rpc_server_drain(n->local);
		rpc_server_free(n->local);
		n->local = NULL;
	}
	while (n->clients.n)
		node_client_drop(n, n->clients.v[0], "the node daemon stopped");
	VEC_FREE(&n->clients);
	VEC_FREE(&n->waiters);
	node_engine_stop(n);
	VEC_FREE(&n->prepared);
	VEC_FREE(&n->jobs);
	VEC_FREE(&n->memconns);
	free(n->local_path);
	free(n->mem_path);
}

void
node_local_close(node_t *n)
{
	node_mem_close(n);
}
