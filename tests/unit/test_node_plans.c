/*
 * test_node_plans.c - the node's plan cache (daemon/node/node_plans.c)
 * without a process: the key a plan is kept under, the bytes it counts,
 * the least recently used eviction within plan_cache_bytes, references
 * (an entry evicted while a slice uses it lives until released), and
 * node_plan_build against plan_build.  Only the plan fields of node_t are
 * used; the rest stays zero.
 */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "daemon/node/node_internal.h"
#include "tests/unit/helpers.h"

/* One [8,4] fp32 tensor sharded on dim 0 over mesh (a JSON list). */
#define TENSOR(mesh)                                                                 \
	"{\"tensors\":[{\"name\":\"w\",\"dtype\":\"fp32\",\"shape\":[8,4],\"mesh\":" mesh \
	",\"placements\":[\"Shard(0)\"]}]}"
#define SRC TENSOR("[0,1]")
#define DST TENSOR("[8,9,10,11]")
#define DST2 TENSOR("[8,9]")

/* A plan of one tensor named name and nxfers (zeroed) transfers; its
 * node_plan_bytes. */
static uint64_t
fake_plan(plan_t *p, const char *name, size_t nxfers)
{
	memset(p, 0, sizeof(*p));
	p->ntensors = 1;
	p->tensors = xcalloc(1, sizeof(*p->tensors));
	p->tensors[0].name = xstrdup(name);
	p->nxfers = nxfers;
	p->xfers = xcalloc(nxfers, sizeof(*p->xfers));
	return node_plan_bytes(p);
}

/* A node whose cache holds at most max bytes. */
static node_t *
cache_new(uint64_t max)
{
	static char name[] = "unit";
	node_t *n = xcalloc(1, sizeof(*n));

	n->node_id = name;   /* log lines name it */
	n->plan_cache_max = max;
	return n;
}

static void
cache_free(node_t *n)
{
	node_plans_fini(n);
	ck_assert_uint_eq(n->plans.n, 0);
	free(n);
}

/* Whether key is cached (without taking a reference). */
static bool
cached(node_t *n, const char *key)
{
	node_plan_t *e = node_plans_get(n, key);

	node_plan_release(n, e);
	return e != NULL;
}

/* Put a fake plan of nxfers transfers under key; the caller's reference is
 * given back at once. */
static void
put(node_t *n, const char *key, size_t nxfers)
{
	plan_t p;
	node_plan_t *e;

	fake_plan(&p, key, nxfers);
	e = node_plans_put(n, key, &p);
	ck_assert_ptr_nonnull(e);
	ck_assert_uint_eq(e->refs, 2);
	ck_assert_str_eq(e->plan.tensors[0].name, key);
	ck_assert_ptr_null(p.tensors);   /* taken */
	node_plan_release(n, e);
}

START_TEST(plan_bytes)
{
	plan_t p;
	uint64_t base = sizeof(node_plan_t) + sizeof(plan_tensor_ref_t);

	fake_plan(&p, "abc", 0);
	ck_assert_uint_eq(node_plan_bytes(&p), base + 4);
	plan_fini(&p);
	fake_plan(&p, "abc", 10);
	ck_assert_uint_eq(node_plan_bytes(&p), base + 4 + 10 * sizeof(plan_xfer_t));
	free(p.tensors[0].name);
	p.tensors[0].name = NULL;
	ck_assert_uint_eq(node_plan_bytes(&p), base + 10 * sizeof(plan_xfer_t));
	plan_fini(&p);
}
END_TEST

START_TEST(get_put_release)
{
	node_t *n;
	plan_t p, q;
	node_plan_t *e, *f;
	uint64_t bytes;

	bytes = fake_plan(&p, "a", 4);
	n = cache_new(10 * bytes);
	ck_assert_ptr_null(node_plans_get(n, "a"));
	e = node_plans_put(n, "a", &p);
	ck_assert_ptr_nonnull(e);
	ck_assert_uint_eq(e->refs, 2);
	ck_assert_uint_eq(e->bytes, bytes);
	ck_assert_uint_eq(n->plan_cache_used, bytes);
	/* a second slice finds it; a third built the same plan meanwhile */
	ck_assert_ptr_eq(node_plans_get(n, "a"), e);
	ck_assert_uint_eq(e->refs, 3);
	fake_plan(&q, "a", 4);
	f = node_plans_put(n, "a", &q);
	ck_assert_ptr_eq(f, e);
	ck_assert_uint_eq(e->refs, 4);
	ck_assert_ptr_null(q.tensors);   /* freed: the cached one serves */
	ck_assert_uint_eq(n->plans.n, 1);
	ck_assert_uint_eq(n->plan_cache_used, bytes);
	for (int i = 0; i < 3; i++)
		node_plan_release(n, e);
	ck_assert_uint_eq(e->refs, 1);   /* the cache's */
	node_plan_release(n, NULL);      /* no plan, nothing to give back */
	cache_free(n);
}
END_TEST

START_TEST(lru_by_bytes)
{
	node_t *n;
	plan_t p;
	node_plan_t *in_use;
	uint64_t bytes;

	bytes = fake_plan(&p, "a", 4);
	plan_fini(&p);
	/* room for two plans of this size, not three */
	n = cache_new(3 * bytes - 1);
	put(n, "a", 4);
	put(n, "b", 4);
	ck_assert(cached(n, "a"));       /* a is now more recent than b */
	put(n, "c", 4);
	ck_assert(!cached(n, "b"));
	ck_assert(cached(n, "a"));
	ck_assert(cached(n, "c"));
	ck_assert_uint_eq(n->plans.n, 2);
	ck_assert_uint_eq(n->plan_cache_used, 2 * bytes);
	/* a larger plan evicts as many as it needs, least recent first */
	put(n, "d", 4);                  /* evicts a (c was looked at later) */
	ck_assert(!cached(n, "a"));
	ck_assert(cached(n, "c") && cached(n, "d"));
	/* e: at least two of the others, so both go */
	fake_plan(&p, "e", 9 + (bytes - 4 * sizeof(plan_xfer_t)) / sizeof(plan_xfer_t));
	ck_assert_uint_le(node_plan_bytes(&p), n->plan_cache_max);
	ck_assert_uint_ge(node_plan_bytes(&p), 2 * bytes);
	in_use = node_plans_get(n, "c");  /* c in use: evicted all the same */
	ck_assert_ptr_nonnull(in_use);
	node_plan_release(n, node_plans_put(n, "e", &p));
	ck_assert_uint_eq(n->plans.n, 1);
	ck_assert(cached(n, "e"));
	ck_assert(!cached(n, "c"));
	ck_assert_uint_eq(n->plan_cache_used, n->plans.v[0]->bytes);
	node_plan_release(n, in_use);
	cache_free(n);
}
END_TEST

START_TEST(evicted_in_use)
{
	node_t *n;
	plan_t p;
	node_plan_t *e;
	uint64_t bytes;

	bytes = fake_plan(&p, "a", 8);
	n = cache_new(bytes);
	e = node_plans_put(n, "a", &p);  /* a slice runs it */
	put(n, "b", 8);                  /* evicts a */
	ck_assert(!cached(n, "a"));
	ck_assert_uint_eq(e->refs, 1);
	ck_assert_str_eq(e->plan.tensors[0].name, "a");  /* still there (ASan) */
	ck_assert_uint_eq(n->plan_cache_used, bytes);
	node_plan_release(n, e);         /* freed now (ASan: no leak, no reuse) */
	cache_free(n);
}
END_TEST

START_TEST(too_large_or_none)
{
	node_t *n;
	plan_t p;
	uint64_t bytes;

	bytes = fake_plan(&p, "a", 8);
	n = cache_new(bytes - 1);
	put(n, "small", 0);
	ck_assert_ptr_null(node_plans_put(n, "a", &p));
	ck_assert_ptr_nonnull(p.tensors);    /* still the caller's */
	ck_assert(cached(n, "small"));       /* nothing evicted for it */
	plan_fini(&p);
	cache_free(n);
	/* plan_cache_bytes 0 keeps none */
	n = cache_new(0);
	fake_plan(&p, "a", 0);
	ck_assert_ptr_null(node_plans_put(n, "a", &p));
	plan_fini(&p);
	ck_assert_uint_eq(n->plans.n, 0);
	ck_assert_uint_eq(n->plan_cache_used, 0);
	cache_free(n);
}
END_TEST

/* The key: the same inputs, the same key; any input changed, another. */
START_TEST(plan_key)
{
	plan_layout_set_t s, d, d2;
	plan_topo_t t, t2;
	plan_opts_t o, o2;
	char k[SHA256_HEX_LEN], k2[SHA256_HEX_LEN];
	refit_err_t e;

	th_layouts(SRC, &s);
	th_layouts(DST, &d);
	th_layouts(DST2, &d2);
	th_topo("dgx-h100:16", &t);
	plan_opts_default(&o);
	node_plan_key(&s, &d, &t, &o, k);
	ck_assert_uint_eq(strlen(k), SHA256_HEX_LEN - 1);
	node_plan_key(&s, &d, &t, &o, k2);
	ck_assert_str_eq(k, k2);
	node_plan_key(&d, &s, &t, &o, k2);           /* the other way */
	ck_assert_str_ne(k, k2);
	node_plan_key(&s, &d2, &t, &o, k2);          /* another destination */
	ck_assert_str_ne(k, k2);
	o2 = o;
	o2.staging_bytes *= 2;
	node_plan_key(&s, &d, &t, &o2, k2);
	ck_assert_str_ne(k, k2);
	o2 = o;
	o2.chunk_bytes /= 2;
	node_plan_key(&s, &d, &t, &o2, k2);
	ck_assert_str_ne(k, k2);
	o2 = o;
	o2.mode = o.mode == PLAN_MODE_RESHARD ? PLAN_MODE_BROADCAST : PLAN_MODE_RESHARD;
	node_plan_key(&s, &d, &t, &o2, k2);
	ck_assert_str_ne(k, k2);
	t.nic_per_node = !t.nic_per_node;
	node_plan_key(&s, &d, &t, &o, k2);
	ck_assert_str_ne(k, k2);
	t.nic_per_node = !t.nic_per_node;
	/* the same ranks on other nodes, and the same ranks added in another
	 * order (node indices differ) */
	plan_topo_init(&t2);
	refit_err_clear(&e);
	for (int32_t r = 0; r < 16; r++)
		ck_assert_msg(plan_topo_add_rank(&t2, r, r < 8 ? "x0" : "x1", NULL, &e) == REFIT_OK,
			      "%s", e.msg);
	node_plan_key(&s, &d, &t2, &o, k2);
	ck_assert_str_ne(k, k2);
	plan_topo_fini(&t2);
	plan_topo_init(&t2);
	for (int32_t r = 15; r >= 0; r--)
		ck_assert(plan_topo_add_rank(&t2, r, t.nodes[t.rank_node[r]],
					     t.domains[t.rank_domain[r]], &e) == REFIT_OK);
	t2.nic_per_node = t.nic_per_node;
	node_plan_key(&s, &d, &t2, &o, k2);
	ck_assert_str_ne(k, k2);
	plan_topo_fini(&t2);
	plan_topo_fini(&t);
	plan_layout_set_fini(&s);
	plan_layout_set_fini(&d);
	plan_layout_set_fini(&d2);
}
END_TEST

/* On its own thread, the same plan as plan_build, and the same errors. */
START_TEST(build_on_thread)
{
	plan_layout_set_t s, d;
	plan_topo_t t;
	plan_opts_t o;
	plan_t a, b;
	refit_err_t e;

	th_layouts(SRC, &s);
	th_layouts(DST, &d);
	th_topo("dgx-h100:16", &t);
	plan_opts_default(&o);
	refit_err_clear(&e);
	ck_assert_msg(node_plan_build(&s, &d, &t, &o, &a, &e) == REFIT_OK, "%s", e.msg);
	ck_assert_msg(plan_build(&s, &d, &t, &o, &b, &e) == REFIT_OK, "%s", e.msg);
	ck_assert_str_eq(a.digest_hex, b.digest_hex);
	ck_assert_uint_gt(a.nxfers, 0);
	plan_fini(&a);
	plan_fini(&b);
	o.staging_bytes = o.chunk_bytes - 1;
	ck_assert_int_eq(node_plan_build(&s, &d, &t, &o, &a, &e), REFIT_ERR_INVALID_ARG);
	ck_assert_msg(strstr(e.msg, "staging") != NULL, "%s", e.msg);
	plan_topo_fini(&t);
	plan_layout_set_fini(&s);
	plan_layout_set_fini(&d);
}
END_TEST

Suite *
suite_node_plans(void)
{
	return th_suite("node_plans", th_tcase("node plans", 0, TH_TESTS(plan_bytes,
			get_put_release, lru_by_bytes, evicted_in_use, too_large_or_none,
			plan_key, build_on_thread)), NULL);
}
