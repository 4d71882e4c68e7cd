/*
 * coord_register.c - the coordinator's layout registry and model views:
 * RegisterLayout (validation, composition of inference instances, matching
 * against the trainer), UnregisterLayout, SetRefitPolicy, WeightsReady, and
 * the read-only ListModels, GetModel, GetInstalled (a trainer's node) and
 * ExplainPlan, and the engines' heartbeat notes.  Its methods go to
 * the server as coord_register_methods (coord_new).  Loop thread only;
 * calls coord_store.c, coord_plan.c and coord_rules.c, nothing in coord.c.
 *
 * Models: one TRAIN instance (the source) and any number of INFER
 * instances (replicas, whose layouts compose into one destination layout).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "common/alloc.h"
#include "common/log.h"
#include "plan/convert.h"
#include "daemon/coord/coord.h"
#include "rpc/proto_conv.h"

#include "daemon/coord/coord_internal.h"
#include "daemon/coord/coord_rules.h"

/* ---- helpers ------------------------------------------------------------- */

static instance_t *
find_instance(model_t *m, int role, const char *name)
{
	for (size_t i = 0; i < m->inst.n; i++)
		if (m->inst.v[i].role == role && strcmp(m->inst.v[i].name, name) == 0)
			return &m->inst.v[i];
	return NULL;
}

static const char *
nz(const char *s)
{
	return s ? s : "";
}

/* ---- layouts --------------------------------------------------------------- */

/* Every rank of s must belong to some member. */
static refit_status_t
check_ranks_known(coord_t *c, const plan_layout_set_t *s, refit_err_t *err)
{
	size_t t;
	int32_t r = coord_rules_unheld_rank(c->members.v, c->members.n, s, &t);

	if (r >= 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "layout \"%s\": rank %d belongs "
				     "to no member node", s->v[t].name, r);
	return REFIT_OK;
}

/* A new instance must describe the same tensors as the other side. */
static refit_status_t
check_against(model_t *m, int role, const plan_layout_set_t *s, refit_err_t *err)
{
	refit_status_t rc = REFIT_OK;

	for (size_t i = 0; i < m->inst.n && rc == REFIT_OK; i++) {
		instance_t *o = &m->inst.v[i];

		if (o->role == role)
			continue;
		rc = role == REFIT__V1__ROLE__TRAIN ? plan_convert_match(s, &o->layouts, err)
						     : plan_convert_match(&o->layouts, s, err);
		if (rc != REFIT_OK)
			refit_err_prefix(err, "instance \"%s\"", o->name);
	}
	return rc;
}

/*
 * Is rq's instance of m registered with exactly these layouts?  Then its
 * ranks were all held when it was first registered, and another node of it
 * (one that joined again) registers it even while a node of it is still
 * away: that node registers it again when it comes back.
 */
static bool
registered_as(model_t *m, const Refit__V1__RegisterLayoutRequest *rq,
	      const plan_layout_set_t *set)
{
	instance_t *old = m == NULL ? NULL : rq->role == REFIT__V1__ROLE__TRAIN ?
			  coord_train_instance(m) : find_instance(m, (int)rq->role,
								  nz(rq->instance));
	char dg[SHA256_HEX_LEN];

	if (old == NULL)
		return false;
	conv_layouts_digest(set, dg);
	return strcmp(dg, old->digest) == 0;
}

/*
 * RegisterLayout's checks: the member, the model and role, the layouts
 * (converted into *set, a trainer's covering every element), their ranks
 * held by members (unless the instance is registered with them already),
 * their tensors matching the other side's (ranks shared with another
 * replica are checked after, by h_register).  REFIT_OK, or err says why
 * (set is then freed).
 */
static refit_status_t
register_check(coord_t *c, const Refit__V1__RegisterLayoutRequest *rq, plan_layout_set_t *set,
	       refit_err_t *err)
{
	model_t *m = coord_find_model(c, nz(rq->model));

	if (coord_find_member(c, rq->member_id) == NULL)
		return refit_err_set(err, REFIT_ERR_NOT_FOUND, "RegisterLayout: member %" PRIu64
				     " is not a member: join first", rq->member_id);
	if (rq->model == NULL || rq->model[0] == '\0')
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "RegisterLayout: model is empty");
	if (rq->role != REFIT__V1__ROLE__TRAIN && rq->role != REFIT__V1__ROLE__INFER)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "RegisterLayout \"%s\": role "
				     "must be TRAIN or INFER", rq->model);
	if (conv_layouts_from_proto(rq->tensors, rq->n_tensors, set, err) != REFIT_OK) {
		refit_err_prefix(err, "RegisterLayout \"%s\"", rq->model);
		return err->status;
	}
	/* a trainer's layouts and an instance's (a whole replica) cover every
	 * element; no rank holds one twice */
	for (size_t i = 0; i < set->n && err->status == REFIT_OK; i++)
		if (plan_layout_check_coverage(&set->v[i], err) == REFIT_OK)
			plan_layout_check_rank_disjoint(&set->v[i], err);
	if (err->status == REFIT_OK && !registered_as(m, rq, set))
		check_ranks_known(c, set, err);
	if (err->status == REFIT_OK && m != NULL)
		check_against(m, rq->role, set, err);
	if (err->status == REFIT_OK)
		return REFIT_OK;
	plan_layout_set_fini(set);
	refit_err_prefix(err, "RegisterLayout \"%s\"", rq->model);
	return err->status;
}

/*
 * Another registration of an instance with the same layout: another node of
 * an instance that spans several, another client of it on a node, or a node
 * that joined again (rq->again: the same memory, holding what it held).
 * The member becomes one of its holders.  New memory (not again) holds no
 * version yet: the instance as a whole holds none (refits planned before do
 * not count for it: gen).  Every registration arms the catch-up check: the
 * timer starts one once the instance is whole and behind (coord_refit_api.c),
 * whichever of its nodes came last.  Answers the call and frees set.
 */
static void
register_same(coord_t *c, rpc_call_t *call, const Refit__V1__RegisterLayoutRequest *rq,
	      instance_t *old, plan_layout_set_t *set)
{
	Refit__V1__RegisterLayoutResponse rsp = REFIT__V1__REGISTER_LAYOUT_RESPONSE__INIT;

	plan_layout_set_fini(set);
	coord_instance_prune(c, old);
	coord_instance_hold(old, rq->member_id);
	if (!coord_instance_holds(old, old->member_id) ||
	    coord_find_member(c, old->member_id) == NULL)
		old->member_id = rq->member_id;
	old->orphan_since_ms = 0;
	if (old->role == REFIT__V1__ROLE__INFER) {
		if (!rq->again) {
			old->gen++;
			old->installed_version = 0;
			old->invalid = false;
		}
		old->in_place = rq->install == REFIT__V1__INSTALL_MODE__IN_PLACE;
		old->catch_up_at_ms = coord_now_ms() + CATCH_UP_DELAY_MS;
	}
	coord_save(c);
	rsp.layout_digest = old->digest;
	rsp.tensors = (uint32_t)old->layouts.n;
	rpc_call_reply(call, &rsp.base);
}

/* Another layout for a registered instance: refused while another live node
 * holds the old one (REFIT_OK: it may replace it). */
static refit_status_t
register_other(coord_t *c, const Refit__V1__RegisterLayoutRequest *rq, instance_t *old,
	       const char *dg, refit_err_t *err)
{
	coord_instance_prune(c, old);
	for (size_t i = 0; i < old->nholders; i++) {
		const member_t *om = coord_find_member(c, old->holders[i]);

		if (old->holders[i] == rq->member_id || om == NULL)
			continue;
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "RegisterLayout \"%s\": %s "
				     "\"%s\" is registered by node %s with another layout "
				     "(%.12s, this one %.12s)", rq->model,
				     rq->role == REFIT__V1__ROLE__TRAIN ? "the trainer" :
				     "instance", nz(rq->instance), om->node_id, old->digest, dg);
	}
	return REFIT_OK;
}

/*
 * The new instance into model m (NULL: a new model): a model has one
 * trainer; an inference instance is replaced by name, the old one kept
 * until the change is durable.  It holds no version yet: an inference
 * instance is caught up once whole (the catch-up policy permitting).
 * Answers the call; set is taken.
 */
static void
register_store(coord_t *c, rpc_call_t *call, const Refit__V1__RegisterLayoutRequest *rq,
	       model_t *m, plan_layout_set_t *set)
{
	Refit__V1__RegisterLayoutResponse rsp = REFIT__V1__REGISTER_LAYOUT_RESPONSE__INIT;
	const char *iname = nz(rq->instance);
	bool new_model = m == NULL, had_old = false;
	instance_t in = {0}, was, *old;
	refit_err_t err;

	if (m == NULL) {
		model_t nm = {.name = xstrdup(rq->model), .on_ready = c->o.default_on_ready,
			      .min_interval_ms = c->o.default_min_interval_ms};

		VEC_PUSH(&c->models, nm);
		m = &c->models.v[c->models.n - 1];
	}
	old = rq->role == REFIT__V1__ROLE__TRAIN ? coord_train_instance(m)
						: find_instance(m, (int)rq->role, iname);
	if (old != NULL) {
		was = *old;
		had_old = true;
		*old = m->inst.v[--m->inst.n];
	}
	in.name = xstrdup(iname);
	in.role = (int)rq->role;
	in.member_id = rq->member_id;
	coord_instance_hold(&in, rq->member_id);
	in.layouts = *set;
	conv_layouts_digest(set, in.digest);
	/* it holds no version the coordinator knows of (again: not known either) */
	in.gen = had_old ? was.gen + 1 : 1;
	in.in_place = rq->install == REFIT__V1__INSTALL_MODE__IN_PLACE;
	if (rq->role == REFIT__V1__ROLE__INFER)
		in.catch_up_at_ms = coord_now_ms() + CATCH_UP_DELAY_MS;
	VEC_PUSH(&m->inst, in);
	refit_err_clear(&err);
	if (coord_save_durable(c, "RegisterLayout", &err) != REFIT_OK) {
		coord_instance_fini(&m->inst.v[--m->inst.n]);
		if (had_old)
			VEC_PUSH(&m->inst, was);
		if (new_model) {
			free(m->name);
			VEC_FREE(&m->inst);
			c->models.n--;
		}
		return rpc_call_fail(call, err.status, "%s", err.msg);
	}
	if (had_old)
		coord_instance_fini(&was);
	log_info("coordinator: model \"%s\": %s instance \"%s\" registered (%zu tensors, %.12s)",
		 m->name, rq->role == REFIT__V1__ROLE__TRAIN ? "train" : "infer", iname,
		 in.layouts.n, in.digest);
	rsp.layout_digest = m->inst.v[m->inst.n - 1].digest;
	rsp.tensors = (uint32_t)in.layouts.n;
	rpc_call_reply(call, &rsp.base);
}

/* Does member mb serve a rank rq's layouts use (either form)? */
static bool
serves(const member_t *mb, const Refit__V1__RegisterLayoutRequest *rq)
{
	for (size_t i = 0; i < mb->nranks; i++)
		for (size_t t = 0; t < rq->n_tensors; t++) {
			const Refit__V1__TensorLayout *tl = rq->tensors[t];

			for (size_t k = 0; k < tl->n_mesh_ranks; k++)
				if (tl->mesh_ranks[k] == mb->ranks[i].rank)
					return true;
			for (size_t k = 0; k < tl->n_shards; k++)
				if (tl->shards[k]->rank == mb->ranks[i].rank)
					return true;
		}
	return false;
}

/*
 * The member rq names is the caller (coord_member_acts) and, with a join
 * token, serves a rank of the layouts (a node registers only the trainers
 * and instances it serves); false: refused.  A member that is not found is
 * left to register_check to name.
 */
static bool
register_acts(coord_t *c, rpc_call_t *call, const Refit__V1__RegisterLayoutRequest *rq)
{
	const member_t *mb = coord_find_member(c, rq->member_id);

	if (mb == NULL)
		return true;
	if (!coord_member_acts(c, call, "RegisterLayout", mb))
		return false;
	if (!coord_binds(c) || serves(mb, rq))
		return true;
	rpc_call_refuse(call, REFIT_ERR_PERMISSION_DENIED, "identity", "RegisterLayout \"%s\" "
			"%s \"%s\": none of its ranks is member %" PRIu64 "'s (node \"%s\"): a "
			"node registers only what it serves", nz(rq->model),
			rq->role == REFIT__V1__ROLE__TRAIN ? "trainer" : "instance",
			nz(rq->instance), mb->id, mb->node_id);
	return false;
}

/*
 * With a join token: is the caller member_id, and a holder of in (one of
 * the nodes that registered it)?  An operator (UnregisterLayout's row
 * allows the operator token) may act for any.  false: refused, answered.
 */
static bool
holder_acts(coord_t *c, rpc_call_t *call, const char *method, uint64_t member_id,
	    const char *model, const instance_t *in)
{
	const member_t *mb = coord_find_member(c, member_id);

	if (!coord_binds(c) || rpc_call_by_operator(call))
		return true;
	if (mb == NULL) {
		rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "%s: member %" PRIu64 " is not a "
			      "member: join first", method, member_id);
		return false;
	}
	if (!coord_member_acts(c, call, method, mb))
		return false;
	for (size_t i = 0; i < in->nholders; i++)
		if (in->holders[i] == member_id)
			return true;
	rpc_call_refuse(call, REFIT_ERR_PERMISSION_DENIED, "identity", "%s: model \"%s\" %s "
			"\"%s\" was not registered by member %" PRIu64 " (node \"%s\"): a node "
			"acts only for what it registered", method, model,
			in->role == REFIT__V1__ROLE__TRAIN ? "trainer" : "instance", in->name,
			member_id, mb->node_id);
	return false;
}

static void
h_register(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__RegisterLayoutRequest *rq = (const void *)msg;
	plan_layout_set_t set;
	refit_err_t err;
	instance_t *old;
	model_t *m;

	refit_err_clear(&err);
	if (!register_acts(c, call, rq))
		return;
	if (register_check(c, rq, &set, &err) != REFIT_OK)
		return rpc_call_fail(call, err.status, "%s", err.msg);
	m = coord_find_model(c, rq->model);
	old = m == NULL ? NULL : rq->role == REFIT__V1__ROLE__TRAIN ? coord_train_instance(m)
					: find_instance(m, (int)rq->role, nz(rq->instance));
	if (old != NULL) {
		char dg[SHA256_HEX_LEN];

		conv_layouts_digest(&set, dg);
		if (strcmp(dg, old->digest) == 0)
			return register_same(c, call, rq, old, &set);
		if (register_other(c, rq, old, dg, &err) != REFIT_OK) {
			plan_layout_set_fini(&set);
			return rpc_call_fail(call, err.status, "%s", err.msg);
		}
	}
	if (rq->role == REFIT__V1__ROLE__INFER && m != NULL &&
	    coord_rules_own_ranks(m, nz(rq->instance), &set, &err) != REFIT_OK) {
		plan_layout_set_fini(&set);
		return rpc_call_fail(call, err.status, "%s", err.msg);
	}
	register_store(c, call, rq, m, &set);
}

static void reply_model(rpc_call_t *call, const model_t *m);
static model_t *model_or_fail(coord_t *c, rpc_call_t *call, const char *method,
			      const char *name);

static void
h_set_policy(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__SetRefitPolicyRequest *rq = (const void *)msg;
	const Refit__V1__RefitPolicy *p = rq->policy;
	model_t *m;

	if (p == NULL)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "SetRefitPolicy: no policy");
	if ((m = model_or_fail(c, call, "SetRefitPolicy", nz(p->model))) == NULL)
		return;
	if (p->retries > 100 || p->retry_backoff_ms > 3600000)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "SetRefitPolicy \"%s\": retries "
				     "%u (at most 100), backoff %u ms (at most 3600000)", m->name,
				     p->retries, p->retry_backoff_ms);
	if (p->trigger != REFIT__V1__TRIGGER_MODE__TRIGGER_MANUAL &&
	    p->trigger != REFIT__V1__TRIGGER_MODE__TRIGGER_ON_READY)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "SetRefitPolicy \"%s\": unknown "
				     "trigger %d (manual 0, on_ready 1)", m->name, (int)p->trigger);
	if (p->delta != REFIT__V1__DELTA_MODE__DELTA_AUTO &&
	    p->delta != REFIT__V1__DELTA_MODE__DELTA_OFF)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "SetRefitPolicy \"%s\": unknown "
				     "delta %d (auto 0, off 1)", m->name, (int)p->delta);
	if (p->min_interval_ms > COORD_MAX_INTERVAL_MS)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "SetRefitPolicy \"%s\": "
				     "min_interval_ms %u (at most %u)", m->name, p->min_interval_ms,
				     COORD_MAX_INTERVAL_MS);
	model_t was = *m;
	refit_err_t err;

	refit_err_clear(&err);
	m->retries = p->retries;
	m->retry_backoff_ms = p->retry_backoff_ms;
	m->no_catch_up = !p->catch_up;
	m->strict_instances = p->strict_instances;
	m->on_ready = p->trigger == REFIT__V1__TRIGGER_MODE__TRIGGER_ON_READY;
	m->min_interval_ms = p->min_interval_ms;
	m->delta_off = p->delta == REFIT__V1__DELTA_MODE__DELTA_OFF;
	if (!m->on_ready)
		m->pending_version = 0;  /* manual: nothing waits */
	if (coord_save_durable(c, "SetRefitPolicy", &err) != REFIT_OK) {
		*m = was;  /* the same strings and arrays: only numbers changed */
		return rpc_call_fail(call, err.status, "%s", err.msg);
	}
	reply_model(call, m);
}

static void
h_unregister(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__UnregisterLayoutRequest *rq = (const void *)msg;
	Refit__V1__UnregisterLayoutResponse rsp = REFIT__V1__UNREGISTER_LAYOUT_RESPONSE__INIT;
	model_t *m = coord_find_model(c, nz(rq->model));
	instance_t *in = m ? find_instance(m, (int)rq->role, nz(rq->instance)) : NULL;

	if (in == NULL)
		return rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "UnregisterLayout: model \"%s\" "
				     "has no such instance \"%s\"", nz(rq->model),
				     nz(rq->instance));
	if (!holder_acts(c, call, "UnregisterLayout", rq->member_id, m->name, in))
		return;
	instance_t was = *in;
	refit_err_t err;

	refit_err_clear(&err);
	*in = m->inst.v[--m->inst.n];
	if (coord_save_durable(c, "UnregisterLayout", &err) != REFIT_OK) {
		VEC_PUSH(&m->inst, was);
		return rpc_call_fail(call, err.status, "%s", err.msg);
	}
	coord_instance_fini(&was);
	rpc_call_reply(call, &rsp.base);
}

static void
h_weights_ready(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__WeightsReadyRequest *rq = (const void *)msg;
	Refit__V1__WeightsReadyResponse rsp = REFIT__V1__WEIGHTS_READY_RESPONSE__INIT;
	model_t *m = coord_find_model(c, nz(rq->model));
	instance_t *t = m ? coord_train_instance(m) : NULL;

	if (t == NULL)
		return rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "WeightsReady: model \"%s\" has "
				     "no registered trainer", nz(rq->model));
	if (!holder_acts(c, call, "WeightsReady", rq->member_id, m->name, t))
		return;
	if (rq->layout_digest && rq->layout_digest[0] &&
	    strcmp(rq->layout_digest, t->digest) != 0)
		return rpc_call_fail(call, REFIT_ERR_STALE_EPOCH, "WeightsReady \"%s\": layout "
				     "digest %.12s is not the registered %.12s: register again",
				     m->name, rq->layout_digest, t->digest);
	if (rq->version == m->latest_version) { /* another node of the same trainer */
		rsp.latest_version = m->latest_version;
		return rpc_call_reply(call, &rsp.base);
	}
	if (rq->version < m->latest_version)
		return rpc_call_fail(call, REFIT_ERR_INVALID_ARG, "WeightsReady \"%s\": version "
				     "%" PRIu64 " is not newer than %" PRIu64, m->name,
				     rq->version, m->latest_version);
	uint64_t was = m->latest_version;
	refit_err_t err;

	refit_err_clear(&err);
	m->latest_version = rq->version;
	if (coord_save_durable(c, "WeightsReady", &err) != REFIT_OK) {
		m->latest_version = was;
		return rpc_call_fail(call, err.status, "%s", err.msg);
	}
	rsp.latest_version = m->latest_version;
	rpc_call_reply(call, &rsp.base);
	coord_trigger_ready(c, m, m->latest_version);
}

/* ---- model views ----------------------------------------------------------- */

/*
 * The version the whole model serves: the lowest an inference instance holds
 * (an invalid one holds none), never ahead of any of them; with no
 * inference instance, the newest a refit installed.
 */
static uint64_t
model_installed(const model_t *m)
{
	uint64_t v = m->installed_version;

	for (size_t i = 0; i < m->inst.n; i++) {
		const instance_t *in = &m->inst.v[i];
		uint64_t iv = in->invalid ? 0 : in->installed_version;

		if (in->role == REFIT__V1__ROLE__INFER && iv < v)
			v = iv;
	}
	return v;
}

/* Fill *out for model m (policy in *pol); its arrays go to *iv, *ip and
 * *ev, freed by the caller. */
static void
model_msg(const model_t *m, Refit__V1__Model *out, Refit__V1__RefitPolicy *pol,
	  Refit__V1__Instance **iv, Refit__V1__Instance ***ip, Refit__V1__EngineInfo **ev)
{
	*iv = xcalloc(m->inst.n ? m->inst.n : 1, sizeof(**iv));
	*ev = xcalloc(m->inst.n ? m->inst.n : 1, sizeof(**ev));
	*ip = xcalloc(m->inst.n ? m->inst.n : 1, sizeof(**ip));
	refit__v1__refit_policy__init(pol);
	pol->model = m->name;
	pol->retries = m->retries;
	pol->retry_backoff_ms = m->retry_backoff_ms;
	pol->catch_up = !m->no_catch_up;
	pol->strict_instances = m->strict_instances;
	pol->trigger = m->on_ready ? REFIT__V1__TRIGGER_MODE__TRIGGER_ON_READY
				   : REFIT__V1__TRIGGER_MODE__TRIGGER_MANUAL;
	pol->min_interval_ms = m->min_interval_ms;
	pol->delta = m->delta_off ? REFIT__V1__DELTA_MODE__DELTA_OFF :
				    REFIT__V1__DELTA_MODE__DELTA_AUTO;
	refit__v1__model__init(out);
	out->pending_version = m->pending_version;
	out->skipped_versions = m->skipped_versions;
	out->policy_refits = m->policy_refits;
	out->policy = pol;
	out->name = m->name;
	out->latest_version = m->latest_version;
	out->installed_version = model_installed(m);
	for (size_t i = 0; i < m->inst.n; i++) {
		const instance_t *in = &m->inst.v[i];

		refit__v1__instance__init(&(*iv)[i]);
		(*iv)[i].instance = in->name;
		(*iv)[i].role = (Refit__V1__Role)in->role;
		(*iv)[i].layout_digest = (char *)in->digest;
		(*iv)[i].tensors = (uint32_t)in->layouts.n;
		(*iv)[i].member_id = in->member_id;
		if (in->role == REFIT__V1__ROLE__INFER) {
			(*iv)[i].installed_version = in->installed_version;
			(*iv)[i].invalid = in->invalid;
			(*iv)[i].install = in->in_place ? REFIT__V1__INSTALL_MODE__IN_PLACE :
					   REFIT__V1__INSTALL_MODE__DOUBLE_BUFFER;
			(*iv)[i].served_version = in->served_version;
			if (in->engine_fw[0]) {
				refit__v1__engine_info__init(&(*ev)[i]);
				(*ev)[i].framework = (char *)in->engine_fw;
				(*ev)[i].version = (char *)in->engine_ver;
				(*ev)[i].pause_mode = (char *)in->engine_pause;
				(*iv)[i].engine = &(*ev)[i];
			}
		}
		(*ip)[i] = &(*iv)[i];
		out->tensors = (uint32_t)in->layouts.n;
	}
	out->instances = *ip;
	out->n_instances = m->inst.n;
}

static void
h_list_models(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	Refit__V1__ListModelsResponse rsp = REFIT__V1__LIST_MODELS_RESPONSE__INIT;
	size_t n = c->models.n;
	Refit__V1__Model *mv = xcalloc(n ? n : 1, sizeof(*mv));
	Refit__V1__Model **mp = xcalloc(n ? n : 1, sizeof(*mp));
	Refit__V1__Instance **iv = xcalloc(n ? n : 1, sizeof(*iv));
	Refit__V1__Instance ***ip = xcalloc(n ? n : 1, sizeof(*ip));
	Refit__V1__EngineInfo **ev = xcalloc(n ? n : 1, sizeof(*ev));
	Refit__V1__RefitPolicy *pv = xcalloc(n ? n : 1, sizeof(*pv));

	(void)msg;
	for (size_t i = 0; i < n; i++) {
		model_msg(&c->models.v[i], &mv[i], &pv[i], &iv[i], &ip[i], &ev[i]);
		mp[i] = &mv[i];
	}
	rsp.models = mp;
	rsp.n_models = n;
	rpc_call_reply(call, &rsp.base);
	for (size_t i = 0; i < n; i++) {
		free(iv[i]);
		free(ip[i]);
		free(ev[i]);
	}
	free(ev);
	free(iv);
	free(ip);
	free(mv);
	free(pv);
	free(mp);
}

/* Answer call with model m. */
static void
reply_model(rpc_call_t *call, const model_t *m)
{
	Refit__V1__Model out;
	Refit__V1__RefitPolicy pol;
	Refit__V1__Instance *iv, **ip;
	Refit__V1__EngineInfo *ev;

	model_msg(m, &out, &pol, &iv, &ip, &ev);
	rpc_call_reply(call, &out.base);
	free(iv);
	free(ip);
	free(ev);
}

/* The model called name, or NULL with call failed ("method: no model"). */
static model_t *
model_or_fail(coord_t *c, rpc_call_t *call, const char *method, const char *name)
{
	model_t *m = coord_find_model(c, name);

	if (m == NULL)
		rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "%s: no model \"%s\"", method, name);
	return m;
}

static void
h_get_model(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__GetModelRequest *rq = (const void *)msg;
	model_t *m = model_or_fail(c, call, "GetModel", nz(rq->model));

	if (m != NULL)
		reply_model(call, m);
}

/* A member that registers the model's trainer asks what its instances hold
 * (a trainer waiting for its version: Local.WaitInstalled on its node). */
static void
h_get_installed(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__GetInstalledRequest *rq = (const void *)msg;
	model_t *m = model_or_fail(c, call, "GetInstalled", nz(rq->model));
	instance_t *t = m ? coord_train_instance(m) : NULL;

	if (m == NULL)
		return;
	if (t == NULL)
		return rpc_call_fail(call, REFIT_ERR_NOT_FOUND, "GetInstalled: model \"%s\" has "
				     "no registered trainer", m->name);
	if (holder_acts(c, call, "GetInstalled", rq->member_id, m->name, t))
		reply_model(call, m);
}

/* s into out (COORD_ENGINE_STR bytes) when printable and short enough. */
static bool
engine_str(char *out, const char *s)
{
	size_t n = strlen(nz(s));

	if (n >= COORD_ENGINE_STR)
		return false;
	for (size_t i = 0; i < n; i++)
		if (s[i] < 0x20 || s[i] > 0x7e)
			return false;
	memcpy(out, nz(s), n + 1);
	return true;
}

void
coord_engines_note(coord_t *c, const member_t *mb, const Refit__V1__HeartbeatRequest *rq)
{
	for (size_t i = 0; i < rq->n_engines; i++) {
		const Refit__V1__InstanceEngine *e = rq->engines[i];
		model_t *m = coord_find_model(c, nz(e->model));
		instance_t *in = m ? find_instance(m, REFIT__V1__ROLE__INFER, nz(e->instance))
				   : NULL;
		char fw[COORD_ENGINE_STR], ver[COORD_ENGINE_STR], pause[COORD_ENGINE_STR];

		if (in == NULL || !coord_instance_holds(in, mb->id))
			continue;   /* gone meanwhile, or not the member's to tell */
		in->served_version = e->served_version;
		/* the node checked them (Local.Describe): a bad one is dropped */
		if (e->engine && engine_str(fw, e->engine->framework) &&
		    engine_str(ver, e->engine->version) &&
		    engine_str(pause, e->engine->pause_mode)) {
			memcpy(in->engine_fw, fw, sizeof(fw));
			memcpy(in->engine_ver, ver, sizeof(ver));
			memcpy(in->engine_pause, pause, sizeof(pause));
		}
	}
}

static void
on_explained(planjob_t *j)
{
	Refit__V1__ExplainPlanResponse rsp = REFIT__V1__EXPLAIN_PLAN_RESPONSE__INIT;
	strbuf_t sb;

	if (j->rc != REFIT_OK) {
		rpc_call_fail(j->call, j->err.status, "ExplainPlan \"%s\": %s", j->model,
			      j->err.msg);
		return;
	}
	strbuf_init(&sb);
	codec_explain_table(&j->plan, &j->cost, &j->bplan, &j->bcost, &j->topo, &sb);
	rsp.table = sb.s;
	rsp.reshard_digest = j->plan.digest_hex;
	rsp.reshard_seconds = j->cost.time_s;
	rsp.broadcast_seconds = j->bcost.time_s;
	rsp.lower_bound_seconds = j->cost.lb_time_s;
	rpc_call_reply(j->call, &rsp.base);
	strbuf_fini(&sb);
}

/* Plans are built off the loop; the call is answered when they are. */
static void
h_explain(void *ctx, rpc_call_t *call, const ProtobufCMessage *msg)
{
	coord_t *c = ctx;
	const Refit__V1__ExplainPlanRequest *rq = (const void *)msg;
	model_t *m = model_or_fail(c, call, "ExplainPlan", nz(rq->model));
	plan_opts_t o;
	refit_err_t err;

	refit_err_clear(&err);
	if (m == NULL)
		return;
	plan_opts_default(&o);
	if (rq->chunk_bytes)
		o.chunk_bytes = rq->chunk_bytes;
	if (rq->staging_bytes)
		o.staging_bytes = rq->staging_bytes;
	if (coord_plan_async(c, m, NULL, &o, true, on_explained, 0, call, &err) != REFIT_OK)
		rpc_call_fail(call, err.status, "ExplainPlan \"%s\": %s", m->name, err.msg);
}

/* ---- the methods ---------------------------------------------------------- */

const rpc_method_cfg_t coord_register_methods[] = {
	{"RegisterLayout", h_register},
	{"SetRefitPolicy", h_set_policy},
	{"UnregisterLayout", h_unregister},
	{"WeightsReady", h_weights_ready},
	{"ListModels", h_list_models},
	{"GetModel", h_get_model},
	{"GetInstalled", h_get_installed},
	{"ExplainPlan", h_explain},
};
const size_t coord_register_nmethods =
	sizeof(coord_register_methods) / sizeof(coord_register_methods[0]);
