/*
 * report.c - plans as JSON and as readable tables.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "codec/json.h"

void
codec_fmt_bytes(double b, char *buf, size_t n)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	int u = 0;

	while (b >= 1024 && u < 5) {
		b /= 1024;
		u++;
	}
	snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", b, unit[u]);
}

void
codec_fmt_time(double s, char *buf, size_t n)
{
	if (s >= 1)
		snprintf(buf, n, "%.3f s", s);
	else if (s >= 1e-3)
		snprintf(buf, n, "%.3f ms", s * 1e3);
	else
		snprintf(buf, n, "%.1f us", s * 1e6);
}

void
codec_cost_json(const plan_cost_t *c, strbuf_t *out)
{
	strbuf_printf(out,
		      "{\"payload_bytes\": %" PRIu64 ", \"network_bytes\": %" PRIu64
		      ", \"nvlink_bytes\": %" PRIu64 ", \"local_bytes\": %" PRIu64
		      ", \"network_messages\": %" PRIu64 ", \"nvlink_messages\": %" PRIu64
		      ", \"busiest_nic\": {\"rank\": %d, \"bytes\": %" PRIu64 "}"
		      ", \"busiest_nvlink\": {\"rank\": %d, \"bytes\": %" PRIu64 "}"
		      ", \"stages_used\": %u, \"time_s\": %.9g"
		      ", \"lower_bound_network_bytes\": %" PRIu64
		      ", \"lower_bound_s\": %.9g, \"ratio\": %.6g}",
		      c->payload_bytes, c->bytes[PLAN_LINK_NETWORK],
		      c->bytes[PLAN_LINK_NVLINK], c->bytes[PLAN_LINK_LOCAL],
		      c->msgs[PLAN_LINK_NETWORK], c->msgs[PLAN_LINK_NVLINK],
		      c->max_nic_rank, c->max_nic_bytes, c->max_nvl_rank,
		      c->max_nvl_bytes, c->stages_used, c->time_s,
		      c->lb_network_bytes, c->lb_time_s, c->ratio);
}

void
codec_plan_json(const plan_t *p, const plan_cost_t *cost, strbuf_t *out)
{
	strbuf_printf(out, "{\"digest\": \"%s\", \"mode\": \"%s\", \"chunk_bytes\": %" PRIu64
		      ", \"staging_bytes\": %" PRIu64 ", \"stages\": %u"
		      ", \"stages_per_round\": %u, \"messages\": %zu",
		      p->digest_hex, plan_mode_name(p->opts.mode), p->opts.chunk_bytes,
		      p->opts.staging_bytes, p->nstages, p->stages_per_round, p->nmsgs);
	if (cost != NULL) {
		strbuf_puts(out, ",\n \"cost\": ");
		codec_cost_json(cost, out);
	}
	strbuf_puts(out, ",\n \"transfers\": [");
	for (size_t i = 0; i < p->nxfers; i++) {
		const plan_xfer_t *x = &p->xfers[i];
		int nd = p->tensors[x->tensor].ndim;

		strbuf_printf(out, "%s\n  {\"stage\": %u, \"from\": %d, \"to\": %d, \"tensor\": ",
			      i ? "," : "", x->stage, x->from, x->to);
		strbuf_json_str(out, p->tensors[x->tensor].name);
		strbuf_puts(out, ", \"offset\": ");
		strbuf_i64_list(out, plan_xfer_box(p, x)->off, nd);
		strbuf_puts(out, ", \"size\": ");
		strbuf_i64_list(out, plan_xfer_box(p, x)->size, nd);
		strbuf_puts(out, "}");
	}
	strbuf_puts(out, "\n]}\n");
}

static void
topo_line(const plan_topo_t *t, strbuf_t *out)
{
	strbuf_printf(out, "topology: %d ranks, %d nodes, %d domains; NIC %.0f Gb/s, "
		      "NVLink %.0f Gb/s per rank; latency %.1f / %.1f us\n",
		      t->nranks, t->nnodes, t->ndomains, t->network_gbps,
		      t->nvlink_gbps, t->latency_network_us, t->latency_nvlink_us);
}

void
codec_plan_summary(const plan_t *p, const plan_cost_t *c, const plan_topo_t *topo,
		   strbuf_t *out)
{
	char a[32], b[32], d[32], e[32];

	strbuf_printf(out, "plan %s (%s), %u tensors\n", p->digest_hex,
		      plan_mode_name(p->opts.mode), p->ntensors);
	topo_line(topo, out);
	codec_fmt_bytes((double)c->payload_bytes, a, sizeof(a));
	strbuf_printf(out, "payload:   %s to destination ranks\n", a);
	strbuf_printf(out, "transfers: %zu in %zu messages over %u stages (%u used)\n",
		      p->nxfers, p->nmsgs, p->nstages, c->stages_used);
	codec_fmt_bytes((double)c->bytes[PLAN_LINK_NETWORK], a, sizeof(a));
	codec_fmt_bytes((double)c->bytes[PLAN_LINK_NVLINK], b, sizeof(b));
	codec_fmt_bytes((double)c->bytes[PLAN_LINK_LOCAL], d, sizeof(d));
	strbuf_printf(out, "bytes:     network %s, nvlink %s, local %s\n", a, b, d);
	codec_fmt_time(c->time_s, a, sizeof(a));
	codec_fmt_time(c->lb_time_s, b, sizeof(b));
	codec_fmt_bytes((double)c->lb_network_bytes, e, sizeof(e));
	strbuf_printf(out, "time:      %s modelled, lower bound %s (x%.3f); "
		      "minimum network bytes %s\n", a, b, c->ratio, e);
}

/* One cell of the explain table: what row arg of cost c says, in b. */
typedef void (*cell_fn)(const plan_cost_t *c, int arg, char *b, size_t n);

/* bytes over link class arg */
static void
cell_bytes(const plan_cost_t *c, int arg, char *b, size_t n)
{
	codec_fmt_bytes((double)c->bytes[arg], b, n);
}

static void
cell_msgs(const plan_cost_t *c, int arg, char *b, size_t n)
{
	(void)arg;
	snprintf(b, n, "%" PRIu64 " / %" PRIu64, c->msgs[PLAN_LINK_NETWORK],
		 c->msgs[PLAN_LINK_NVLINK]);
}

/* "1.50 GiB (rank 3)": the busiest NIC, or (arg 1) NVLink port */
static void
cell_busiest(const plan_cost_t *c, int arg, char *b, size_t n)
{
	char t[32];

	codec_fmt_bytes((double)(arg ? c->max_nvl_bytes : c->max_nic_bytes), t, sizeof(t));
	snprintf(b, n, "%s (rank %d)", t, arg ? c->max_nvl_rank : c->max_nic_rank);
}

static void
cell_stages(const plan_cost_t *c, int arg, char *b, size_t n)
{
	(void)arg;
	snprintf(b, n, "%u", c->stages_used);
}

/* the modelled time, or (arg 1) the lower bound */
static void
cell_time(const plan_cost_t *c, int arg, char *b, size_t n)
{
	codec_fmt_time(arg ? c->lb_time_s : c->time_s, b, n);
}

static void
cell_ratio(const plan_cost_t *c, int arg, char *b, size_t n)
{
	(void)arg;
	snprintf(b, n, "%.3f", c->ratio);
}

void
codec_explain_table(const plan_t *rs, const plan_cost_t *rc, const plan_t *bc,
		    const plan_cost_t *bcc, const plan_topo_t *topo, strbuf_t *out)
{
	static const struct {
		const char *label;
		cell_fn fn;
		int arg;
	} rows[] = {
		{"network bytes", cell_bytes, PLAN_LINK_NETWORK},
		{"nvlink bytes", cell_bytes, PLAN_LINK_NVLINK},
		{"local bytes", cell_bytes, PLAN_LINK_LOCAL},
		{"messages (net / nvl)", cell_msgs, 0},
		{"busiest NIC", cell_busiest, 0},
		{"busiest NVLink port", cell_busiest, 1},
		{"stages used", cell_stages, 0},
		{"modelled time", cell_time, 0},
		{"lower bound", cell_time, 1},
		{"time / lower bound", cell_ratio, 0},
	};
	char a[64], b[64];

	(void)bc; /* its cost says all the table shows */
	codec_fmt_bytes((double)rc->payload_bytes, a, sizeof(a));
	strbuf_printf(out, "%u tensors, payload %s\n", rs->ntensors, a);
	topo_line(topo, out);
	codec_fmt_bytes((double)rc->lb_network_bytes, a, sizeof(a));
	strbuf_printf(out, "minimum network bytes for these layouts: %s\n\n", a);
	strbuf_printf(out, "%-22s %-26s %-26s\n", "", "reshard", "gather-and-broadcast");
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		rows[i].fn(rc, rows[i].arg, a, sizeof(a));
		rows[i].fn(bcc, rows[i].arg, b, sizeof(b));
		strbuf_printf(out, "%-22s %-26s %-26s\n", rows[i].label, a, b);
	}
	strbuf_printf(out, "%-22s x%.2f\n", "reshard speed-up",
		      rc->time_s > 0 ? bcc->time_s / rc->time_s : 0.0);
	strbuf_printf(out, "%-22s %.16s...\n", "reshard digest", rs->digest_hex);
}
