/*
 * test_validate.c - the validator rejects broken plans, naming the fault.
 *
 * Each test takes a valid plan, breaks it in one way, re-lays it out with
 * plan_finalize (so messages stay consistent) and checks the message.
 */
#include <stdio.h>
#include <string.h>

#include "plan/gpu_staging.h"
#include "plan/internal.h"
#include "tests/unit/helpers.h"

typedef th_plan_t vx_t;

#define W(shape, mesh, pl) \
	"{\"name\":\"w\",\"dtype\":\"fp32\",\"shape\":" shape ",\"mesh\":" mesh \
	",\"placements\":" pl "}"

/* A valid plan of 128 bytes into a DP2 x TP2 group; 0, no relay index. */
static size_t
setup(vx_t *x, plan_mode_t mode)
{
	plan_opts_t o;

	plan_opts_default(&o);
	o.mode = mode;
	th_plan_build(x, W("[8,4]", "[0,1]", "[\"Shard(0)\"]"),
		      W("[8,4]", "[[8,9],[10,11]]", "[\"Replicate()\",\"Shard(1)\"]"),
		      "dgx-h100:16", &o);
	return 0;
}

/*
 * A plan with hierarchical relays: 2 MiB into a DP2 x TP2 group whose node
 * has four idle GPUs, from two holders whose node has six.  Returns the
 * index of a transfer sent by a rank that neither holds nor needs the
 * data (an idle rank passing a part on).
 */
static size_t
setup_relay(vx_t *x, plan_mode_t mode)
{
	size_t k = 0;

	ck_assert_int_eq(mode, PLAN_MODE_RESHARD);
	th_plan_build(x, W("[1024,512]", "[0,1]", "[\"Shard(1)\"]"),
		      W("[1024,512]", "[[8,9],[10,11]]", "[\"Replicate()\",\"Shard(0)\"]"),
		      "dgx-h100:16", NULL);
	ck_assert_uint_gt(x->chk.relay_bytes, 0);
	while (k < x->p.nxfers && (x->p.xfers[k].from < 2 ||
				   (x->p.xfers[k].from >= 8 && x->p.xfers[k].from < 12)))
		k++;
	ck_assert_uint_lt(k, x->p.nxfers);
	ck_assert_uint_gt(x->p.xfers[k].stage, 0);
	return k;
}

/* Replace x->p by a plan of the given transfers; return the validator's text. */
static const char *
revalidate(vx_t *x, const plan_xfer_t *raw, size_t n)
{
	static refit_err_t e;
	plan_xfer_t *c = xmalloc((n ? n : 1) * sizeof(*c));
	plan_t q;
	plan_check_t chk;

	memcpy(c, raw, n * sizeof(*c));
	memset(&q, 0, sizeof(q));
	plan_init_tensors(&q, &x->d, &x->p.opts);
	q.stages_per_round = x->p.stages_per_round;
	plan_box_t *boxes = xmalloc((x->p.nboxes ? x->p.nboxes : 1) * sizeof(*boxes));

	memcpy(boxes, x->p.boxes, x->p.nboxes * sizeof(*boxes));
	plan_finalize(&q, c, n, boxes, x->p.nboxes);
	refit_err_clear(&e);
	ck_assert_int_eq(plan_validate(&q, &x->s, &x->d, &chk, &e), REFIT_ERR_INTERNAL);
	plan_fini(&q);
	return e.msg;
}

/* Validate x->p itself (its messages as built); return the validator's text. */
static const char *
validate_as_is(vx_t *x)
{
	static refit_err_t e;
	plan_check_t chk;

	refit_err_clear(&e);
	ck_assert_int_eq(plan_validate(&x->p, &x->s, &x->d, &chk, &e), REFIT_ERR_INTERNAL);
	return e.msg;
}

/*
 * The mutations.  Each gets the plan (whose options it may change), a copy
 * v of its n transfers with room for one more, and the relay index k of
 * setup_relay; it returns how many transfers the broken plan has.
 */
typedef size_t mutate_fn(vx_t *x, plan_xfer_t *v, size_t n, size_t k);

/* Drop the last stage-1 forward. */
static size_t
drop_last_forward(vx_t *x, plan_xfer_t *v, size_t n, size_t k)
{
	(void)x, (void)k;
	ck_assert_int_eq(v[n - 1].stage, 1);
	return n - 1;
}

static size_t
send_first_twice(vx_t *x, plan_xfer_t *v, size_t n, size_t k)
{
	(void)x, (void)k;
	v[n] = v[0];
	v[n].stage = 1;
	return n + 1;
}

static size_t
send_from_rank5(vx_t *x, plan_xfer_t *v, size_t n, size_t k)
{
	(void)x, (void)k;
	v[0].from = 5; /* holds nothing */
	return n;
}

/* Forward in stage 0 what arrives in stage 0. */
static size_t
forward_too_early(vx_t *x, plan_xfer_t *v, size_t n, size_t k)
{
	(void)x;
	for (k = 0; v[k].stage != 1; k++)
		ck_assert_uint_lt(k + 1, n);
	v[k].stage = 0;
	return n;
}

static size_t
box_out_of_bounds(vx_t *x, plan_xfer_t *v, size_t n, size_t k)
{
	(void)k;
	x->p.boxes[v[0].box].size[1] = 9;
	return n;
}

static size_t
chunk_of_8(vx_t *x, plan_xfer_t *v, size_t n, size_t k)
{
	(void)v, (void)k;
	x->p.opts.chunk_bytes = 8;
	return n;
}

/* Staging one byte under what the broadcast plan relays. */
static size_t
staging_under_need(vx_t *x, plan_xfer_t *v, size_t n, size_t k)
{
	(void)v, (void)k;
	ck_assert_uint_gt(x->chk.max_staging, 0);
	x->p.opts.staging_bytes = x->chk.max_staging - 1;
	return n;
}

/* The relay passes the part on in the stage it arrives. */
static size_t
relay_same_stage(vx_t *x, plan_xfer_t *v, size_t n, size_t k)
{
	(void)x;
	v[k].stage--;
	return n;
}

/* Relay data is freed when its round ends: a later round cannot use it. */
static size_t
relay_next_round(vx_t *x, plan_xfer_t *v, size_t n, size_t k)
{
	v[k].stage += x->p.stages_per_round;
	return n;
}

/* Relay data counts against the staging bound. */
static size_t
relay_tiny_staging(vx_t *x, plan_xfer_t *v, size_t n, size_t k)
{
	(void)v, (void)k;
	x->p.opts.staging_bytes = x->p.opts.chunk_bytes / 64;
	return n;
}

typedef struct mutation {
	const char *name;
	size_t (*setup)(vx_t *x, plan_mode_t mode);
	plan_mode_t mode;
	mutate_fn *mutate;
	bool relayout;           /* re-lay the messages out (else validate as is) */
	const char *want[2];     /* in the message; the second may be NULL */
} mutation_t;

static const mutation_t mutations[] = {
	{"dropped_transfer", setup, PLAN_MODE_RESHARD, drop_last_forward, true,
	 {"never receives it"}},
	{"duplicated_transfer", setup, PLAN_MODE_RESHARD, send_first_twice, true,
	 {"receives it twice"}},
	{"sender_lacks_data", setup, PLAN_MODE_RESHARD, send_from_rank5, true,
	 {"rank 5 -> rank", "does not hold it"}},
	{"forward_too_early", setup, PLAN_MODE_RESHARD, forward_too_early, true,
	 {"does not hold it at the start of the stage"}},
	{"out_of_bounds_box", setup, PLAN_MODE_RESHARD, box_out_of_bounds, true,
	 {"box is empty or out of bounds"}},
	{"message_over_chunk", setup, PLAN_MODE_RESHARD, chunk_of_8, false, {"it counts"}},
	{"staging_exceeded", setup, PLAN_MODE_BROADCAST, staging_under_need, false,
	 {"relayed bytes in round 0, over the staging bound"}},
	{"relay_sends_before_it_holds", setup_relay, PLAN_MODE_RESHARD, relay_same_stage, true,
	 {"does not hold it at the start of the stage"}},
	{"relay_data_is_staging", setup_relay, PLAN_MODE_RESHARD, relay_next_round, true,
	 {"does not hold it at the start of the stage"}},
	{"relay_counts_in_staging", setup_relay, PLAN_MODE_RESHARD, relay_tiny_staging, true,
	 {"over the staging bound"}},
};

#define NMUTATIONS ((int)(sizeof(mutations) / sizeof(mutations[0])))

START_TEST(mutated_plans)
{
	const mutation_t *u = &mutations[_i];
	vx_t x;
	size_t k = u->setup(&x, u->mode);
	plan_xfer_t *v = xmalloc((x.p.nxfers + 1) * sizeof(*v));
	size_t n;
	const char *m;

	memcpy(v, x.p.xfers, x.p.nxfers * sizeof(*v));
	n = u->mutate(&x, v, x.p.nxfers, k);
	m = u->relayout ? revalidate(&x, v, n) : validate_as_is(&x);
	for (int w = 0; w < 2 && u->want[w] != NULL; w++)
		ck_assert_msg(strstr(m, u->want[w]) != NULL, "%s: \"%s\" lacks \"%s\"", u->name, m,
			      u->want[w]);
	free(v);
	th_plan_fini(&x);
}
END_TEST

START_TEST(wrong_tensor_table)
{
	vx_t x;
	refit_err_t e;
	plan_layout_set_t other;

	setup(&x, PLAN_MODE_RESHARD);
	th_layouts("{\"tensors\":[]}", &other);
	refit_err_clear(&e);
	ck_assert_int_ne(plan_validate(&x.p, &other, &other, &(plan_check_t){0}, &e), REFIT_OK);
	ck_assert_str_eq(e.msg, "plan has 1 tensors, the destination 0");
	plan_layout_set_fini(&other);
	th_plan_fini(&x);
}
END_TEST

/* A transfer naming a box or tensor the plan lacks is refused before
 * anything reads through the index. */
START_TEST(index_out_of_range)
{
	vx_t x;
	refit_err_t e;
	plan_check_t chk;
	uint32_t box;

	setup(&x, PLAN_MODE_RESHARD);
	box = x.p.xfers[0].box;
	x.p.xfers[0].box = (uint32_t)x.p.nboxes;
	refit_err_clear(&e);
	ck_assert_int_eq(plan_validate(&x.p, &x.s, &x.d, &chk, &e), REFIT_ERR_INTERNAL);
	ck_assert_msg(strstr(e.msg, "transfer 0 names tensor 0 and box") != NULL, "%s", e.msg);
	x.p.xfers[0].box = box;
	x.p.xfers[0].tensor = x.p.ntensors;
	refit_err_clear(&e);
	ck_assert_int_eq(plan_validate(&x.p, &x.s, &x.d, &chk, &e), REFIT_ERR_INTERNAL);
	ck_assert_msg(strstr(e.msg, "names tensor 1 and box") != NULL, "%s", e.msg);
	x.p.xfers[0].tensor = 0;
	th_plan_fini(&x);
}
END_TEST

/* A node's own ranks' GPU staging (the whole-plan check at open,
 * docs/gpu.md): rank 0 sends every message, each receiver holds half. */
START_TEST(gpu_staging_of_ranks)
{
	vx_t x = {0};
	plan_opts_t o;
	plan_gpu_staging_t all, r0, r1, none;
	int32_t zero = 0, one = 1;

	plan_opts_default(&o);
	o.chunk_bytes = 64 << 10;
	th_plan_build(&x, W("[1024,64]", "[0]", "[\"Replicate()\"]"),
		      W("[1024,64]", "[1,2]", "[\"Shard(0)\"]"), "dgx-h100:16", &o);
	plan_gpu_staging(&x.p, 4, &all);
	plan_gpu_staging_ranks(&x.p, 4, NULL, &zero, 1, &r0);
	plan_gpu_staging_ranks(&x.p, 4, NULL, &one, 1, &r1);
	plan_gpu_staging_ranks(&x.p, 4, NULL, NULL, 0, &none);
	ck_assert_uint_ge(all.peak, 256u << 10);   /* 256 KiB of fp32 in all */
	ck_assert(r0.peak == all.peak && r0.rank == 0);
	ck_assert(r1.rank == 1 && r1.peak > 0 && r1.peak * 2 <= all.peak + 512);
	ck_assert(none.peak == 0 && none.groups == all.groups);
	th_plan_fini(&x);
}
END_TEST

Suite *
suite_validate(void)
{
	TCase *tc = th_tcase("mutations", 0, TH_TESTS(wrong_tensor_table, index_out_of_range,
						       gpu_staging_of_ranks));

	tcase_add_loop_test(tc, mutated_plans, 0, NMUTATIONS);
	return th_suite("validate", tc, NULL);
}
