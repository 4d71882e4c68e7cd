/*
 * node_client.c - the librefit clients a node holds: looking one up by id,
 * dropping one (its registration unregistered with the coordinator when it
 * was the last of its trainer or instance here, the slices using it told
 * through node_hooks_t), freeing one when no slice uses its memory (its
 * CUDA IPC mappings closed on a pool thread first), and registering every
 * client again when the node joins again (a coordinator that restarted
 * learns them); whether a Local call comes from the process that
 * registered a client (node_client_owned, by SO_PEERCRED).  Loop thread
 * only, but for the close job.  Calls nothing in node_local.c (the Local
 * service) or node_mem.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/log.h"
#include "daemon/node/node_internal.h"
#include "rpc/proto_conv.h"

#define CALL_MS 10000

static const char *
nz(const char *s)
{
	return s ? s : "";
}

static bool
cuda_open(const client_t *c)
{
	for (size_t i = 0; i < c->segs.n; i++)
		if (c->segs.v[i].cuda && c->segs.v[i].base)
			return true;
	return false;
}

/* cudaIpcCloseMemHandle of each mapping (any thread: nothing else reaches
 * c once its close is queued). */
static void
cuda_close(client_t *c)
{
	for (size_t i = 0; i < c->segs.n; i++)
		if (c->segs.v[i].cuda && c->segs.v[i].base) {
			c->xo->mem_close(c->x, c->segs.v[i].base);
			c->segs.v[i].base = NULL;
		}
}

static void
free_rest(client_t *c)
{
	for (size_t i = 0; i < c->segs.n; i++) {
		free(c->segs.v[i].ipc);
		if (!c->segs.v[i].cuda && c->segs.v[i].base)
			munmap(c->segs.v[i].base, c->segs.v[i].size ? c->segs.v[i].size : 1);
		free(c->segs.v[i].name);
	}
	VEC_FREE(&c->segs);
	VEC_FREE(&c->mem);
	plan_layout_set_fini(&c->layouts);
	free(c->reg);
	free(c->model);
	free(c->instance);
	free(c->failure);
	free(c->events);
	free(c);
}

/*
 * A client's CUDA mappings are closed on a pool thread, like they were
 * opened (node_local.c): cudaIpcCloseMemHandle takes the driver's locks,
 * which other threads' device-wide calls may hold past a lease.  The job
 * counts in n->inflight, so a closing node waits for it before it stops
 * its transport.
 */
typedef struct closejob {
	uv_work_t w;
	node_t *n;
	client_t *c;
} closejob_t;

static void
close_work(uv_work_t *w)
{
	cuda_close(((closejob_t *)w->data)->c);
}

static void
close_after(uv_work_t *w, int status)
{
	closejob_t *j = w->data;
	node_t *n = j->n;

	(void)status;
	cuda_close(j->c);   /* cancelled: not run (a no-op when it ran) */
	free_rest(j->c);
	free(j);
	n->inflight--;
	node_maybe_free(n);
}

void
node_client_free(node_t *n, client_t *c)
{
	closejob_t *j;

	if (!n->closing && cuda_open(c)) {
		j = xcalloc(1, sizeof(*j));
		*j = (closejob_t){.n = n, .c = c};
		j->w.data = j;
		if (uv_queue_work(n->loop, &j->w, close_work, close_after) == 0) {
			n->inflight++;
			return;
		}
		free(j);
		log_warnx("node %s: cannot queue the closing of client %" PRIu64 "'s CUDA "
			  "memory: closed here", n->node_id, c->id);
	}
	/* a stopping node closes them inline: nothing to keep beating for */
	cuda_close(c);
	free_rest(c);
}

client_t *
node_client(node_t *n, uint64_t id)
{
	for (size_t i = 0; i < n->clients.n; i++)
		if (n->clients.v[i]->id == id)
			return n->clients.v[i];
	return NULL;
}

bool
node_client_owned(rpc_call_t *call, const client_t *c)
{
	rpc_peer_cred_t pc;

	if (!rpc_call_peer_cred(call, &pc)) {
		rpc_call_refuse(call, REFIT_ERR_PERMISSION_DENIED, "identity", "client %" PRIu64
				": the calling process is not known (no SO_PEERCRED)", c->id);
		return false;
	}
	if (pc.pid == c->pid)
		return true;
	rpc_call_refuse(call, REFIT_ERR_PERMISSION_DENIED, "identity", "client %" PRIu64
			" (model \"%s\") was registered by pid %d (uid %u); this call comes "
			"from pid %d (uid %u): a process acts on its own registrations only",
			c->id, c->model, c->pid, c->uid, pc.pid, pc.uid);
	return false;
}

void
node_client_release(node_t *n, client_t *c)
{
	if (c->busy > 0)
		c->busy--;
	if (c->dead && c->busy == 0)
		node_client_free(n, c);
}

static void
on_unregistered(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	node_t *n = arg;

	(void)resp;
	n->inflight--;
	if (st != REFIT_OK && st != REFIT_ERR_NOT_FOUND)
		log_warnx("node %s: UnregisterLayout: %s", n->node_id, msg);
	node_maybe_free(n);
}

/* The last client of (model, role, instance) here went: tell the coordinator,
 * so a replica whose processes are gone does not block the others. */
static void
unregister_if_last(node_t *n, const client_t *c)
{
	Refit__V1__UnregisterLayoutRequest rq = REFIT__V1__UNREGISTER_LAYOUT_REQUEST__INIT;
	refit_err_t err;

	if (n->closing || n->member_id == 0)
		return; /* a stopping node takes its clients' registrations with it */
	if (c->partial) {
		/* a group that lost a member no longer holds all of this node's
		 * ranks: the coordinator must not plan with it */
		if (!c->forwarded)
			return;
		node_group_forwarded(n, (client_t *)c, NULL, false);
		goto send;
	}
	for (size_t i = 0; i < n->clients.n; i++) {
		const client_t *o = n->clients.v[i];

		if (o != c && o->role == c->role && strcmp(o->model, c->model) == 0 &&
		    strcmp(o->instance, c->instance) == 0)
			return;
	}
send:
	rq.member_id = n->member_id;
	rq.model = c->model;
	rq.role = (Refit__V1__Role)c->role;
	rq.instance = c->instance;
	refit_err_clear(&err);
	if (rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
			   &refit__v1__coordinator__descriptor, "UnregisterLayout", &rq.base,
			   CALL_MS, on_unregistered, n, &err) == REFIT_OK)
		n->inflight++;
	else
		log_warnx("node %s: %s", n->node_id, err.msg);
}

void
node_client_drop(node_t *n, client_t *c, const char *why)
{
	for (size_t i = 0; i < n->clients.n; i++)
		if (n->clients.v[i] == c) {
			n->clients.v[i] = n->clients.v[--n->clients.n];
			break;
		}
	log_info("node %s: librefit client %" PRIu64 " (model \"%s\", %s \"%s\", pid %d) "
		 "dropped: %s", n->node_id, c->id, c->model,
		 c->role == REFIT__V1__ROLE__TRAIN ? "trainer" : "instance", c->instance,
		 c->pid, why);
	c->dead = true;
	unregister_if_last(n, c);
	n->hooks->client_gone(n, c->id, why);
	c->busy++;
	node_client_release(n, c);
}

/* ---- joining again -------------------------------------------------------------- */

typedef struct rejob {
	node_t *n;
	uint64_t client_id, member_id;
} rejob_t;

static void
on_reready(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	rejob_t *j = arg;

	(void)resp;
	j->n->inflight--;
	if (st != REFIT_OK)
		log_warnx("node %s: client %" PRIu64 ": WeightsReady again: %s", j->n->node_id,
			  j->client_id, msg);
	node_maybe_free(j->n);
	free(j);
}

static void
on_reregistered(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	rejob_t *j = arg;
	node_t *n = j->n;
	client_t *c = node_client(n, j->client_id);
	refit_err_t err;

	n->inflight--;
	if (st != REFIT_OK) {
		log_warnx("node %s: client %" PRIu64 ": RegisterLayout again: %s", n->node_id,
			  j->client_id, msg);
	} else if (c != NULL && !n->closing && n->member_id == j->member_id) {
		const Refit__V1__RegisterLayoutResponse *r = (const void *)resp;
		Refit__V1__WeightsReadyRequest fw = REFIT__V1__WEIGHTS_READY_REQUEST__INIT;

		snprintf(c->digest, sizeof(c->digest), "%s", nz(r->layout_digest));
		if (c->partial)
			node_group_forwarded(n, c, c->digest, true);
		log_info("node %s: client %" PRIu64 " (model \"%s\") registered again",
			 n->node_id, c->id, c->model);
		if (c->role == REFIT__V1__ROLE__TRAIN && c->readable && c->version > 0 &&
		    (!c->partial || node_group_ready(n, c, c->version))) {
			fw.member_id = n->member_id;
			fw.model = c->model;
			fw.version = c->version;
			fw.layout_digest = c->digest;
			refit_err_clear(&err);
			if (rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
					   &refit__v1__coordinator__descriptor, "WeightsReady",
					   &fw.base, CALL_MS, on_reready, j, &err) == REFIT_OK) {
				n->inflight++;
				node_maybe_free(n);
				return;
			}
			log_warnx("node %s: %s", n->node_id, err.msg);
		}
	}
	node_maybe_free(n);
	free(j);
}

void
node_local_rejoined(node_t *n)
{
	for (size_t i = 0; i < n->clients.n; i++) {
		client_t *c = n->clients.v[i];
		Refit__V1__RegisterLayoutRequest *fw;
		rejob_t *j;
		refit_err_t err;

		if (c->partial && (!c->forwarded || !node_group_first(n, c)))
			continue;   /* a group registers once, when whole */

		/* the request forwarded at registration, under the new member id */
		fw = (Refit__V1__RegisterLayoutRequest *)protobuf_c_message_unpack(
			&refit__v1__register_layout_request__descriptor, NULL, c->reg_len, c->reg);
		if (fw == NULL) { /* packed by this process: cannot happen but for memory */
			log_warnx("node %s: client %" PRIu64 ": its registration does not unpack",
				  n->node_id, c->id);
			continue;
		}
		j = xcalloc(1, sizeof(*j));
		*j = (rejob_t){n, c->id, n->member_id};
		fw->member_id = n->member_id;
		fw->again = true;
		refit_err_clear(&err);
		if (rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
				   &refit__v1__coordinator__descriptor, "RegisterLayout", &fw->base,
				   CALL_MS, on_reregistered, j, &err) == REFIT_OK) {
			n->inflight++;
		} else {
			log_warnx("node %s: client %" PRIu64 ": %s", n->node_id, c->id, err.msg);
			free(j);
		}
		protobuf_c_message_free_unpacked(&fw->base, NULL);
	}
}
