/*
 * refit_plan_delta.h - `refit-plan model --delta-density D`: the reshard
 * plan costed as a delta refit (plan_cost_delta) with the delta codec's
 * size model (dp_delta_model_bytes) and its measured speeds, against the
 * dense refit, and the density at which delta stops paying (docs/delta.md).
 */
#ifndef REFIT_CLIENT_PLAN_DELTA_H
#define REFIT_CLIENT_PLAN_DELTA_H

#include <stdbool.h>

#include "common/strbuf.h"
#include "plan/plan.h"

/* bench-delta on one host core at 3 %: GB/s of dense bytes (docs/delta.md) */
#define DELTA_ENCODE_GBS 1.5
#define DELTA_DECODE_GBS 3.0

typedef struct delta_opts {
	bool on;
	double density;          /* share of elements changed, 0..1 */
	double encode_gbs, decode_gbs; /* codec speed per rank, GB/s of dense bytes */
} delta_opts_t;

/* --delta-density "0.03" or "3%"; --delta-codec "ENC,DEC" (GB/s, > 0). */
refit_status_t delta_parse_density(const char *s, delta_opts_t *o, refit_err_t *err);
refit_status_t delta_parse_codec(const char *s, delta_opts_t *o, refit_err_t *err);

/*
 * Cost plan p (dense cost *dense) as a delta refit under o and append the
 * figures to sb: a `, "delta": {...}` member (json) or text lines.
 */
refit_status_t delta_report(const plan_t *p, const plan_layout_set_t *src,
			    const plan_layout_set_t *dst, const plan_topo_t *topo,
			    const plan_cost_t *dense, const delta_opts_t *o, bool json,
			    strbuf_t *sb, refit_err_t *err);

#endif
