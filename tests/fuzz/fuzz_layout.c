/*
 * fuzz_layout.c - libFuzzer harness for the layout parser, and through it
 * the DTensor resolver, coverage check, planner and validator: any layout
 * that parses is planned onto itself and onto a replicated copy, and the
 * plan must validate.  A crash, a leak, UB or a validator failure is a bug.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "plan/convert.h"

#define MAX_FUZZ_RANK 4096

static void
plan_onto(const plan_layout_set_t *s, const plan_layout_set_t *d, int32_t nranks)
{
	plan_topo_t t;
	plan_opts_t o;
	plan_t p;
	plan_check_t chk;
	refit_err_t e;

	if (plan_topo_preset(&t, "dgx-h100", nranks, NULL) != REFIT_OK)
		abort();
	plan_opts_default(&o);
	o.chunk_bytes = 256;
	o.staging_bytes = 4096;
	for (int mode = 0; mode < 2; mode++) {
		o.mode = mode ? PLAN_MODE_BROADCAST : PLAN_MODE_RESHARD;
		refit_err_clear(&e);
		if (plan_build(s, d, &t, &o, &p, &e) != REFIT_OK)
			continue; /* e.g. a source that does not cover */
		if (plan_validate(&p, s, d, &chk, &e) != REFIT_OK)
			abort();
		plan_fini(&p);
	}
	plan_topo_fini(&t);
}

/* Layouts that convert: from themselves unconverted, the rewrite must pass
 * its own check and plan into valid plans. */
static void
convert_onto(const plan_layout_set_t *d, int32_t nranks)
{
	plan_layout_set_t s;
	plan_conv_t c;
	refit_err_t e;

	if (!plan_convert_any(d))
		return;
	plan_convert_strip(d, &s);
	refit_err_clear(&e);
	if (plan_convert_apply(&s, d, &c, &e) == REFIT_OK) {
		if (plan_convert_check(&c, &s, d, &e) != REFIT_OK)
			abort();
		plan_onto(&c.src, &c.dst, nranks);
		plan_convert_fini(&c);
	} else if (e.msg[0] == '\0') {
		abort();
	}
	plan_layout_set_fini(&s);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	plan_layout_set_t s;
	refit_err_t e;
	int32_t maxr = -1;
	int64_t numel = 0;

	plan_layout_set_init(&s);
	refit_err_clear(&e);
	if (codec_layouts_parse((const char *)data, size, &s, NULL, &e) == REFIT_OK) {
		for (size_t i = 0; i < s.n; i++) {
			strbuf_t sb;

			strbuf_init(&sb);
			codec_boxes_json(&s.v[i], &sb);
			strbuf_fini(&sb);
			numel += plan_layout_numel(&s.v[i]);
			for (size_t k = 0; k < s.v[i].nshards; k++)
				if (s.v[i].shards[k].rank > maxr)
					maxr = s.v[i].shards[k].rank;
		}
		/* keep planning fast: few ranks, small tensors */
		if (maxr >= 0 && maxr < MAX_FUZZ_RANK && numel < (1 << 20)) {
			plan_onto(&s, &s, maxr + 1);
			convert_onto(&s, maxr + 1);
		}
	} else if (e.msg[0] == '\0') {
		abort(); /* every failure must say why */
	}
	plan_layout_set_fini(&s);
	return 0;
}
