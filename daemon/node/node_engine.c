/*
 * node_engine.c - engines and trainers asking about a model's instances.
 *
 * Local.Describe: the engine reading an inference client names itself
 * (framework, its version, pause mode); every heartbeat tells the
 * coordinator what each engine here said and the version it serves
 * (Local.Serve), which refitctl models shows.  Soft state: a coordinator
 * that restarted hears it again at the next heartbeat.
 *
 * Local.WaitInstalled: a trainer waits until every inference instance of
 * its model holds its version.  The node asks the coordinator
 * (Coordinator.GetInstalled, with its member session) every
 * ASK_EVERY_MS while a call waits, one question in flight per model (its
 * answer serves every waiter of the model: a trainer's processes on the
 * node);
 * at the deadline TIMEOUT names the instances that lag, as the last answer
 * said.  Loop thread only.  Uses n->clients directly: calls nothing in
 * node_local.c (which adds these methods to its server).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/node/node_internal.h"

#define ASK_EVERY_MS 100
#define ASK_CALL_MS 5000

typedef struct inst_waiter {
	node_t *n;
	rpc_call_t *call;       /* NULL: answered (freed once no question is out) */
	uint64_t client_id, version;
	char *model;
	int64_t deadline_ms, next_ask_ms;
	bool asking;
	uint64_t lowest;        /* the lowest version an instance holds (last answer) */
	char lag[512];          /* the instances that lag (last answer) */
} inst_waiter_t;

static const char *
nz(const char *s)
{
	return s ? s : "";
}

static client_t *
live_client(node_t *n, uint64_t id)
{
	for (size_t i = 0; i < n->clients.n; i++)
		if (n->clients.v[i]->id == id && !n->clients.v[i]->dead)
			return n->clients.v[i];
	return NULL;
}

/* The client rq names, of role role; NULL: call failed. */
static client_t *
client_or_fail(node_t *n, rpc_call_t *call, uint64_t id, int role)
{
	client_t *c = live_client(n, id);

	if (c == NULL)
		rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "node %s: no librefit client %" PRIu64
			      " (never registered, unregistered, or the node restarted)",
			      n->node_id, id);
	else if (!node_client_owned(call, c))
		;   /* refused: another process's registration */
	else if (c->role != role)
		rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "client %" PRIu64 " is %s: this call "
			      "is for %s clients", id, c->role == REFIT__V1__ROLE__TRAIN ?
			      "a trainer" : "an inference instance",
			      role == REFIT__V1__ROLE__TRAIN ? "trainer" : "inference");
	else
		return c;
	return NULL;
}

static void
reply_version(rpc_call_t *call, const client_t *c, uint64_t version)
{
	Refit__V1__ClientState s = REFIT__V1__CLIENT_STATE__INIT;

	s.version = version;
	s.active = c ? c->active : 0;
	s.valid = true;
	s.failure = (char *)"";
	s.serving = c ? c->serving : -1;
	rpc_call_reply(call, &s.base);
}

/* ---- Describe ------------------------------------------------------------------ */

/* s checked into out: 1 to 64 printable bytes ("" allowed when may_empty). */
static refit_status_t
engine_str(const char *what, const char *s, bool may_empty, char *out, refit_err_t *err)
{
	size_t len = strlen(nz(s));

	if (len == 0 && !may_empty)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "Describe: the engine's %s is "
				     "empty", what);
	if (len >= NODE_ENGINE_STR)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "Describe: the engine's %s is "
				     "%zu bytes (at most %d)", what, len, NODE_ENGINE_STR - 1);
	for (size_t i = 0; i < len; i++)
		if (s[i] < 0x20 || s[i] > 0x7e)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "Describe: the engine's "
					     "%s has byte 0x%02x at %zu (printable ASCII only)",
					     what, (unsigned char)s[i], i);
	memcpy(out, nz(s), len + 1);
	return REFIT_OK;
}

static void
h_describe(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__ClientRequest *rq = (const void *)msg;
	client_t *c = client_or_fail(n, call, rq->client_id, REFIT__V1__ROLE__INFER);
	char fw[NODE_ENGINE_STR], ver[NODE_ENGINE_STR], pause[NODE_ENGINE_STR];
	const char *pm;
	refit_err_t err;

	if (c == NULL)
		return;
	refit_err_clear(&err);
	if (rq->engine == NULL)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "Describe: no engine given");
	pm = nz(rq->engine->pause_mode);
	if (pm[0] && strcmp(pm, "keep") != 0 && strcmp(pm, "wait") != 0 &&
	    strcmp(pm, "abort") != 0)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "Describe: pause mode \"%.64s\" "
				     "is not one of keep, wait, abort", pm);
	if (engine_str("framework", rq->engine->framework, false, fw, &err) != REFIT_OK ||
	    engine_str("version", rq->engine->version, true, ver, &err) != REFIT_OK ||
	    engine_str("pause mode", pm, true, pause, &err) != REFIT_OK)
		return rpc_call_fail(call, err.status, "%s", err.msg);
	memcpy(c->engine_fw, fw, sizeof(fw));
	memcpy(c->engine_ver, ver, sizeof(ver));
	memcpy(c->engine_pause, pause, sizeof(pause));
	log_info("node %s: model \"%s\" instance \"%s\": engine %s %s, pause mode %s",
		 n->node_id, c->model, c->instance, fw, ver, pause[0] ? pause : "-");
	reply_version(call, c, c->version);
}

/* ---- heartbeats ----------------------------------------------------------------- */

static bool
same_instance(const client_t *a, const client_t *b)
{
	return !a->dead && a->role == b->role && strcmp(a->model, b->model) == 0 &&
	       strcmp(a->instance, b->instance) == 0;
}

/* c is the first live inference client of its instance in the node's list */
static bool
first_of_instance(const node_t *n, const client_t *c)
{
	for (size_t i = 0; i < n->clients.n; i++) {
		if (n->clients.v[i] == c)
			return true;
		if (same_instance(n->clients.v[i], c))
			return false;
	}
	return true;
}

/*
 * The engine of c's instance on this node: the first of its clients that
 * named one, and the version it serves -- the lowest any of its clients
 * serves (the workers of one engine switch together; 0 until all did).
 */
static void
instance_engine(const node_t *n, const client_t *c, const client_t **named, uint64_t *served)
{
	*named = NULL;
	*served = UINT64_MAX;
	for (size_t i = 0; i < n->clients.n; i++) {
		const client_t *o = n->clients.v[i];

		if (!same_instance(o, c))
			continue;
		if (*named == NULL && o->engine_fw[0])
			*named = o;
		if (o->served_version < *served)
			*served = o->served_version;
	}
	if (*served == UINT64_MAX)
		*served = 0;
}

void
node_engine_beat(node_t *n, Refit__V1__HeartbeatRequest *rq, node_engine_beat_t *keep)
{
	size_t k = 0, cap = n->clients.n ? n->clients.n : 1;

	keep->ev = xcalloc(cap, sizeof(*keep->ev));
	keep->ep = xcalloc(cap, sizeof(*keep->ep));
	keep->iv = xcalloc(cap, sizeof(*keep->iv));
	for (size_t i = 0; i < n->clients.n; i++) {
		client_t *c = n->clients.v[i];
		const client_t *e;
		uint64_t served;

		if (c->dead || c->role != REFIT__V1__ROLE__INFER || !first_of_instance(n, c))
			continue;
		instance_engine(n, c, &e, &served);
		if (e == NULL && served == 0)
			continue;
		refit__v1__instance_engine__init(&keep->ev[k]);
		keep->ev[k].model = c->model;
		keep->ev[k].instance = c->instance;
		keep->ev[k].served_version = served;
		if (e != NULL) {
			refit__v1__engine_info__init(&keep->iv[k]);
			keep->iv[k].framework = (char *)e->engine_fw;
			keep->iv[k].version = (char *)e->engine_ver;
			keep->iv[k].pause_mode = (char *)e->engine_pause;
			keep->ev[k].engine = &keep->iv[k];
		}
		keep->ep[k] = &keep->ev[k];
		k++;
	}
	rq->engines = keep->ep;
	rq->n_engines = k;
}

void
node_engine_beat_free(node_engine_beat_t *keep)
{
	free(keep->ev);
	free(keep->ep);
	free(keep->iv);
}

/* ---- WaitInstalled ------------------------------------------------------------- */

/*
 * Every inference instance in m holds w->version (and is valid): true.
 * Else the ones that lag into w->lag.  A model with no inference instance
 * has nothing installed: it lags.
 */
static bool
all_installed(inst_waiter_t *w, const Refit__V1__Model *m)
{
	size_t len = 0, ninf = 0, nlag = 0;
	uint64_t lowest = UINT64_MAX;

	w->lag[0] = '\0';
	for (size_t i = 0; i < m->n_instances; i++) {
		const Refit__V1__Instance *in = m->instances[i];
		uint64_t v = in->invalid ? 0 : in->installed_version;
		int r;

		if (in->role != REFIT__V1__ROLE__INFER)
			continue;
		ninf++;
		lowest = v < lowest ? v : lowest;
		if (v >= w->version)
			continue;
		r = snprintf(w->lag + len, sizeof(w->lag) - len, "%sinstance \"%s\" holds v%"
			     PRIu64 "%s", nlag++ ? ", " : "", nz(in->instance),
			     in->installed_version, in->invalid ? " (invalid)" : "");
		if (r > 0 && (size_t)r < sizeof(w->lag) - len)
			len += (size_t)r;
	}
	w->lowest = ninf ? lowest : 0;
	if (ninf == 0)
		snprintf(w->lag, sizeof(w->lag), "model \"%s\" has no inference instance",
			 nz(m->name));
	return ninf > 0 && nlag == 0;
}

static void
waiter_drop(node_t *n, inst_waiter_t *w)
{
	for (size_t i = 0; i < n->iwaiters.n; i++)
		if (n->iwaiters.v[i] == w) {
			n->iwaiters.v[i] = n->iwaiters.v[--n->iwaiters.n];
			break;
		}
	free(w->model);
	free(w);
}

/* The answer about w's model applied to every waiter of that model that
 * is not answered (one question in flight per model on the node). */
static void
on_installed(void *arg, refit_status_t st, const char *msg, ProtobufCMessage *resp)
{
	inst_waiter_t *w = arg;
	node_t *n = w->n;
	char *model = xstrdup(w->model);

	n->inflight--;
	w->asking = false;
	if (w->call == NULL)
		waiter_drop(n, w);
	for (size_t i = 0; i < n->iwaiters.n;) {
		inst_waiter_t *o = n->iwaiters.v[i];

		if (o->call == NULL || strcmp(o->model, model) != 0) {
			i++;
		} else if (st != REFIT_OK) {
			snprintf(o->lag, sizeof(o->lag), "the coordinator did not say (%s)", msg);
			i++;
		} else if (all_installed(o, (const Refit__V1__Model *)resp)) {
			reply_version(o->call, live_client(n, o->client_id), o->lowest);
			o->call = NULL;
			if (o->asking)
				i++;
			else
				waiter_drop(n, o);
		} else {
			i++;
		}
	}
	free(model);
	node_maybe_free(n);
}

/* A question about model is in flight (another waiter asked it). */
static bool
model_asked(const node_t *n, const char *model)
{
	for (size_t i = 0; i < n->iwaiters.n; i++)
		if (n->iwaiters.v[i]->asking && strcmp(n->iwaiters.v[i]->model, model) == 0)
			return true;
	return false;
}

static void
ask(node_t *n, inst_waiter_t *w, int64_t now)
{
	Refit__V1__GetInstalledRequest rq = REFIT__V1__GET_INSTALLED_REQUEST__INIT;
	refit_err_t err;

	w->next_ask_ms = now + ASK_EVERY_MS;
	if (model_asked(n, w->model))
		return;   /* its answer serves w too */
	if (n->member_id == 0) {
		snprintf(w->lag, sizeof(w->lag), "node %s is not a member (joining)", n->node_id);
		return;
	}
	refit_err_clear(&err);
	rq.member_id = n->member_id;
	rq.model = w->model;
	if (rpc_async_call(n->rpc, RPC_GROUP_NONE, n->coordinator,
			   &refit__v1__coordinator__descriptor, "GetInstalled", &rq.base,
			   ASK_CALL_MS, on_installed, w, &err) == REFIT_OK) {
		w->asking = true;
		n->inflight++;
	} else {
		snprintf(w->lag, sizeof(w->lag), "asking the coordinator: %s", err.msg);
	}
}

static void
h_wait_installed(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	node_t *n = ctx;
	const Refit__V1__ClientRequest *rq = (const void *)msg;
	client_t *c = client_or_fail(n, call, rq->client_id, REFIT__V1__ROLE__TRAIN);
	inst_waiter_t *w;

	if (c == NULL)
		return;
	if (rq->version == 0)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "WaitInstalled: version 0 "
				     "(versions start at 1)");
	if (rq->timeout_ms == 0)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "WaitInstalled: timeout_ms 0 "
				     "(a positive bound is required)");
	w = xcalloc(1, sizeof(*w));
	w->n = n;
	w->call = call;
	w->client_id = c->id;
	w->version = rq->version;
	w->model = xstrdup(c->model);
	w->deadline_ms = xport_now_ms() + (int64_t)rq->timeout_ms;
	snprintf(w->lag, sizeof(w->lag), "no answer from the coordinator yet");
	VEC_PUSH(&n->iwaiters, w);
	ask(n, w, xport_now_ms());
}

/* w's call failed (answered): dropped now unless a question is out */
static bool
waiter_fail(node_t *n, inst_waiter_t *w, refit_status_t st, const char *why)
{
	rpc_call_fail(w->call, st, "%s", why);
	w->call = NULL;
	if (w->asking)
		return false;
	waiter_drop(n, w);
	return true;
}

void
node_engine_sweep(node_t *n)
{
	int64_t now = xport_now_ms();

	for (size_t i = 0; i < n->iwaiters.n;) {
		inst_waiter_t *w = n->iwaiters.v[i];
		char why[700];

		if (w->call == NULL) {
			i++;
		} else if (live_client(n, w->client_id) == NULL) {
			snprintf(why, sizeof(why), "WaitInstalled: client %" PRIu64 " was dropped "
				 "while waiting", w->client_id);
			if (!waiter_fail(n, w, REFIT_ERR_NOT_FOUND, why))
				i++;
		} else if (rpc_call_cancelled(w->call)) {
			if (!waiter_fail(n, w, REFIT_ERR_ABORTED, "cancelled by the client"))
				i++;
		} else if (now >= w->deadline_ms) {
			snprintf(why, sizeof(why), "model \"%s\": version %" PRIu64 " not installed "
				 "everywhere in time: %s", w->model, w->version, w->lag);
			if (!waiter_fail(n, w, REFIT_ERR_TIMEOUT, why))
				i++;
		} else {
			if (!w->asking && now >= w->next_ask_ms && !n->closing)
				ask(n, w, now);
			i++;
		}
	}
}

void
node_engine_fail_all(node_t *n, const char *why)
{
	for (size_t i = 0; i < n->iwaiters.n;) {
		inst_waiter_t *w = n->iwaiters.v[i];

		if (w->call == NULL || !waiter_fail(n, w, REFIT_ERR_UNAVAILABLE, why))
			i++;
	}
}

void
node_engine_stop(node_t *n)
{
	while (n->iwaiters.n) {
		inst_waiter_t *w = n->iwaiters.v[0];

		if (w->call)
			rpc_call_fail(w->call, REFIT_ERR_UNAVAILABLE, "the node daemon stopped");
		waiter_drop(n, w);
	}
	VEC_FREE(&n->iwaiters);
}

const rpc_method_cfg_t node_engine_methods[] = {
	{"Describe", h_describe},
	{"WaitInstalled", h_wait_installed},
};
const size_t node_engine_nmethods = sizeof(node_engine_methods) / sizeof(node_engine_methods[0]);
