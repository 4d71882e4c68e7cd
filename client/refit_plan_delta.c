/*
 * refit_plan_delta.c - `refit-plan model --delta-density D` (see
 * refit_plan_delta.h).
 *
 * The wire bytes of each element size come from the codec's own size model
 * (dataplane/delta.h: the smallest of bitmap, runs and dense when elements
 * change independently, which bench/delta_density.py measured they do),
 * plus its header per box or message; the codec's time per rank from
 * its speeds (default: bench-delta on one host core).  The same plan is
 * costed again with the codec free (what faster kernels could reach), by
 * bisection over the density for the break-even densities (delta saving
 * less than 1 %), and over the codec's speed for the speed that reaches
 * issue 26's target (10 % of the dense time).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/refit_plan_delta.h"
#include "dataplane/delta.h"

refit_status_t
delta_parse_density(const char *s, delta_opts_t *o, refit_err_t *err)
{
	char *end;
	double d = strtod(s, &end);

	if (end != s && *end == '%' && end[1] == '\0') {
		d /= 100.0;
		end++;
	}
	if (end == s || *end != '\0' || !(d >= 0.0 && d <= 1.0))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "--delta-density \"%s\": expected "
				     "a share of changed elements from 0 to 1 (or 0%% to 100%%)", s);
	o->on = true;
	o->density = d;
	return REFIT_OK;
}

refit_status_t
delta_parse_codec(const char *s, delta_opts_t *o, refit_err_t *err)
{
	char *end, *end2;
	double enc = strtod(s, &end), dec = 0.0;

	if (end != s && *end == ',')
		dec = strtod(end + 1, &end2);
	if (end == s || *end != ',' || end2 == end + 1 || *end2 != '\0' || !(enc > 0.0) ||
	    !(dec > 0.0) || !isfinite(enc) || !isfinite(dec))
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "--delta-codec \"%s\": expected "
				     "ENCODE,DECODE in GB/s of dense bytes per rank, both > 0", s);
	o->encode_gbs = enc;
	o->decode_gbs = dec;
	return REFIT_OK;
}

/* The plan_delta_t of density d; codec speeds (GB/s) or 0: free. */
static void
delta_of(double d, double enc_gbs, double dec_gbs, plan_delta_t *dl)
{
	static const unsigned sizes[] = {1, 2, 4, 8};

	memset(dl, 0, sizeof(*dl));
	for (size_t i = 0; i < 9; i++)
		dl->ratio[i] = 1.0;
	for (size_t i = 0; i < 4; i++)
		dl->ratio[sizes[i]] = dp_delta_model_bytes(d, sizes[i]) / sizes[i];
	dl->hdr_bytes = DP_DELTA_HDR;
	dl->encode_Bps = enc_gbs * 1e9;
	dl->decode_Bps = dec_gbs * 1e9;
}

typedef struct ctx {
	const plan_t *p;
	const plan_layout_set_t *src, *dst;
	const plan_topo_t *topo;
	const plan_cost_t *dense;
} ctx_t;

static refit_status_t
cost_at(const ctx_t *c, double d, double enc, double dec, plan_cost_t *out, refit_err_t *err)
{
	plan_delta_t dl;

	delta_of(d, enc, dec, &dl);
	return plan_cost_delta(c->p, c->src, c->dst, c->topo, &dl, out, err);
}

/* The smallest density (to 1e-4) at which delta saves less than 1 % of the
 * dense refit's modelled time (bytes: network bytes); -1 when it does not
 * even at density 0. */
static refit_status_t
breakeven(const ctx_t *c, double enc, double dec, bool bytes, double *out, refit_err_t *err)
{
	double lo = 0.0, hi = 1.0;
	plan_cost_t k;
	refit_status_t st;

	for (int i = 0; i < 15; i++) {
		double mid = i == 0 ? 0.0 : (lo + hi) / 2;
		bool pays;

		if ((st = cost_at(c, mid, enc, dec, &k, err)) != REFIT_OK)
			return st;
		pays = bytes ? (double)k.bytes[PLAN_LINK_NETWORK] <
				       0.99 * (double)c->dense->bytes[PLAN_LINK_NETWORK]
			     : k.time_s < 0.99 * c->dense->time_s;
		if (i == 0 && !pays) {
			*out = -1.0;
			return REFIT_OK;
		}
		if (i > 0) {
			if (pays)
				lo = mid;
			else
				hi = mid;
		}
	}
	*out = hi;
	return REFIT_OK;
}

/* The smallest codec speed (GB/s per rank, both ways, to 1 %) at which the
 * delta refit at density d takes at most share of the dense time; -1 when
 * it does not even with the codec free. */
static refit_status_t
speed_for(const ctx_t *c, double d, double share, double *out, refit_err_t *err)
{
	double lo = 0.01, hi = 1e6;
	plan_cost_t k;
	refit_status_t st;

	if ((st = cost_at(c, d, 0, 0, &k, err)) != REFIT_OK)
		return st;
	if (k.time_s > share * c->dense->time_s) {
		*out = -1.0;
		return REFIT_OK;
	}
	while (hi / lo > 1.01) {
		double mid = sqrt(lo * hi);

		if ((st = cost_at(c, d, mid, mid, &k, err)) != REFIT_OK)
			return st;
		if (k.time_s <= share * c->dense->time_s)
			hi = mid;
		else
			lo = mid;
	}
	*out = hi;
	return REFIT_OK;
}

static void
json_density(strbuf_t *sb, const char *key, double d)
{
	if (d < 0)
		strbuf_printf(sb, "\"%s\": null", key);
	else
		strbuf_printf(sb, "\"%s\": %.4f", key, d);
}

static const char *const res_key[] = {"net_tx", "net_rx", "nvlink_tx", "nvlink_rx", "host",
				      "codec"};

refit_status_t
delta_report(const plan_t *p, const plan_layout_set_t *src, const plan_layout_set_t *dst,
	     const plan_topo_t *topo, const plan_cost_t *dense, const delta_opts_t *o,
	     bool json, strbuf_t *sb, refit_err_t *err)
{
	ctx_t c = {p, src, dst, topo, dense};
	plan_cost_t k, w;
	double be_t, be_w, be_b, nb, tb, need;
	refit_status_t st;

	if ((st = cost_at(&c, o->density, o->encode_gbs, o->decode_gbs, &k, err)) != REFIT_OK ||
	    (st = cost_at(&c, o->density, 0, 0, &w, err)) != REFIT_OK ||
	    (st = breakeven(&c, o->encode_gbs, o->decode_gbs, false, &be_t, err)) != REFIT_OK ||
	    (st = breakeven(&c, 0, 0, false, &be_w, err)) != REFIT_OK ||
	    (st = breakeven(&c, 0, 0, true, &be_b, err)) != REFIT_OK ||
	    (st = speed_for(&c, o->density, 0.10, &need, err)) != REFIT_OK)
		return st;
	nb = (double)k.bytes[PLAN_LINK_NETWORK] / (double)dense->bytes[PLAN_LINK_NETWORK];
	tb = k.time_s / dense->time_s;
	if (json) {
		strbuf_printf(sb, ", \"delta\": {\"density\": %.6g, \"bf16_wire_ratio\": %.6g, "
			      "\"codec_gbs\": [%.6g, %.6g], \"network_bytes\": %llu, "
			      "\"nvlink_bytes\": %llu, \"network_share\": %.6g, \"time_s\": %.9g, "
			      "\"time_share\": %.6g, \"busiest\": \"%s\", \"codec_free\": "
			      "{\"time_s\": %.9g, \"time_share\": %.6g}, \"breakeven_density\": {",
			      o->density, dp_delta_model_bytes(o->density, 2) / 2.0, o->encode_gbs,
			      o->decode_gbs, (unsigned long long)k.bytes[PLAN_LINK_NETWORK],
			      (unsigned long long)k.bytes[PLAN_LINK_NVLINK], nb, k.time_s, tb,
			      res_key[k.busiest.kind], w.time_s, w.time_s / dense->time_s);
		json_density(sb, "time", be_t);
		strbuf_puts(sb, ", ");
		json_density(sb, "time_codec_free", be_w);
		strbuf_puts(sb, ", ");
		json_density(sb, "network_bytes", be_b);
		strbuf_puts(sb, "}, ");
		json_density(sb, "codec_gbs_for_10pct", need);
		strbuf_puts(sb, "}");
		return REFIT_OK;
	}
	strbuf_printf(sb, "\ndelta refit at density %.2f %% (bf16 on the wire x%.4f; codec %.2f / "
		      "%.2f GB/s per rank):\n  network bytes x%.4f of dense, modelled %.3f s = "
		      "x%.4f of dense (busiest: %s); codec free: %.3f s = x%.4f\n",
		      100.0 * o->density, dp_delta_model_bytes(o->density, 2) / 2.0, o->encode_gbs,
		      o->decode_gbs, nb, k.time_s, tb, res_key[k.busiest.kind], w.time_s,
		      w.time_s / dense->time_s);
	strbuf_puts(sb, "  delta stops paying at density:");
	strbuf_printf(sb, be_t < 0 ? " time never pays" : " time %.2f %%", 100.0 * be_t);
	strbuf_printf(sb, be_w < 0 ? ", codec free never" : ", codec free %.2f %%",
		      100.0 * be_w);
	strbuf_printf(sb, be_b < 0 ? ", network bytes never\n" : ", network bytes %.2f %%\n",
		      100.0 * be_b);
	strbuf_printf(sb, need < 0 ? "  10 %% of the dense time: not even with the codec free\n"
				   : "  10 %% of the dense time needs a codec of %.0f GB/s per rank "
				     "(encode and decode)\n", need);
	return REFIT_OK;
}
