/*
 * plan.c - plan_build (input checks, dispatch to a planner), chunking into
 * messages, canonical form and digest.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/strbuf.h"
#include "plan/internal.h"

void
plan_opts_default(plan_opts_t *o)
{
	o->mode = PLAN_MODE_RESHARD;
	o->chunk_bytes = PLAN_DEFAULT_CHUNK_BYTES;
	o->staging_bytes = PLAN_DEFAULT_STAGING_BYTES;
}

const char *
plan_mode_name(plan_mode_t m)
{
	return m == PLAN_MODE_BROADCAST ? "broadcast" : "reshard";
}

refit_status_t
plan_mode_parse(const char *s, plan_mode_t *out)
{
	if (strcmp(s, "reshard") == 0)
		*out = PLAN_MODE_RESHARD;
	else if (strcmp(s, "broadcast") == 0)
		*out = PLAN_MODE_BROADCAST;
	else
		return REFIT_ERR_INVALID_ARG;
	return REFIT_OK;
}

plan_link_t
plan_link_of(const plan_topo_t *topo, int32_t from, int32_t to)
{
	if (from == to)
		return PLAN_LINK_LOCAL;
	if (plan_topo_domain(topo, from) == plan_topo_domain(topo, to))
		return PLAN_LINK_NVLINK;
	return PLAN_LINK_NETWORK;
}

const char *
plan_link_name(plan_link_t l)
{
	static const char *const n[] = {"local", "nvlink", "network"};

	return (unsigned)l < PLAN_LINK_COUNT ? n[l] : "?";
}

void
plan_init_tensors(plan_t *p, const plan_layout_set_t *dst, const plan_opts_t *opts)
{
	p->opts = *opts;
	p->ntensors = (uint32_t)dst->n;
	p->tensors = xcalloc(dst->n ? dst->n : 1, sizeof(*p->tensors));
	for (size_t i = 0; i < dst->n; i++) {
		p->tensors[i].name = xstrdup(dst->v[i].name);
		p->tensors[i].dtype = dst->v[i].dtype;
		p->tensors[i].ndim = dst->v[i].ndim;
		p->tensors[i].elem = (uint32_t)plan_dtype_size(dst->v[i].dtype);
	}
}

void
plan_box_chunk(const plan_box_t *box, int ndim, uint64_t elem, uint64_t max,
	       boxvec_t *out)
{
	int64_t count[PLAN_MAX_DIMS], idx[PLAN_MAX_DIMS] = {0};
	uint64_t slab = elem;
	int d;

	for (d = ndim - 1; d >= 0; d--) {
		if (slab * (uint64_t)box->size[d] <= max)
			slab *= (uint64_t)box->size[d];
		else
			break;
	}
	if (d < 0) {
		VEC_PUSH(out, *box);
		return;
	}
	/* dims > d fit whole; dim d is cut into near-equal runs; dims < d are
	 * taken one index at a time */
	int64_t rows = (int64_t)(max / slab);
	int64_t pieces = (box->size[d] + rows - 1) / rows;
	int64_t n = box->size[d], base = n / pieces, extra = n % pieces;

	for (int i = 0; i < d; i++)
		count[i] = box->size[i];
	count[d] = pieces;
	for (;;) {
		plan_box_t c = *box;
		int i;

		for (i = 0; i < d; i++) {
			c.off[i] = box->off[i] + idx[i];
			c.size[i] = 1;
		}
		c.off[d] = box->off[d] + idx[d] * base + (idx[d] < extra ? idx[d] : extra);
		c.size[d] = base + (idx[d] < extra ? 1 : 0);
		VEC_PUSH(out, c);
		for (i = d; i >= 0 && ++idx[i] == count[i]; i--)
			idx[i] = 0;
		if (i < 0)
			break;
	}
}

/* Split x into transfers of at most chunk bytes, appended to out. */
static void
chunk_xfer(const plan_xfer_t *x, int ndim, uint64_t elem, uint64_t chunk,
	   xfervec_t *out, boxvec_t *tmp)
{
	tmp->n = 0;
	plan_box_chunk(&x->box, ndim, elem, chunk, tmp);
	for (size_t i = 0; i < tmp->n; i++) {
		plan_xfer_t c = *x;

		c.box = tmp->v[i];
		VEC_PUSH(out, c);
	}
}

static int
cmp_xfer(const void *a, const void *b)
{
	const plan_xfer_t *x = a, *y = b;

	if (x->stage != y->stage)
		return x->stage < y->stage ? -1 : 1;
	if (x->from != y->from)
		return x->from < y->from ? -1 : 1;
	if (x->to != y->to)
		return x->to < y->to ? -1 : 1;
	if (x->tensor != y->tensor)
		return x->tensor < y->tensor ? -1 : 1;
	return plan_box_cmp(&x->box, &y->box, PLAN_MAX_DIMS);
}

static void
build_msgs(plan_t *p)
{
	VEC(plan_msg_t) m = {0};

	for (size_t i = 0; i < p->nxfers; i++) {
		plan_xfer_t *x = &p->xfers[i];
		uint64_t b = plan_xfer_bytes(p, x);
		plan_msg_t *last = m.n ? &m.v[m.n - 1] : NULL;

		if (last == NULL || last->stage != x->stage || last->from != x->from ||
		    last->to != x->to || last->bytes + b > p->opts.chunk_bytes) {
			plan_msg_t nm = {x->stage, x->from, x->to, 0, (uint32_t)i, 0};

			VEC_PUSH(&m, nm);
			last = &m.v[m.n - 1];
		}
		last->bytes += b;
		last->count++;
		x->msg = (uint32_t)(m.n - 1);
	}
	p->msgs = m.v;
	p->nmsgs = m.n;
}

static void
canonical_head(const plan_t *p, strbuf_t *out)
{
	strbuf_printf(out, "refit-plan v1\nmode %s\nchunk %" PRIu64 "\nstaging %" PRIu64
		      "\nstages %u per-round %u\ntensors %u\n",
		      plan_mode_name(p->opts.mode), p->opts.chunk_bytes,
		      p->opts.staging_bytes, p->nstages, p->stages_per_round,
		      p->ntensors);
	for (uint32_t i = 0; i < p->ntensors; i++) {
		strbuf_printf(out, "t %u ", i);
		strbuf_json_str(out, p->tensors[i].name);
		strbuf_printf(out, " %s %d\n", plan_dtype_name(p->tensors[i].dtype),
			      p->tensors[i].ndim);
	}
}

static void
canonical_xfers(const plan_t *p, size_t from, size_t to, strbuf_t *out)
{
	for (size_t i = from; i < to; i++) {
		const plan_xfer_t *x = &p->xfers[i];
		int nd = p->tensors[x->tensor].ndim;

		strbuf_printf(out, "x %u %d %d %u %u", x->stage, x->from, x->to,
			      x->tensor, x->msg);
		for (int d = 0; d < nd; d++)
			strbuf_printf(out, " %" PRId64 "+%" PRId64, x->box.off[d],
				      x->box.size[d]);
		strbuf_puts(out, "\n");
	}
}

void
plan_canonical(const plan_t *p, strbuf_t *out)
{
	canonical_head(p, out);
	canonical_xfers(p, 0, p->nxfers, out);
}

/* SHA-256 of the canonical form, streamed in bounded pieces. */
static void
compute_digest(plan_t *p)
{
	strbuf_t sb;
	sha256_ctx_t c;

	strbuf_init(&sb);
	sha256_init(&c);
	canonical_head(p, &sb);
	sha256_update(&c, sb.s, sb.len);
	for (size_t i = 0; i < p->nxfers; i += 4096) {
		size_t end = p->nxfers - i < 4096 ? p->nxfers : i + 4096;

		strbuf_reset(&sb);
		canonical_xfers(p, i, end, &sb);
		sha256_update(&c, sb.s, sb.len);
	}
	sha256_final(&c, p->digest);
	sha256_to_hex(p->digest, p->digest_hex);
	strbuf_fini(&sb);
}

void
plan_finalize(plan_t *p, plan_xfer_t *raw, size_t nraw)
{
	xfervec_t out = {0};
	boxvec_t tmp = {0};

	for (size_t i = 0; i < nraw; i++) {
		const plan_tensor_ref_t *t = &p->tensors[raw[i].tensor];

		chunk_xfer(&raw[i], t->ndim, t->elem, p->opts.chunk_bytes, &out, &tmp);
	}
	VEC_FREE(&tmp);
	xqsort(out.v, out.n, sizeof(*out.v), cmp_xfer);
	p->xfers = out.v;
	p->nxfers = out.n;
	p->nstages = out.n ? out.v[out.n - 1].stage + 1 : 0;
	if (p->stages_per_round == 0)
		p->stages_per_round = p->nstages ? p->nstages : 1;
	build_msgs(p);
	compute_digest(p);
}

void
plan_fini(plan_t *p)
{
	if (p == NULL)
		return;
	for (uint32_t i = 0; i < p->ntensors; i++)
		free(p->tensors[i].name);
	free(p->tensors);
	free(p->xfers);
	free(p->msgs);
	memset(p, 0, sizeof(*p));
}

static refit_status_t
check_opts(const plan_opts_t *o, refit_err_t *err)
{
	if (o->chunk_bytes < 64 || o->chunk_bytes > (1ull << 40))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "chunk bytes %" PRIu64 " out of range (64 B to 1 TiB)",
				     o->chunk_bytes);
	if (o->staging_bytes < o->chunk_bytes)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG,
				     "staging bytes %" PRIu64 " is smaller than chunk bytes %"
				     PRIu64 ": a message must fit in staging",
				     o->staging_bytes, o->chunk_bytes);
	if (o->mode != PLAN_MODE_RESHARD && o->mode != PLAN_MODE_BROADCAST)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "unknown plan mode %d",
				     (int)o->mode);
	return REFIT_OK;
}

/* Every rank of every layout must be in the topology. */
static refit_status_t
check_ranks(const plan_layout_set_t *s, const char *side, const plan_topo_t *topo,
	    refit_err_t *err)
{
	for (size_t i = 0; i < s->n; i++)
		for (size_t k = 0; k < s->v[i].nshards; k++)
			if (plan_topo_domain(topo, s->v[i].shards[k].rank) < 0)
				return refit_err_set(err, REFIT_ERR_INVALID_ARG,
						     "%s layout \"%s\": rank %d is not in the "
						     "topology (%d ranks)", side, s->v[i].name,
						     s->v[i].shards[k].rank, topo->nranks);
	return REFIT_OK;
}

refit_status_t
plan_build(const plan_layout_set_t *src, const plan_layout_set_t *dst,
	   const plan_topo_t *topo, const plan_opts_t *opts, plan_t *p,
	   refit_err_t *err)
{
	size_t *map = NULL;
	xfervec_t raw = {0};
	uint32_t per_round = 0;
	refit_status_t rc;

	memset(p, 0, sizeof(*p));
	CHECK(check_opts(opts, err));
	CHECK(plan_topo_check(topo, err));
	CHECK(check_ranks(src, "source", topo, err));
	CHECK(check_ranks(dst, "destination", topo, err));
	CHECK(plan_match(src, dst, &map, err));
	for (size_t i = 0; i < src->n; i++) {
		rc = plan_layout_check_coverage(&src->v[i], err);
		if (rc != REFIT_OK) {
			refit_err_prefix(err, "source");
			goto out;
		}
	}
	if (opts->mode == PLAN_MODE_RESHARD)
		rc = plan_reshard(src, dst, map, topo, opts, &raw, err);
	else
		rc = plan_broadcast(src, dst, map, topo, opts, &raw, &per_round, err);
	if (rc != REFIT_OK)
		goto out;
	plan_init_tensors(p, dst, opts);
	p->stages_per_round = per_round;
	plan_finalize(p, raw.v, raw.n);
out:
	VEC_FREE(&raw);
	free(map);
	return rc;
}
