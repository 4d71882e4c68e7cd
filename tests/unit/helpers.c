/*
 * helpers.c - see helpers.h.
 */
#include <stdarg.h>
#include <string.h>

#include "tests/unit/helpers.h"

TCase *
th_tcase(const char *name, double timeout_s, const TTest *const *tests, size_t n)
{
	TCase *tc = tcase_create(name);

	if (timeout_s > 0)
		tcase_set_timeout(tc, timeout_s);
	for (size_t i = 0; i < n; i++)
		tcase_add_test(tc, tests[i]);
	return tc;
}

Suite *
th_suite(const char *name, TCase *tc, ...)
{
	Suite *s = suite_create(name);
	va_list ap;

	va_start(ap, tc);
	for (; tc != NULL; tc = va_arg(ap, TCase *))
		suite_add_tcase(s, tc);
	va_end(ap);
	return s;
}

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

void
th_plan_make(th_plan_t *x, const plan_opts_t *o)
{
	plan_opts_t def;
	refit_err_t e;

	if (o == NULL) {
		plan_opts_default(&def);
		o = &def;
	}
	refit_err_clear(&e);
	ck_assert_msg(plan_build(&x->s, &x->d, &x->t, o, &x->p, &e) == REFIT_OK, "%s", e.msg);
	ck_assert_msg(plan_validate(&x->p, &x->s, &x->d, &x->chk, &e) == REFIT_OK, "%s", e.msg);
	ck_assert_msg(plan_cost(&x->p, &x->s, &x->d, &x->t, &x->c, &e) == REFIT_OK, "%s", e.msg);
}

void
th_plan_build(th_plan_t *x, const char *src, const char *dst, const char *topo,
	      const plan_opts_t *o)
{
	th_layouts(src, &x->s);
	th_layouts(dst, &x->d);
	th_topo(topo, &x->t);
	th_plan_make(x, o);
}

void
th_plan_fini(th_plan_t *x)
{
	plan_fini(&x->p);
	plan_topo_fini(&x->t);
	plan_layout_set_fini(&x->s);
	plan_layout_set_fini(&x->d);
}
