/*
 * coord_refit_nodes.c - which instances and nodes take part in a refit and
 * what they are told, for the driver (coord_refit.c): the inference
 * instances a refit leaves out (not healthy: coord_refit_choose_instances,
 * whose failure the driver feeds to the machine), the members a plan
 * involves, the members' transports, the nccl epoch's unique id (kept,
 * reused, or shrunk to), the member list of PrepareEpoch, RunSlice's
 * request and its instances.  Nothing here feeds the state machine: these
 * read and fill the records and the messages only.  Loop thread only.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/log.h"
#include "common/sha256.h"
#include "common/strbuf.h"
#include "daemon/coord/coord_internal.h"
#include "daemon/coord/coord_rules.h"
#include "rpc/proto_conv.h"

/* Does r's attempt install on inference instance in (md's)? */
static bool
takes_part(const refit_rec_t *r, const instance_t *in)
{
	return in->role == REFIT__V1__ROLE__INFER && !in->skip &&
	       (r->only == NULL || strcmp(r->only, in->name) == 0);
}

/* Note the instances r's attempt installs on (and their gen now).  Their
 * catch-up check is disarmed: this attempt answers the registrations
 * before it, whatever its outcome (a failed one is the retry policy's to
 * repeat; an operator's abort stays an abort); a registration after it
 * arms the check again. */
static void
note_took(coord_t *c, const model_t *cmd, refit_rec_t *r)
{
	model_t *md = coord_find_model(c, cmd->name);

	for (size_t i = 0; i < r->ntook; i++)
		free(r->took[i]);
	r->ntook = 0;
	r->run_sent = false;
	r->took = xreallocarray(r->took, md->inst.n + 1, sizeof(*r->took));
	r->took_gen = xreallocarray(r->took_gen, md->inst.n + 1, sizeof(*r->took_gen));
	for (size_t i = 0; i < md->inst.n; i++) {
		if (!takes_part(r, &md->inst.v[i]))
			continue;
		r->took[r->ntook] = xstrdup(md->inst.v[i].name);
		r->took_gen[r->ntook++] = md->inst.v[i].gen;
		md->inst.v[i].catch_up_at_ms = 0;
	}
}

void
coord_refit_instances_end(coord_t *c, refit_rec_t *r, bool committed)
{
	model_t *m = coord_find_model(c, r->model);

	for (size_t k = 0; m != NULL && k < r->ntook; k++) {
		for (size_t i = 0; i < m->inst.n; i++) {
			instance_t *in = &m->inst.v[i];

			if (in->role != REFIT__V1__ROLE__INFER || in->gen != r->took_gen[k] ||
			    strcmp(in->name, r->took[k]) != 0)
				continue;
			if (committed) {
				in->installed_version = r->version;
				in->invalid = false;
			} else if (in->in_place && r->run_sent) {
				/* a node may have started writing it: whether
				 * it did is not known here, so it is shown
				 * invalid rather than valid when it is not */
				in->invalid = true;
			}
		}
	}
	if (committed && m != NULL && r->only == NULL && r->version > m->installed_version)
		m->installed_version = r->version;
}

/* Members owning a rank that sends or receives in p: one pass over p. */
void
coord_involved_nodes(coord_t *c, const plan_t *p, const model_t *md, refit_rec_t *r)
{
	int32_t maxr = -1;
	uint8_t *used;

	for (size_t i = 0; i < c->members.n; i++)
		for (size_t k = 0; k < c->members.v[i].nranks; k++)
			if (c->members.v[i].ranks[k].rank > maxr)
				maxr = c->members.v[i].ranks[k].rank;
	used = xcalloc((size_t)maxr + 2, 1);
	for (size_t x = 0; x < p->nxfers; x++) {
		if (p->xfers[x].from <= maxr)
			used[p->xfers[x].from] = 1;
		if (p->xfers[x].to <= maxr)
			used[p->xfers[x].to] = 1;
	}
	/* every node holding inference memory installs, even one receiving nothing */
	if (md != NULL)
		note_took(c, md, r);
	for (size_t i = 0; md != NULL && i < md->inst.n; i++)
		for (size_t t = 0; takes_part(r, &md->inst.v[i]) &&
				   t < md->inst.v[i].layouts.n; t++)
			for (size_t k = 0; k < md->inst.v[i].layouts.v[t].nshards; k++) {
				int32_t rk = md->inst.v[i].layouts.v[t].shards[k].rank;

				if (rk <= maxr)
					used[rk] = 1;
			}
	free(r->nodes);
	r->nnodes = 0;
	r->nodes = xcalloc(c->members.n ? c->members.n : 1, sizeof(*r->nodes));
	for (size_t i = 0; i < c->members.n; i++) {
		const member_t *m = &c->members.v[i];
		bool any = false;

		for (size_t k = 0; k < m->nranks && !any; k++)
			any = used[m->ranks[k].rank];
		if (any)
			r->nodes[r->nnodes++] = m->id;
	}
	free(used);
}

/* The id (or none: shrink) of r's epoch is the one every refit of it uses. */
void
coord_nccl_remember(coord_t *c, const refit_rec_t *r)
{
	memcpy(c->nccl_id, r->nccl_id, r->nccl_id_len);
	c->nccl_id_len = r->nccl_id_len;
	c->nccl_epoch = r->epoch;
	free(c->nccl_members);
	c->nccl_members = xcalloc(c->members.n + 1, sizeof(*c->nccl_members));
	for (size_t i = 0; i < c->members.n; i++)
		c->nccl_members[i] = c->members.v[i].id;
	c->nccl_nmembers = c->members.n;
	c->nccl_ok = true;
}

/*
 * Does r's epoch need a new unique id?  Not when it has one already (a
 * second refit of the epoch) or when members only left since the last id
 * and nothing failed: then the nodes shrink their communicators.  Each id
 * starts a bootstrap root that only communicators consume: ask for one
 * exactly when the nodes will build new ones.
 */
bool
coord_nccl_need_id(coord_t *c, refit_rec_t *r)
{
	if (c->nccl_ok && c->nccl_epoch == r->epoch) {
		memcpy(r->nccl_id, c->nccl_id, c->nccl_id_len);
		r->nccl_id_len = c->nccl_id_len;
		return false;
	}
	if (!c->nccl_ok || c->nccl_epoch == 0 || c->members.n >= c->nccl_nmembers)
		return true;
	for (size_t i = 0; i < c->members.n; i++) {
		bool was = false;

		for (size_t k = 0; k < c->nccl_nmembers && !was; k++)
			was = c->nccl_members[k] == c->members.v[i].id;
		if (!was)
			return true;
	}
	r->nccl_id_len = 0;   /* shrink */
	coord_nccl_remember(c, r);
	return false;
}

/* Another nccl refit between planning and its end (they run one at a time). */
bool
coord_nccl_busy(const coord_t *c, const refit_rec_t *r)
{
	for (size_t i = 0; i < c->refits.n; i++) {
		const refit_rec_t *o = c->refits.v[i];

		if (o != r && o->fsm.nccl && refit_fsm_is(o->fsm.state, REFIT_FSM_HOLDS_EPOCH))
			return true;
	}
	return false;
}

/* The members' transports: whether any uses nccl, one that does not, and
 * the member holding the lowest rank. */
void
coord_scan_members(coord_t *c, bool *nccl, const member_t **other, const member_t **low)
{
	int32_t lowr = INT32_MAX;

	*nccl = false;
	*other = *low = NULL;
	for (size_t i = 0; i < c->members.n; i++) {
		const member_t *m = &c->members.v[i];

		if (strcmp(m->transport, "nccl") == 0)
			*nccl = true;
		else
			*other = m;
		for (size_t k = 0; k < m->nranks; k++)
			if (m->ranks[k].rank < lowr) {
				lowr = m->ranks[k].rank;
				*low = m;
			}
	}
}

void
coord_data_tokens(coord_t *c, uint64_t epoch)
{
	for (size_t i = 0; i < c->members.n; i++) {
		member_t *m = &c->members.v[i];

		if (m->dtoken_epoch == epoch)
			continue;
		if (getrandom(m->dtoken, sizeof(m->dtoken), 0) != (ssize_t)sizeof(m->dtoken))
			log_warn("coordinator: getrandom");
		m->dtoken_epoch = epoch;
	}
}

void
coord_prepare_attach(const member_t *m, ProtobufCMessage *req)
{
	Refit__V1__PrepareEpochRequest *rq = (void *)req;

	if (req->descriptor != &refit__v1__prepare_epoch_request__descriptor)
		return;
	rq->token.data = (uint8_t *)m->dtoken;  /* packed at once (rpc_async_call) */
	rq->token.len = sizeof(m->dtoken);
}

/* The current members as PrepareEpoch lists them, in *mv (coord_members_msg_free):
 * with each one's data verifier (the SHA-256 of its token). */
Refit__V1__Member **
coord_members_msg(coord_t *c, Refit__V1__Member **mv)
{
	Refit__V1__Member **mp = xcalloc(c->members.n + 1, sizeof(*mp));

	*mv = xcalloc(c->members.n + 1, sizeof(**mv));
	for (size_t i = 0; i < c->members.n; i++) {
		const member_t *m = &c->members.v[i];
		Refit__V1__Member *o = &(*mv)[i];
		sha256_ctx_t h;

		refit__v1__member__init(o);
		o->member_id = m->id;
		o->node_id = m->node_id;
		o->host = m->host;
		o->rpc_endpoint = m->rpc_ep;
		o->data_endpoint = m->data_ep;
		o->transport = m->transport;
		o->data_verifier.data = xmalloc(SHA256_DIGEST_LEN);
		o->data_verifier.len = SHA256_DIGEST_LEN;
		sha256_init(&h);
		sha256_update(&h, m->dtoken, sizeof(m->dtoken));
		sha256_final(&h, o->data_verifier.data);
		o->ranks = xcalloc(m->nranks + 1, sizeof(*o->ranks));
		o->n_ranks = m->nranks;
		for (size_t k = 0; k < m->nranks; k++) {
			o->ranks[k] = xmalloc(sizeof(*o->ranks[k]));
			refit__v1__rank_info__init(o->ranks[k]);
			o->ranks[k]->rank = m->ranks[k].rank;
			o->ranks[k]->domain = m->ranks[k].domain;
		}
		mp[i] = o;
	}
	return mp;
}

void
coord_members_msg_free(Refit__V1__Member *mv, Refit__V1__Member **mp, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		for (size_t k = 0; k < mv[i].n_ranks; k++)
			free(mv[i].ranks[k]);
		free(mv[i].ranks);
		free(mv[i].data_verifier.data);
	}
	free(mv);
	free(mp);
}


/* The RunSlice instances of r: the trainer first, then the instances in
 * the order the plan composed them (*n of them, in *iv; coord_free_layouts). */
Refit__V1__InstanceLayouts **
coord_instance_layouts(const refit_rec_t *r, const model_t *m, Refit__V1__InstanceLayouts **iv,
		       size_t *n)
{
	Refit__V1__InstanceLayouts **ip = xcalloc(m->inst.n + 1, sizeof(*ip));

	*iv = xcalloc(m->inst.n + 1, sizeof(**iv));
	*n = 0;
	for (int pass = 0; pass < 2; pass++)
		for (size_t i = 0; i < m->inst.n; i++) {
			const instance_t *in = &m->inst.v[i];
			Refit__V1__InstanceLayouts *o = &(*iv)[*n];

			if ((pass == 0) != (in->role == REFIT__V1__ROLE__TRAIN))
				continue;
			if (in->role == REFIT__V1__ROLE__INFER &&
			    ((r->only && strcmp(r->only, in->name) != 0) || in->skip))
				continue;
			refit__v1__instance_layouts__init(o);
			o->instance = in->name;
			o->role = (Refit__V1__Role)in->role;
			o->tensors = conv_layouts_to_proto(&in->layouts);
			o->n_tensors = in->layouts.n;
			ip[(*n)++] = o;
		}
	return ip;
}

void
coord_free_layouts(Refit__V1__InstanceLayouts *iv, Refit__V1__InstanceLayouts **ip, size_t n)
{
	for (size_t i = 0; i < n; i++)
		conv_layouts_proto_free(iv[i].tensors, iv[i].n_tensors);
	free(iv);
	free(ip);
}

/* RunSlice's request for r's attempt, all but its deadline and each node's
 * slice: the refit, its plan, o's chunk and staging sizes, and the
 * instances of m taking part (*iv; coord_free_layouts frees them). */
void
coord_run_request(const coord_t *c, refit_rec_t *r, const model_t *m,
		  const plan_opts_t *o, Refit__V1__RunSliceRequest *rq,
		  Refit__V1__InstanceLayouts **iv)
{
	rq->instances = coord_instance_layouts(r, m, iv, &rq->n_instances);
	rq->refit_id = r->id;
	rq->epoch = r->epoch;
	rq->plan_digest = r->plan_digest;
	rq->model = r->model;
	rq->version = r->version;
	rq->verify = r->verify;
	rq->mode = (Refit__V1__Mode)r->mode;
	rq->chunk_bytes = o->chunk_bytes;
	rq->staging_bytes = o->staging_bytes;
	rq->corrupt_msg = r->corrupt;
	rq->nic_per_node = c->o.nic_per_node;
	rq->attempt = r->fsm.attempt;
}

/* ---- the instances taking part ------------------------------------------- */

bool
coord_refit_choose_instances(coord_t *c, model_t *m, refit_rec_t *r, strbuf_t *why)
{
	strbuf_t sb;
	size_t healthy = 0;

	for (size_t i = 0; i < r->nskipped; i++)
		free(r->skipped[i]);
	r->nskipped = 0;
	strbuf_init(&sb);
	for (size_t i = 0; i < m->inst.n; i++) {
		instance_t *in = &m->inst.v[i];
		int32_t lost, unreg;
		size_t t;

		in->skip = false;
		if (in->role != REFIT__V1__ROLE__INFER ||
		    (r->only && strcmp(r->only, in->name) != 0))
			continue;
		lost = coord_rules_unheld_rank(c->members.v, c->members.n, &in->layouts, &t);
		/* whole: every node of it is a member and registered it (coord_store.c) */
		unreg = lost < 0 ? coord_instance_unheld(c, in) : lost;
		if (unreg < 0) {
			healthy++;
			continue;
		}
		in->skip = true;   /* it is behind now: caught up once whole (coord_refit_api.c) */
		r->skipped = xreallocarray(r->skipped, r->nskipped + 1, sizeof(char *));
		r->skipped[r->nskipped++] = xstrdup(in->name);
		if (lost >= 0)
			strbuf_printf(&sb, "%s\"%s\" (rank %d has no node)", sb.len ? ", " : "",
				      in->name, lost);
		else
			strbuf_printf(&sb, "%s\"%s\" (its node left; the node of rank %d has "
				      "not registered it again)", sb.len ? ", " : "", in->name,
				      unreg);
	}
	if (r->nskipped && (m->strict_instances || healthy == 0)) {
		for (size_t i = 0; i < m->inst.n; i++)
			m->inst.v[i].skip = false;
		strbuf_printf(why, "%s: %s", healthy == 0 ? "no healthy inference instance" :
			      "instances not healthy (strict policy)", sb.s);
		strbuf_fini(&sb);
		return false;
	}
	if (r->nskipped)
		log_warnx("coordinator: refit %" PRIu64 " (%s v%" PRIu64 ") skips %s", r->id,
			  r->model, r->version, sb.s);
	strbuf_fini(&sb);
	return true;
}
