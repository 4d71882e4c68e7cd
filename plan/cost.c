/*
 * cost.c - the cost model and the bandwidth lower bound.
 *
 * Model: every rank has a NIC (network_gbps each way; or every node has one,
 * shared by its ranks, when the topology says "nic": "node") and an NVLink port
 * (nvlink_gbps each way); links work in parallel.  A resource (one
 * direction of one NIC or port) is busy bytes/bandwidth plus one latency
 * per message it carries.  Stages are pipelined through chunks, so the
 * plan takes as long as its busiest resource, plus one chunk's fill time
 * for every stage after the first.  Local copies (from == to) are free.
 * Calibrated host costs, when the topology gives them (0: not modelled):
 * every NIC's ranks (a rank, or a node sharing one NIC) have a copier
 * that packs what they send and unpacks what they receive over NVLink
 * or the network at pack_gbps / unpack_gbps, a resource of its own that
 * works while other messages are on the wire; and every distinct
 * (from, to) network pair of NICs costs connection_us on both NICs once.
 *
 * Lower bound, for the same inputs and topology and independent of any
 * plan: a destination domain must receive over the network every byte its
 * ranks need that no rank of the domain holds (B_in), spread at best over
 * all its NICs; a source domain that alone holds bytes needed elsewhere must
 * send them at least once (B_out); bytes a rank needs and does not hold
 * itself arrive over NVLink unless its own NIC brings them, so a domain's
 * ports carry at least sum(need) - B_in.  The bound is the largest of
 * these times plus one network latency.  Its network byte count,
 * sum(B_in), is the minimum any plan must send, and reshard plans meet it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan/internal.h"

typedef struct lbctx {
	const plan_layout_set_t *dst;
	const plan_topo_t *topo;
	uint64_t *b_in;        /* per dst domain */
	uint64_t *x_need;      /* per dst domain: bytes needed, not self-held */
	uint64_t *b_out;       /* per src domain */
	uint64_t *g_dom;       /* per group: bytes of it needed in this domain */
	uint64_t *g_max;       /* per group: max over domains of g_dom */
	uint64_t payload;
	const srcidx_t *ix;
} lbctx_t;

static void
lb_item(void *ctx, const needs_item_t *it)
{
	lbctx_t *c = ctx;
	const plan_layout_t *t = &c->dst->v[it->tensor];
	uint64_t b = (uint64_t)plan_box_volume(it->box, t->ndim) *
		     plan_dtype_size(t->dtype);
	const srcgroup_t *g = &it->src->g[it->group];

	c->ix = it->src;
	for (uint32_t k = 0; k < it->nneed; k++) {
		c->payload += b;
		if (!srcidx_holds(it->src, g, it->need[k]))
			c->x_need[it->domain] += b;
	}
	if (!it->local) {
		c->b_in[it->domain] += b;
		c->g_dom[it->group] += b;
	}
}

static void
lb_domain_end(void *ctx, uint32_t tensor, int32_t domain)
{
	lbctx_t *c = ctx;

	(void)tensor;
	(void)domain;
	if (c->ix == NULL)
		return;
	for (size_t g = 0; g < c->ix->ng; g++) {
		if (c->g_dom[g] > c->g_max[g])
			c->g_max[g] = c->g_dom[g];
		c->g_dom[g] = 0;
	}
}

/* Add to b_out the bytes of groups held inside a single domain. */
static void
lb_tensor_end(lbctx_t *c, const srcidx_t *ix)
{
	for (size_t g = 0; g < ix->ng; g++) {
		const srcgroup_t *sg = &ix->g[g];
		int32_t d = plan_topo_domain(c->topo, ix->holders[sg->h0]);
		bool single = true;

		for (uint32_t k = 1; k < sg->nh && single; k++)
			single = plan_topo_domain(c->topo, ix->holders[sg->h0 + k]) == d;
		if (single)
			c->b_out[d] += c->g_max[g];
	}
}

/* Nodes with a rank in domain d (NICs of the domain when shared per node). */
static double
nodes_in_domain(const plan_topo_t *t, int32_t d)
{
	uint8_t *seen = xcalloc((size_t)t->nnodes + 1, 1);
	double n = 0;

	for (int32_t r = 0; r < t->nslots; r++)
		if (t->rank_domain[r] == d && !seen[t->rank_node[r]]) {
			seen[t->rank_node[r]] = 1;
			n++;
		}
	free(seen);
	return n;
}

static refit_status_t
lower_bound(const plan_layout_set_t *src, const plan_layout_set_t *dst,
	    const size_t *map, const plan_topo_t *topo, plan_cost_t *out,
	    refit_err_t *err)
{
	size_t nd = (size_t)topo->ndomains;
	lbctx_t c = {.dst = dst, .topo = topo};
	needs_visitor_t v = {.item = lb_item, .domain_end = lb_domain_end, .ctx = &c};
	double net = plan_topo_net_Bps(topo), nvl = plan_topo_nvl_Bps(topo), t = 0;
	refit_status_t rc = REFIT_OK;

	c.b_in = xcalloc(nd, sizeof(uint64_t));
	c.x_need = xcalloc(nd, sizeof(uint64_t));
	c.b_out = xcalloc(nd, sizeof(uint64_t));
	for (size_t i = 0; i < dst->n && rc == REFIT_OK; i++) {
		srcidx_t ix;

		srcidx_build(&ix, &src->v[map[i]]);
		c.g_dom = xcalloc(ix.ng ? ix.ng : 1, sizeof(uint64_t));
		c.g_max = xcalloc(ix.ng ? ix.ng : 1, sizeof(uint64_t));
		c.ix = &ix;
		rc = needs_walk(&ix, &dst->v[i], (uint32_t)i, topo, &v, err);
		lb_tensor_end(&c, &ix);
		free(c.g_dom);
		free(c.g_max);
		srcidx_fini(&ix);
	}
	out->lb_network_bytes = 0;
	for (size_t d = 0; d < nd; d++) {
		double n = topo->nic_per_node ? nodes_in_domain(topo, (int32_t)d)
					      : topo->domain_size[d];
		double nr = topo->domain_size[d];
		double nvl_bytes = c.x_need[d] > c.b_in[d] ? (double)(c.x_need[d] - c.b_in[d]) : 0;

		out->lb_network_bytes += c.b_in[d];
		t = fmax(t, (double)c.b_in[d] / (n * net));
		t = fmax(t, (double)c.b_out[d] / (n * net));
		t = fmax(t, nvl_bytes / (nr * nvl));
	}
	out->payload_bytes = c.payload;
	out->lb_time_s = t + (out->lb_network_bytes ? topo->latency_network_us * 1e-6 : 0);
	free(c.b_in);
	free(c.x_need);
	free(c.b_out);
	return rc;
}

typedef struct tm {
	const plan_topo_t *topo;
	size_t ns;
	double *busy;       /* 4 per rank: net tx, net rx, nvl tx, nvl rx */
	uint64_t *msgs;     /* 4 per rank: messages, the same resources */
	uint64_t *nic, *port; /* 2 per rank: tx, rx */
	double bw[PLAN_LINK_COUNT], lat[PLAN_LINK_COUNT];
} tm_t;

/* Charge n messages carrying b bytes from -> to on link l. */
static void
charge(tm_t *m, plan_link_t l, int32_t from, int32_t to, uint64_t b, uint64_t n)
{
	double t = (double)b / m->bw[l] + (double)n * m->lat[l];
	size_t base = l == PLAN_LINK_NETWORK ? 0 : 2;
	uint64_t *cnt = l == PLAN_LINK_NETWORK ? m->nic : m->port;

	if (l == PLAN_LINK_NETWORK) { /* a node's ranks may share one NIC */
		from = plan_topo_nic(m->topo, from);
		to = plan_topo_nic(m->topo, to);
	}
	m->busy[base * m->ns + (size_t)from] += t;
	m->busy[(base + 1) * m->ns + (size_t)to] += t;
	m->msgs[base * m->ns + (size_t)from] += n;
	m->msgs[(base + 1) * m->ns + (size_t)to] += n;
	cnt[(size_t)from] += b;
	cnt[m->ns + (size_t)to] += b;
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* Setup time t on both NICs of every distinct network pair (from << 32 |
 * to, NIC indices) in v[0..n). */
static void
connections(tm_t *m, uint64_t *v, size_t n, double t)
{
	if (n > 1)
		qsort(v, n, sizeof(*v), cmp_u64);
	for (size_t i = 0; i < n; i++)
		if (i == 0 || v[i] != v[i - 1]) {
			m->busy[(size_t)(v[i] >> 32)] += t;             /* net tx */
			m->busy[m->ns + (size_t)(uint32_t)v[i]] += t;   /* net rx */
		}
}

/* A rank behind NIC index i (a node's first rank when NICs are per node). */
static int32_t
nic_rank(const plan_topo_t *topo, int32_t i)
{
	int32_t r = i;

	if (topo->nic_per_node)
		for (r = 0; r < topo->nslots && topo->rank_node[r] != i; r++)
			;
	return r;
}

/* Resource i (of m.busy) is the busiest so far: what its time is made of. */
static void
busiest(const tm_t *m, size_t i, plan_cost_t *out, double *tmax)
{
	int kind = (int)(i / m->ns);
	int32_t r = (int32_t)(i % m->ns);
	bool net = kind == PLAN_RES_NET_TX || kind == PLAN_RES_NET_RX;
	plan_link_t l = net ? PLAN_LINK_NETWORK : PLAN_LINK_NVLINK;
	uint64_t b = net ? m->nic[(size_t)(kind & 1) * m->ns + (size_t)r]
			 : m->port[(size_t)(kind & 1) * m->ns + (size_t)r];

	*tmax = m->busy[i];
	out->busiest.kind = kind;
	out->busiest.rank = net ? nic_rank(m->topo, r) : r;
	out->busiest.bytes = b;
	out->busiest.msgs = m->msgs[i];
	out->busiest.bytes_s = (double)b / m->bw[l];
	out->busiest.latency_s = (double)m->msgs[i] * m->lat[l];
	out->busiest.other_s = m->busy[i] - out->busiest.bytes_s - out->busiest.latency_s;
}

/*
 * A transfer of b dense bytes in *n messages on the wire (dl NULL: as it
 * is).  Encoded, a large transfer's messages carry chunk encoded bytes
 * each (the sender encodes sub-boxes of about that size), each with its
 * header; a transfer sent dense where that is smaller keeps its messages.
 */
static uint64_t
wire_bytes(const plan_delta_t *dl, uint32_t elem, uint64_t b, uint64_t chunk, uint64_t *n)
{
	double r = elem < 9 ? dl->ratio[elem] : 1.0;
	uint64_t w = (uint64_t)ceil((double)b * r), k = *n;

	if (b > chunk) {
		k = (w + chunk - 1) / chunk;
		k = k ? k : 1;
	}
	w += (uint64_t)dl->hdr_bytes * (k ? k : 1);
	if (w >= b)
		return b;
	*n = k;
	return w;
}

/*
 * Busy time of every resource under the message rule (plan.h), and the
 * pipeline fill of every used stage: one message of the stage before.
 * With dl, boxes travel encoded and every rank's codec is a resource.
 */
static void
model_time(const plan_t *p, const plan_topo_t *topo, const plan_delta_t *dl,
	   plan_cost_t *out)
{
	tm_t m = {.topo = topo, .ns = (size_t)topo->nslots,
		  .bw = {1, plan_topo_nvl_Bps(topo), plan_topo_net_Bps(topo)},
		  .lat = {0, topo->latency_nvlink_us * 1e-6, topo->latency_network_us * 1e-6}};
	uint64_t chunk = p->opts.chunk_bytes, fill_bytes = 0;
	uint32_t per = p->stages_per_round ? p->stages_per_round : 1;
	double tmax = 0, fill_sum = 0, fill_max = 0;
	double *fill = xcalloc(per, sizeof(double)); /* per stage inside a round */
	int64_t cur_stage = -1;

	double pack_Bps = topo->pack_gbps * 1e9 / 8, unpack_Bps = topo->unpack_gbps * 1e9 / 8;
	double *host = xcalloc(m.ns, sizeof(double)); /* per NIC index: copy time */
	double *codec = dl ? xcalloc(m.ns, sizeof(double)) : NULL; /* per rank */
	VEC(uint64_t) pairs = {0};

	m.busy = xcalloc(4 * m.ns, sizeof(double));
	m.msgs = xcalloc(4 * m.ns, sizeof(uint64_t));
	m.nic = xcalloc(2 * m.ns, sizeof(uint64_t));
	m.port = xcalloc(2 * m.ns, sizeof(uint64_t));
	for (size_t i = 0; i < p->nxfers; i++) {
		const plan_xfer_t *x = &p->xfers[i];
		const plan_tensor_ref_t *t = &p->tensors[x->tensor];
		plan_link_t l = plan_link_of(topo, x->from, x->to);
		uint64_t b = plan_xfer_bytes(p, x), n = 0;
		bool new_group = i == 0 || x->stage != p->xfers[i - 1].stage ||
				 x->from != p->xfers[i - 1].from || x->to != p->xfers[i - 1].to;

		if (b > chunk) {
			n = plan_box_chunk_count(plan_xfer_box(p, x), t->ndim, t->elem, chunk);
			fill_bytes = chunk + 1;
		} else if (new_group || fill_bytes + b > chunk) {
			n = 1;
			fill_bytes = b;
		} else {
			fill_bytes += b;
		}
		if (l == PLAN_LINK_LOCAL) {
			out->msgs[l] += n;
			out->bytes[l] += b;
			continue;
		}
		if ((int64_t)x->stage != cur_stage) {
			cur_stage = x->stage;
			out->stages_used++;
		}
		{
			uint64_t w = dl ? wire_bytes(dl, t->elem, b, chunk, &n) : b;

			out->bytes[l] += w;
			out->msgs[l] += n;
			fill[x->stage % per] = fmax(fill[x->stage % per],
						    (double)(w < chunk ? w : chunk) / m.bw[l] +
							    m.lat[l]);
			charge(&m, l, x->from, x->to, w, n);
			if (codec != NULL && w < b) {
				if (x->stage % per == 0 && dl->encode_Bps > 0)
					codec[x->from] += (double)b / dl->encode_Bps;
				if (dl->decode_Bps > 0)
					codec[x->to] += (double)b / dl->decode_Bps;
			}
		}
		if (pack_Bps > 0)
			host[plan_topo_nic(topo, x->from)] += (double)b / pack_Bps;
		if (unpack_Bps > 0)
			host[plan_topo_nic(topo, x->to)] += (double)b / unpack_Bps;
		if (topo->connection_us > 0 && l == PLAN_LINK_NETWORK && new_group)
			VEC_PUSH(&pairs, (uint64_t)plan_topo_nic(topo, x->from) << 32 |
					 (uint32_t)plan_topo_nic(topo, x->to));
	}
	connections(&m, pairs.v, pairs.n, topo->connection_us * 1e-6);
	VEC_FREE(&pairs);
	for (size_t i = 0; i < m.ns; i++)
		if (host[i] > tmax) {
			tmax = host[i];
			out->busiest.kind = PLAN_RES_HOST;
			out->busiest.rank = nic_rank(topo, (int32_t)i);
			out->busiest.other_s = host[i];
		}
	free(host);
	for (size_t i = 0; codec != NULL && i < m.ns; i++)
		if (codec[i] > tmax) {
			tmax = codec[i];
			out->busiest.kind = PLAN_RES_CODEC;
			out->busiest.rank = (int32_t)i;
			out->busiest.bytes = out->busiest.msgs = 0;
			out->busiest.bytes_s = out->busiest.latency_s = 0;
			out->busiest.other_s = codec[i];
		}
	free(codec);
	for (uint32_t k = 0; k < per; k++) {
		fill_sum += fill[k];
		fill_max = fmax(fill_max, fill[k]);
	}
	free(fill);
	for (size_t i = 0; i < 4 * m.ns; i++)
		if (m.busy[i] > tmax)
			busiest(&m, i, out, &tmax);
	for (size_t i = 0; i < 2 * m.ns; i++) {
		if (m.nic[i] > out->max_nic_bytes) {
			out->max_nic_bytes = m.nic[i];
			out->max_nic_rank = nic_rank(topo, (int32_t)(i % m.ns));
		}
		if (m.port[i] > out->max_nvl_bytes) {
			out->max_nvl_bytes = m.port[i];
			out->max_nvl_rank = (int32_t)(i % m.ns);
		}
	}
	/* each stage after the first waits for one message of the one before;
	 * rounds overlap (the executor orders messages by the data they carry,
	 * rounds only say when staging is freed), so a round's depth counts */
	out->fill_s = fill_sum - fill_max;
	out->time_s = tmax + out->fill_s;
	free(m.busy);
	free(m.msgs);
	free(m.nic);
	free(m.port);
}

refit_status_t
plan_cost(const plan_t *p, const plan_layout_set_t *src,
	  const plan_layout_set_t *dst, const plan_topo_t *topo,
	  plan_cost_t *out, refit_err_t *err)
{
	return plan_cost_delta(p, src, dst, topo, NULL, out, err);
}

refit_status_t
plan_cost_delta(const plan_t *p, const plan_layout_set_t *src,
		const plan_layout_set_t *dst, const plan_topo_t *topo,
		const plan_delta_t *dl, plan_cost_t *out, refit_err_t *err)
{
	size_t *map = NULL;
	refit_status_t rc;

	memset(out, 0, sizeof(*out));
	out->max_nic_rank = out->max_nvl_rank = out->busiest.rank = -1;
	CHECK(plan_match(src, dst, &map, err));
	rc = lower_bound(src, dst, map, topo, out, err);
	free(map);
	if (rc != REFIT_OK)
		return rc;
	model_time(p, topo, dl, out);
	out->ratio = out->lb_time_s > 0 ? out->time_s / out->lb_time_s : 1.0;
	return REFIT_OK;
}
