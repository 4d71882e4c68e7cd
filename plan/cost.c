/*
 * cost.c - the cost model and the bandwidth lower bound.
 *
 * Model: every rank has a NIC (network_gbps each way) and an NVLink port
 * (nvlink_gbps each way); links work in parallel.  A resource (one
 * direction of one NIC or port) is busy bytes/bandwidth plus one latency
 * per message it carries.  Stages are pipelined through chunks, so the
 * plan takes as long as its busiest resource, plus one chunk's fill time
 * for every stage after the first.  Local copies (from == to) are free.
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
		double n = topo->domain_size[d];
		double nvl_bytes = c.x_need[d] > c.b_in[d] ? (double)(c.x_need[d] - c.b_in[d]) : 0;

		out->lb_network_bytes += c.b_in[d];
		t = fmax(t, (double)c.b_in[d] / (n * net));
		t = fmax(t, (double)c.b_out[d] / (n * net));
		t = fmax(t, nvl_bytes / (n * nvl));
	}
	out->payload_bytes = c.payload;
	out->lb_time_s = t + (out->lb_network_bytes ? topo->latency_network_us * 1e-6 : 0);
	free(c.b_in);
	free(c.x_need);
	free(c.b_out);
	return rc;
}

/* Busy time of every resource, and the fill time of every used stage. */
static void
model_time(const plan_t *p, const plan_topo_t *topo, plan_cost_t *out)
{
	size_t ns = (size_t)topo->nslots;
	double *busy = xcalloc(4 * ns, sizeof(double)); /* net tx, rx, nvl tx, rx */
	uint64_t *nic = xcalloc(2 * ns, sizeof(uint64_t)), *port = xcalloc(2 * ns, sizeof(uint64_t));
	double bw[PLAN_LINK_COUNT] = {0, plan_topo_nvl_Bps(topo), plan_topo_net_Bps(topo)};
	double lat[PLAN_LINK_COUNT] = {0, topo->latency_nvlink_us * 1e-6,
				       topo->latency_network_us * 1e-6};
	double tmax = 0, fill_sum = 0, fill_max = 0, fill = 0;
	int64_t cur_stage = -1;

	for (size_t m = 0; m < p->nmsgs; m++) {
		const plan_msg_t *msg = &p->msgs[m];
		plan_link_t l = plan_link_of(topo, msg->from, msg->to);
		double t;

		out->bytes[l] += msg->bytes;
		out->msgs[l]++;
		if (l == PLAN_LINK_LOCAL)
			continue;
		if ((int64_t)msg->stage != cur_stage) {
			fill_sum += fill;
			fill_max = fmax(fill_max, fill);
			fill = 0;
			cur_stage = msg->stage;
			out->stages_used++;
		}
		t = (double)msg->bytes / bw[l] + lat[l];
		fill = fmax(fill, t);
		size_t base = l == PLAN_LINK_NETWORK ? 0 : 2;
		busy[base * ns + (size_t)msg->from] += t;
		busy[(base + 1) * ns + (size_t)msg->to] += t;
		uint64_t *cnt = l == PLAN_LINK_NETWORK ? nic : port;
		cnt[(size_t)msg->from] += msg->bytes;
		cnt[ns + (size_t)msg->to] += msg->bytes;
	}
	fill_sum += fill;
	fill_max = fmax(fill_max, fill);
	for (size_t i = 0; i < 4 * ns; i++)
		tmax = fmax(tmax, busy[i]);
	for (size_t i = 0; i < 2 * ns; i++) {
		if (nic[i] > out->max_nic_bytes) {
			out->max_nic_bytes = nic[i];
			out->max_nic_rank = (int32_t)(i % ns);
		}
		if (port[i] > out->max_nvl_bytes) {
			out->max_nvl_bytes = port[i];
			out->max_nvl_rank = (int32_t)(i % ns);
		}
	}
	/* each stage after the first waits for one message of the one before */
	out->time_s = tmax + (fill_sum - fill_max);
	free(busy);
	free(nic);
	free(port);
}

refit_status_t
plan_cost(const plan_t *p, const plan_layout_set_t *src,
	  const plan_layout_set_t *dst, const plan_topo_t *topo,
	  plan_cost_t *out, refit_err_t *err)
{
	size_t *map = NULL;
	refit_status_t rc;

	memset(out, 0, sizeof(*out));
	out->max_nic_rank = out->max_nvl_rank = -1;
	CHECK(plan_match(src, dst, &map, err));
	rc = lower_bound(src, dst, map, topo, out, err);
	free(map);
	if (rc != REFIT_OK)
		return rc;
	model_time(p, topo, out);
	out->ratio = out->lb_time_s > 0 ? out->time_s / out->lb_time_s : 1.0;
	return REFIT_OK;
}
