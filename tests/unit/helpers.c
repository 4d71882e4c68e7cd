/*
 * helpers.c - see helpers.h.
 */
#include <string.h>

#include "tests/unit/helpers.h"

void
th_layouts(const char *json, plan_layout_set_t *out)
{
	refit_err_t e;

	refit_err_clear(&e);
	plan_layout_set_init(out);
	if (codec_layouts_parse(json, strlen(json), out, NULL, &e) != REFIT_OK)
		ck_abort_msg("layout failed to parse: %s", e.msg);
}

void
th_layout(const char *json, plan_layout_t *l)
{
	plan_layout_set_t s;

	th_layouts(json, &s);
	ck_assert_uint_eq(s.n, 1);
	*l = s.v[0];
	memset(&s.v[0], 0, sizeof(s.v[0]));
	plan_layout_set_fini(&s);
}

const char *
th_layout_error(const char *json)
{
	static refit_err_t e;
	plan_layout_set_t s;

	refit_err_clear(&e);
	plan_layout_set_init(&s);
	if (codec_layouts_parse(json, strlen(json), &s, NULL, &e) == REFIT_OK)
		ck_abort_msg("layout parsed but should not: %s", json);
	ck_assert_uint_eq(s.n, 0);
	plan_layout_set_fini(&s);
	return e.msg;
}

const plan_shard_t *
th_shard(const plan_layout_t *l, int32_t rank, int n)
{
	for (size_t i = 0; i < l->nshards; i++)
		if (l->shards[i].rank == rank && n-- == 0)
			return &l->shards[i];
	return NULL;
}

int
th_nshards(const plan_layout_t *l, int32_t rank)
{
	int n = 0;

	for (size_t i = 0; i < l->nshards; i++)
		n += l->shards[i].rank == rank;
	return n;
}

void
th_topo(const char *spec, plan_topo_t *t)
{
	refit_err_t e;

	refit_err_clear(&e);
	if (plan_topo_preset(t, spec, 0, &e) != REFIT_OK)
		ck_abort_msg("topology %s: %s", spec, e.msg);
}
