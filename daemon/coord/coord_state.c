/*
 * coord_state.c - the coordinator's durable state: models (every
 * instance's layouts, digests, and what an inference instance holds),
 * versions, member id counter and the epoch generation, as one JSON
 * document written on every change through the state store
 * (coord_store.h: the state file, or etcd) and read back at start (or,
 * with etcd, when this coordinator becomes the leader).
 *
 * Members are leases and are not kept: after a restart nodes find their
 * member id unknown on the next heartbeat and join again.  Epochs stay
 * monotonic across restarts: the high 32 bits are a generation counter
 * stored here and bumped at every start.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cjson/cJSON.h>

#include "codec/json.h"
#include "common/log.h"
#include "daemon/coord/coord_backend.h"
#include "daemon/coord/coord_internal.h"
#include "daemon/metrics.h"
#include "rpc/proto_conv.h"

#define STATE_VERSION 1

/* Refit records made and freed in this process (coord_refit_counts).  Here,
 * in the lowest file, so that the loader below and coord_store.c above
 * both count theirs. */
static uint64_t refits_made, refits_freed;

refit_rec_t *
coord_refit_new(void)
{
	refits_made++;
	return xcalloc(1, sizeof(refit_rec_t));
}

void
coord_refit_uncount(void)
{
	refits_freed++;
}

void
coord_refit_counts(uint64_t *live, uint64_t *freed)
{
	*live = refits_made - refits_freed;
	*freed = refits_freed;
}

uint64_t
coord_mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void
coord_store_observe(coord_t *c, const char *op, refit_status_t rc, uint64_t us)
{
	metrics_observe(M_STATE_STORE_SECONDS, (const char *[]){"store", c->store->name, "op",
			op, "outcome", rc == REFIT_OK ? "ok" : "error", NULL}, (double)us / 1e6);
}

static void
refits_json(const coord_t *c, cJSON *arr)
{
	for (size_t i = 0; i < c->refits.n; i++) {
		const refit_rec_t *r = c->refits.v[i];
		cJSON *o = cJSON_CreateObject();

		cJSON_AddNumberToObject(o, "id", (double)r->id);
		cJSON_AddStringToObject(o, "model", r->model);
		cJSON_AddNumberToObject(o, "version", (double)r->version);
		cJSON_AddNumberToObject(o, "epoch", (double)r->epoch);
		cJSON_AddNumberToObject(o, "mode", r->mode);
		cJSON_AddBoolToObject(o, "verify", r->verify);
		cJSON_AddNumberToObject(o, "state", refit_fsm_public(r->fsm.state));
		cJSON_AddStringToObject(o, "plan_digest", r->plan_digest);
		cJSON_AddNumberToObject(o, "created_unix_ms", (double)r->created_ms);
		cJSON_AddNumberToObject(o, "finished_unix_ms", (double)r->finished_ms);
		cJSON_AddNumberToObject(o, "bytes", (double)r->bytes);
		cJSON_AddStringToObject(o, "failure", r->failure ? r->failure : "");
		cJSON_AddStringToObject(o, "key", r->key ? r->key : "");
		if (r->by_policy)  /* only when set: older files are written back unchanged */
			cJSON_AddBoolToObject(o, "by_policy", true);
		if (r->delta_wire || r->delta_dense || r->dense_wire || r->delta_base) {
			/* docs/delta.md: what the refit sent, shown after a restart */
			cJSON_AddNumberToObject(o, "delta_wire_bytes", (double)r->delta_wire);
			cJSON_AddNumberToObject(o, "delta_dense_bytes", (double)r->delta_dense);
			cJSON_AddNumberToObject(o, "dense_wire_bytes", (double)r->dense_wire);
			cJSON_AddNumberToObject(o, "delta_base_refit", (double)(r->delta_base >> 8));
		}
		cJSON_AddItemToArray(arr, o);
	}
}

void
coord_pub_free(pub_pending_t *p)
{
	for (size_t i = 0; i < p->nodes.n; i++)
		free(p->nodes.v[i].node_id);
	VEC_FREE(&p->nodes);
	for (size_t i = 0; i < p->ninsts; i++)
		free(p->insts[i]);
	free(p->insts);
	free(p->model);
	free(p);
}

/* The decided Publishes not acknowledged everywhere (only when there are:
 * older files round-trip). */
static void
pubs_json(const coord_t *c, cJSON *root)
{
	cJSON *arr;

	if (c->pubs.n == 0)
		return;
	arr = cJSON_AddArrayToObject(root, "publishes");
	for (size_t i = 0; i < c->pubs.n; i++) {
		const pub_pending_t *p = c->pubs.v[i];
		cJSON *o = cJSON_CreateObject(), *nodes, *insts;

		cJSON_AddNumberToObject(o, "refit", (double)p->refit_id);
		cJSON_AddNumberToObject(o, "epoch", (double)p->epoch);
		cJSON_AddStringToObject(o, "model", p->model);
		cJSON_AddNumberToObject(o, "version", (double)p->version);
		cJSON_AddBoolToObject(o, "whole", p->whole);
		cJSON_AddBoolToObject(o, "lost", p->lost);
		nodes = cJSON_AddArrayToObject(o, "nodes");
		for (size_t k = 0; k < p->nodes.n; k++)
			cJSON_AddItemToArray(nodes, cJSON_CreateString(p->nodes.v[k].node_id));
		insts = cJSON_AddArrayToObject(o, "instances");
		for (size_t k = 0; k < p->ninsts; k++)
			cJSON_AddItemToArray(insts, cJSON_CreateString(p->insts[k]));
		cJSON_AddItemToArray(arr, o);
	}
}

static char *
state_text(const coord_t *c)
{
	cJSON *root = cJSON_CreateObject(), *models = cJSON_AddArrayToObject(root, "models");
	char *text;

	cJSON_AddNumberToObject(root, "version", STATE_VERSION);
	cJSON_AddNumberToObject(root, "generation", (double)(c->epoch >> 32));
	cJSON_AddNumberToObject(root, "next_member", (double)c->next_member);
	for (size_t i = 0; i < c->models.n; i++) {
		const model_t *m = &c->models.v[i];
		cJSON *mo = cJSON_CreateObject(), *insts;

		cJSON_AddStringToObject(mo, "name", m->name);
		cJSON_AddNumberToObject(mo, "latest_version", (double)m->latest_version);
		cJSON_AddNumberToObject(mo, "installed_version", (double)m->installed_version);
		cJSON_AddNumberToObject(mo, "retries", (double)m->retries);
		cJSON_AddNumberToObject(mo, "retry_backoff_ms", (double)m->retry_backoff_ms);
		cJSON_AddBoolToObject(mo, "catch_up", !m->no_catch_up);
		cJSON_AddBoolToObject(mo, "strict_instances", m->strict_instances);
		if (m->delta_off)  /* only when off: older files round-trip */
			cJSON_AddStringToObject(mo, "delta", "off");
		if (m->on_ready || m->min_interval_ms || m->skipped_versions ||
		    m->policy_refits) { /* else as before issue 23: old files round-trip */
			cJSON_AddStringToObject(mo, "trigger", m->on_ready ? "on_ready" : "manual");
			cJSON_AddNumberToObject(mo, "min_interval_ms", (double)m->min_interval_ms);
			cJSON_AddNumberToObject(mo, "pending_version", (double)m->pending_version);
			cJSON_AddNumberToObject(mo, "skipped_versions", (double)m->skipped_versions);
			cJSON_AddNumberToObject(mo, "policy_refits", (double)m->policy_refits);
		}
		insts = cJSON_AddArrayToObject(mo, "instances");
		for (size_t k = 0; k < m->inst.n; k++) {
			const instance_t *in = &m->inst.v[k];
			cJSON *io = cJSON_CreateObject();

			cJSON_AddStringToObject(io, "name", in->name);
			cJSON_AddStringToObject(io, "role", in->role == REFIT__V1__ROLE__TRAIN ?
						"train" : "infer");
			cJSON_AddNumberToObject(io, "member_id", (double)in->member_id);
			/* what it holds: only where it differs from what a file
			 * without these keys means (older files load unchanged) */
			if (in->role == REFIT__V1__ROLE__INFER &&
			    in->installed_version != m->installed_version)
				cJSON_AddNumberToObject(io, "installed_version",
							(double)in->installed_version);
			if (in->role == REFIT__V1__ROLE__INFER && in->invalid)
				cJSON_AddBoolToObject(io, "invalid", true);
			if (in->role == REFIT__V1__ROLE__INFER && in->in_place)
				cJSON_AddBoolToObject(io, "in_place", true);
			cJSON_AddStringToObject(io, "digest", in->digest);
			cJSON_AddItemToObject(io, "tensors", codec_layouts_tree(&in->layouts));
			cJSON_AddItemToArray(insts, io);
		}
		cJSON_AddItemToArray(models, mo);
	}
	refits_json(c, cJSON_AddArrayToObject(root, "refits"));
	cJSON_AddNumberToObject(root, "next_refit", (double)c->next_refit);
	pubs_json(c, root);
	text = cJSON_PrintUnformatted(root);
	cJSON_Delete(root);
	return text;
}

refit_status_t
coord_state_save(coord_t *c, refit_err_t *err)
{
	char *text;
	refit_status_t rc;
	uint64_t t0;

	if (c->store == NULL)
		return REFIT_OK;
	text = state_text(c);
	t0 = coord_mono_us();
	rc = c->store->save(c->store_impl, text, strlen(text), err);
	coord_store_observe(c, "save", rc, coord_mono_us() - t0);
	cJSON_free(text);
	return rc;
}

static uint64_t
num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsNumber(v) && v->valuedouble >= 0 ? (uint64_t)v->valuedouble : 0;
}

/*
 * The loader is strict: a field of the wrong type, a negative or fractional
 * number, is an error naming it (a damaged file is not read as zeros: an
 * epoch generation read as 0 would let epochs go back).
 */
static refit_status_t
want_u64(const cJSON *o, const char *key, uint64_t *out, const char *where,
	 refit_err_t *err)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	*out = 0;
	if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= 18446744073709551616.0 ||
	    v->valuedouble != (double)(uint64_t)v->valuedouble)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: \"%s\" must be a whole "
				     "number >= 0", where, key);
	*out = (uint64_t)v->valuedouble;
	return REFIT_OK;
}


static const char *
str(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* What an inference instance holds (a key absent, as in older files: the
 * model's installed version, valid, double buffered); a bad type is an error. */
static refit_status_t
load_held(const model_t *m, const cJSON *io, instance_t *in, const char *where,
	  refit_err_t *err)
{
	const cJSON *iv = cJSON_GetObjectItemCaseSensitive(io, "installed_version");
	const char *flags[] = {"invalid", "in_place"};
	bool *out[] = {&in->invalid, &in->in_place};

	in->installed_version = m->installed_version;
	if (iv != NULL)
		CHECK(want_u64(io, "installed_version", &in->installed_version, where, err));
	for (size_t i = 0; i < 2; i++) {
		const cJSON *f = cJSON_GetObjectItemCaseSensitive(io, flags[i]);

		if (f != NULL && !cJSON_IsBool(f))
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: \"%s\" must be "
					     "true or false", where, flags[i]);
		*out[i] = cJSON_IsTrue(f);
	}
	return REFIT_OK;
}

static refit_status_t
load_instance(model_t *m, const cJSON *io, refit_err_t *err)
{
	const char *name = str(io, "name"), *role = str(io, "role"), *dg = str(io, "digest");
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(io, "tensors");
	instance_t in;

	uint64_t mid;
	char where[300];

	if (name == NULL || role == NULL || dg == NULL || !cJSON_IsArray(t))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "model \"%s\": an instance "
				     "lacks name, role, digest or tensors", m->name);
	snprintf(where, sizeof(where), "model \"%s\" instance \"%s\"", m->name, name);
	if (strcmp(role, "train") != 0 && strcmp(role, "infer") != 0)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: role \"%s\" is neither "
				     "train nor infer", where, role);
	CHECK(want_u64(io, "member_id", &mid, where, err));
	for (size_t i = 0; i < m->inst.n; i++)
		if ((m->inst.v[i].role == REFIT__V1__ROLE__TRAIN) == (strcmp(role, "train") == 0) &&
		    (strcmp(role, "train") == 0 || strcmp(m->inst.v[i].name, name) == 0))
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: listed twice",
					     where);
	memset(&in, 0, sizeof(in));
	plan_layout_set_init(&in.layouts);
	CHECK(codec_layouts_from_tree(t, &in.layouts, err));
	conv_layouts_digest(&in.layouts, in.digest);
	if (strcmp(in.digest, dg) != 0) {
		plan_layout_set_fini(&in.layouts);
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "model \"%s\" instance \"%s\": "
				     "layouts do not match their digest (file damaged?)",
				     m->name, name);
	}
	in.name = xstrdup(name);
	in.role = strcmp(role, "train") == 0 ? REFIT__V1__ROLE__TRAIN : REFIT__V1__ROLE__INFER;
	in.member_id = mid;
	in.gen = 1;
	if (load_held(m, io, &in, where, err) != REFIT_OK) {
		/* what coord_instance_fini frees (coord_store.c calls into this
		 * file: no call back) */
		free(in.name);
		free(in.holders);
		plan_layout_set_fini(&in.layouts);
		return err->status;
	}
	VEC_PUSH(&m->inst, in);
	return REFIT_OK;
}

/* The trigger policy of model object mo into m (absent in files before
 * issue 23: manual, nothing pending). */
static refit_status_t
load_trigger(const cJSON *mo, model_t *m, const char *where, refit_err_t *err)
{
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(mo, "trigger");
	uint64_t iv, pv, sv, pr;

	if (t == NULL)
		return REFIT_OK;
	if (!cJSON_IsString(t) || (strcmp(t->valuestring, "manual") != 0 &&
				   strcmp(t->valuestring, "on_ready") != 0))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: \"trigger\" must be "
				     "\"manual\" or \"on_ready\"", where);
	CHECK(want_u64(mo, "min_interval_ms", &iv, where, err));
	CHECK(want_u64(mo, "pending_version", &pv, where, err));
	CHECK(want_u64(mo, "skipped_versions", &sv, where, err));
	CHECK(want_u64(mo, "policy_refits", &pr, where, err));
	if (iv > COORD_MAX_INTERVAL_MS)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: min_interval_ms %" PRIu64
				     " out of range (at most %u)", where, iv, COORD_MAX_INTERVAL_MS);
	m->on_ready = strcmp(t->valuestring, "on_ready") == 0;
	m->min_interval_ms = (uint32_t)iv;
	m->pending_version = m->on_ready ? pv : 0;
	m->skipped_versions = sv;
	m->policy_refits = pr;
	return REFIT_OK;
}

static refit_status_t
load_models(coord_t *c, const cJSON *models, refit_err_t *err)
{
	const cJSON *mo, *io;

	cJSON_ArrayForEach(mo, models) {
		model_t m;
		const char *name = str(mo, "name");

		char where[300];
		uint64_t lv, iv, rt, bo;
		const cJSON *cu = cJSON_GetObjectItemCaseSensitive(mo, "catch_up");

		if (name == NULL)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "a model has no name");
		snprintf(where, sizeof(where), "model \"%s\"", name);
		for (size_t i = 0; i < c->models.n; i++)
			if (strcmp(c->models.v[i].name, name) == 0)
				return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: listed twice",
						     where);
		CHECK(want_u64(mo, "latest_version", &lv, where, err));
		CHECK(want_u64(mo, "installed_version", &iv, where, err));
		CHECK(want_u64(mo, "retries", &rt, where, err));
		CHECK(want_u64(mo, "retry_backoff_ms", &bo, where, err));
		if (rt > 100 || bo > 3600000)
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: retries %" PRIu64
					     " or backoff %" PRIu64 " ms out of range", where, rt, bo);
		if (!cJSON_IsBool(cu))
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: \"catch_up\" must be "
					     "true or false", where);
		if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(mo, "instances")))
			return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: \"instances\" must "
					     "be an array", where);
		memset(&m, 0, sizeof(m));
		m.name = xstrdup(name);
		m.latest_version = lv;
		m.installed_version = iv;
		m.retries = (uint32_t)rt;
		m.retry_backoff_ms = (uint32_t)bo;
		m.no_catch_up = cJSON_IsFalse(cu);
		{
			const cJSON *st = cJSON_GetObjectItemCaseSensitive(mo, "strict_instances");

			if (st != NULL && !cJSON_IsBool(st)) { /* absent in older files */
				free(m.name);
				return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: "
						     "\"strict_instances\" must be true or "
						     "false", where);
			}
			m.strict_instances = cJSON_IsTrue(st);
		}
		{
			const cJSON *dl = cJSON_GetObjectItemCaseSensitive(mo, "delta");

			if (dl != NULL && (!cJSON_IsString(dl) ||
					   (strcmp(dl->valuestring, "off") != 0 &&
					    strcmp(dl->valuestring, "auto") != 0))) {
				free(m.name);
				return refit_err_set(err, REFIT_ERR_INVALID_ARG, "%s: "
						     "\"delta\" must be \"auto\" or \"off\"",
						     where);
			}
			m.delta_off = dl != NULL && strcmp(dl->valuestring, "off") == 0;
		}
		if (load_trigger(mo, &m, where, err) != REFIT_OK) {
			free(m.name);
			return err->status;
		}
		VEC_PUSH(&c->models, m);
		cJSON_ArrayForEach(io, cJSON_GetObjectItemCaseSensitive(mo, "instances"))
			CHECK(load_instance(&c->models.v[c->models.n - 1], io, err));
	}
	return REFIT_OK;
}

#define CUT_SHORT "the coordinator restarted while the refit was "

/*
 * A new leader over etcd (fail-over): a model whose newest refit was cut
 * short by a coordinator's end (its failure says so: this load made it so,
 * or an earlier leader's, which itself ended before it could redo it) is
 * refit again under its retry policy (retries > 0), as a new refit once
 * the model's instances are whole again (coord_refit_api.c); a newer
 * version, or this one installed meanwhile, makes it moot.  Derived from
 * the stored records at every load, so a second fail-over does not lose
 * it.  With a state file a restart leaves it FAILED, as before.
 */
static void
resume_later(coord_t *c)
{
	if (c->leader == NULL)
		return;
	for (size_t i = 0; i < c->models.n; i++) {
		model_t *m = &c->models.v[i];

		for (size_t k = c->refits.n; k-- > 0;) {
			const refit_rec_t *r = c->refits.v[k];

			if (strcmp(r->model, m->name) != 0 || r->only != NULL)
				continue;
			if (m->retries > 0 && r->fsm.state == REFIT_FSM_FAILED && r->failure &&
			    strncmp(r->failure, CUT_SHORT, strlen(CUT_SHORT)) == 0 &&
			    r->version > m->installed_version)
				m->resume_version = r->version;
			break;  /* the newest of the model decides */
		}
	}
}

static char **
strings(const cJSON *arr, size_t *n)
{
	const cJSON *s;
	char **v = xcalloc((size_t)cJSON_GetArraySize(arr) + 1, sizeof(*v));

	*n = 0;
	cJSON_ArrayForEach(s, arr)
		if (cJSON_IsString(s))
			v[(*n)++] = xstrdup(s->valuestring);
	return v;
}

/*
 * The decided Publishes, resent from now on.  Their refit, cut short by
 * the restart, was decided: it is not redone (resume_later), its Publish
 * is resent instead.
 */
static void
load_pubs(coord_t *c, const cJSON *arr)
{
	const cJSON *o;

	cJSON_ArrayForEach(o, arr) {
		pub_pending_t *p = xcalloc(1, sizeof(*p));
		const char *model = str(o, "model");
		size_t nn;
		char **nodes = strings(cJSON_GetObjectItemCaseSensitive(o, "nodes"), &nn);

		p->refit_id = num(o, "refit");
		p->epoch = num(o, "epoch");
		p->version = num(o, "version");
		p->model = xstrdup(model ? model : "");
		p->whole = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "whole"));
		p->lost = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "lost"));
		p->insts = strings(cJSON_GetObjectItemCaseSensitive(o, "instances"), &p->ninsts);
		for (size_t k = 0; k < nn; k++)
			VEC_PUSH(&p->nodes, ((pub_node_t){nodes[k], false, 0}));
		free(nodes);
		for (size_t k = 0; k < c->refits.n; k++) {
			refit_rec_t *r = c->refits.v[k];

			if (r->id == p->refit_id && r->failure &&
			    strncmp(r->failure, CUT_SHORT, strlen(CUT_SHORT)) == 0) {
				free(r->failure);
				r->failure = xstrdup("the coordinator restarted after it decided "
						     "to publish (every node had committed): "
						     "Publish is resent to the nodes that had not "
						     "acknowledged it");
			}
		}
		log_info("coordinator: refit %" PRIu64 " (%s, version %" PRIu64 "): Publish "
			 "decided, %zu nodes still to acknowledge it", p->refit_id, p->model,
			 p->version, p->nodes.n);
		VEC_PUSH(&c->pubs, p);
	}
}

/*
 * Refit records come back as they were, except that one a crash cut short
 * is FAILED now: it never silently disappears.  A state that is no
 * RefitState is an error.
 */
static refit_status_t
load_refits(coord_t *c, const cJSON *arr, refit_err_t *err)
{
	const cJSON *o;

	cJSON_ArrayForEach(o, arr) {
		const char *model = str(o, "model"), *dg = str(o, "plan_digest");
		const char *failure = str(o, "failure"), *key = str(o, "key");
		int st = (int)num(o, "state");
		refit_fsm_state_t fs;
		refit_rec_t *r;

		if (refit_fsm_of_public(st, &fs, err) != REFIT_OK) {
			refit_err_prefix(err, "refit %" PRIu64, num(o, "id"));
			return err->status;
		}
		r = coord_refit_new();
		r->id = num(o, "id");
		r->model = xstrdup(model ? model : "");
		r->version = num(o, "version");
		r->epoch = num(o, "epoch");
		r->mode = (int)num(o, "mode");
		r->verify = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "verify"));
		r->by_policy = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "by_policy"));
		r->created_ms = num(o, "created_unix_ms");
		r->finished_ms = num(o, "finished_unix_ms");
		r->bytes = num(o, "bytes");
		r->delta_wire = num(o, "delta_wire_bytes");
		r->delta_dense = num(o, "delta_dense_bytes");
		r->dense_wire = num(o, "dense_wire_bytes");
		r->delta_base = num(o, "delta_base_refit") << 8;  /* the tag's attempt: not kept */
		snprintf(r->plan_digest, sizeof(r->plan_digest), "%s", dg ? dg : "");
		r->key = key && key[0] ? xstrdup(key) : NULL;
		r->failure = failure && failure[0] ? xstrdup(failure) : NULL;
		r->fsm.state = fs;
		if (!refit_fsm_is(fs, REFIT_FSM_FINAL)) {
			char msg[128];

			snprintf(msg, sizeof(msg), CUT_SHORT "%s", refit_fsm_public_name(st));
			free(r->failure);
			r->failure = xstrdup(msg);
			r->fsm.state = REFIT_FSM_FAILED;
			r->finished_ms = (uint64_t)time(NULL) * 1000;
			log_warnx("coordinator: refit %" PRIu64 " (%s): %s", r->id, r->model, msg);
		}
		VEC_PUSH(&c->refits, r);
	}
	return REFIT_OK;
}

refit_status_t
coord_state_load(coord_t *c, refit_err_t *err)
{
	char *buf;
	size_t len;
	cJSON *root;
	refit_status_t rc;
	uint64_t gen = 0, t0;

	if (c->store == NULL)
		return REFIT_OK;
	t0 = coord_mono_us();
	rc = c->store->load(c->store_impl, &buf, &len, err);
	coord_store_observe(c, "load", rc == REFIT_ERR_NOT_FOUND ? REFIT_OK : rc,
			    coord_mono_us() - t0);
	if (rc == REFIT_ERR_NOT_FOUND) {
		refit_err_clear(err);
		log_info("coordinator: no %s yet: starting empty", c->store->where(c->store_impl));
		rc = REFIT_OK;
	} else if (rc == REFIT_OK) {
		root = cJSON_ParseWithLength(buf, len);
		free(buf);
		if (root == NULL || num(root, "version") != STATE_VERSION) {
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "not a version-%d refit "
					   "state file", STATE_VERSION);
		} else if ((rc = want_u64(root, "generation", &gen, "top level", err)) ==
				   REFIT_OK &&
			   (rc = want_u64(root, "next_member", &c->next_member, "top level",
					  err)) == REFIT_OK &&
			   (rc = want_u64(root, "next_refit", &c->next_refit, "top level", err)) ==
				   REFIT_OK) {
			const cJSON *ms = cJSON_GetObjectItemCaseSensitive(root, "models");

			if (gen == 0 || gen >= UINT32_MAX)
				rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "top level: generation "
						   "%" PRIu64 " is outside 1 to %u", gen,
						   UINT32_MAX - 1);
			else if (!cJSON_IsArray(ms))
				rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "top level: "
						   "\"models\" must be an array");
			else
				rc = load_models(c, ms, err);
			if (rc == REFIT_OK)
				rc = load_refits(c, cJSON_GetObjectItemCaseSensitive(root, "refits"),
						 err);
			if (rc == REFIT_OK)
				load_pubs(c, cJSON_GetObjectItemCaseSensitive(root, "publishes"));
			if (rc == REFIT_OK)
				resume_later(c);
		}
		if (rc != REFIT_OK)
			refit_err_prefix(err, "%s", c->store->where(c->store_impl));
		cJSON_Delete(root);
	}
	if (rc != REFIT_OK)
		return rc;
	/* a new generation: every epoch from now on is above all earlier ones */
	c->epoch = (gen + 1) << 32;
	log_info("coordinator: state loaded: %zu models, epoch generation %" PRIu64,
		 c->models.n, gen + 1);
	return coord_state_save(c, err);
}
