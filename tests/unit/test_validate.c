/*
 * test_validate.c - the validator rejects broken plans, naming the fault.
 *
 * Each test takes a valid plan, breaks it in one way, re-lays it out with
 * plan_finalize (so messages stay consistent) and checks the message.
 */
#include <stdio.h>
#include <string.h>

#include "plan/internal.h"
#include "tests/unit/helpers.h"

typedef struct vx {
	plan_layout_set_t s, d;
	plan_topo_t t;
	plan_t p;
} vx_t;

static void
setup(vx_t *x, plan_mode_t mode)
{
	plan_opts_t o;

	th_layouts("{\"name\":\"w\",\"dtype\":\"fp32\",\"shape\":[8,4],\"mesh\":[0,1],"
		   "\"placements\":[\"Shard(0)\"]}", &x->s);
	th_layouts("{\"name\":\"w\",\"dtype\":\"fp32\",\"shape\":[8,4],"
		   "\"mesh\":[[8,9],[10,11]],\"placements\":[\"Replicate()\",\"Shard(1)\"]}",
		   &x->d);
	th_topo("dgx-h100:16", &x->t);
	plan_opts_default(&o);
	o.mode = mode;
	ck_assert_int_eq(plan_build(&x->s, &x->d, &x->t, &o, &x->p, NULL), REFIT_OK);
	ck_assert_int_eq(plan_validate(&x->p, &x->s, &x->d, &(plan_check_t){0}, NULL),
			 REFIT_OK);
}

static plan_xfer_t *
copy_of(const plan_xfer_t *v, size_t n)
{
	plan_xfer_t *c = xmalloc((n ? n : 1) * sizeof(*c));

	memcpy(c, v, n * sizeof(*c));
	return c;
}

/* Replace x->p by a plan of the given transfers; return the validator's text. */
static const char *
revalidate(vx_t *x, plan_xfer_t *raw, size_t n)
{
	static refit_err_t e;
	plan_t q;
	plan_check_t chk;

	memset(&q, 0, sizeof(q));
	plan_init_tensors(&q, &x->d, &x->p.opts);
	q.stages_per_round = x->p.stages_per_round;
	plan_box_t *boxes = xmalloc((x->p.nboxes ? x->p.nboxes : 1) * sizeof(*boxes));

	memcpy(boxes, x->p.boxes, x->p.nboxes * sizeof(*boxes));
	plan_finalize(&q, copy_of(raw, n), n, boxes, x->p.nboxes);
	refit_err_clear(&e);
	ck_assert_int_eq(plan_validate(&q, &x->s, &x->d, &chk, &e), REFIT_ERR_INTERNAL);
	plan_fini(&q);
	return e.msg;
}

static void
teardown(vx_t *x)
{
	plan_fini(&x->p);
	plan_topo_fini(&x->t);
	plan_layout_set_fini(&x->s);
	plan_layout_set_fini(&x->d);
}

static plan_xfer_t *
copy_xfers(const vx_t *x, size_t extra)
{
	plan_xfer_t *v = xmalloc((x->p.nxfers + extra) * sizeof(*v));

	memcpy(v, x->p.xfers, x->p.nxfers * sizeof(*v));
	return v;
}

START_TEST(dropped_transfer)
{
	vx_t x;
	plan_xfer_t *v;

	setup(&x, PLAN_MODE_RESHARD);
	v = copy_xfers(&x, 0);
	/* drop the last stage-1 forward */
	ck_assert_int_eq(v[x.p.nxfers - 1].stage, 1);
	ck_assert_ptr_nonnull(strstr(revalidate(&x, v, x.p.nxfers - 1), "never receives it"));
	free(v);
	teardown(&x);
}
END_TEST

START_TEST(duplicated_transfer)
{
	vx_t x;
	plan_xfer_t *v;

	setup(&x, PLAN_MODE_RESHARD);
	v = copy_xfers(&x, 1);
	v[x.p.nxfers] = v[0];
	v[x.p.nxfers].stage = 1;
	ck_assert_ptr_nonnull(strstr(revalidate(&x, v, x.p.nxfers + 1), "receives it twice"));
	free(v);
	teardown(&x);
}
END_TEST

START_TEST(sender_lacks_data)
{
	vx_t x;
	plan_xfer_t *v;
	const char *m;

	setup(&x, PLAN_MODE_RESHARD);
	v = copy_xfers(&x, 0);
	v[0].from = 5; /* holds nothing */
	m = revalidate(&x, v, x.p.nxfers);
	ck_assert_msg(strstr(m, "rank 5 -> rank") && strstr(m, "does not hold it"), "%s", m);
	free(v);
	teardown(&x);
}
END_TEST

START_TEST(forward_too_early)
{
	vx_t x;
	plan_xfer_t *v;
	size_t k = 0;

	setup(&x, PLAN_MODE_RESHARD);
	v = copy_xfers(&x, 0);
	while (v[k].stage != 1)
		k++;
	v[k].stage = 0; /* forwards what it has not received yet */
	ck_assert_ptr_nonnull(strstr(revalidate(&x, v, x.p.nxfers),
				     "does not hold it at the start of the stage"));
	free(v);
	teardown(&x);
}
END_TEST

START_TEST(out_of_bounds_box)
{
	vx_t x;
	plan_xfer_t *v;

	setup(&x, PLAN_MODE_RESHARD);
	v = copy_xfers(&x, 0);
	x.p.boxes[v[0].box].size[1] = 9;
	ck_assert_ptr_nonnull(strstr(revalidate(&x, v, x.p.nxfers),
				     "box is empty or out of bounds"));
	free(v);
	teardown(&x);
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
	teardown(&x);
}
END_TEST

START_TEST(message_over_chunk)
{
	vx_t x;
	refit_err_t e;
	plan_check_t chk;

	setup(&x, PLAN_MODE_RESHARD);
	x.p.opts.chunk_bytes = 8;
	refit_err_clear(&e);
	ck_assert_int_eq(plan_validate(&x.p, &x.s, &x.d, &chk, &e), REFIT_ERR_INTERNAL);
	ck_assert_ptr_nonnull(strstr(e.msg, "it counts"));
	teardown(&x);
}
END_TEST

START_TEST(staging_exceeded)
{
	vx_t x;
	refit_err_t e;
	plan_check_t chk;

	setup(&x, PLAN_MODE_BROADCAST);
	ck_assert_int_eq(plan_validate(&x.p, &x.s, &x.d, &chk, NULL), REFIT_OK);
	ck_assert_uint_gt(chk.max_staging, 0);
	x.p.opts.staging_bytes = chk.max_staging - 1;
	refit_err_clear(&e);
	ck_assert_int_eq(plan_validate(&x.p, &x.s, &x.d, &chk, &e), REFIT_ERR_INTERNAL);
	ck_assert_ptr_nonnull(strstr(e.msg, "relayed bytes in round 0, over the staging bound"));
	teardown(&x);
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
	teardown(&x);
}
END_TEST

/*
 * A plan with hierarchical relays: 2 MiB into a DP2 x TP2 group whose node
 * has four idle GPUs, from two holders whose node has six.  Returns the
 * index of a transfer sent by a rank that neither holds nor needs the
 * data (an idle rank passing a part on).
 */
static size_t
setup_relay(vx_t *x)
{
	plan_check_t chk;
	plan_opts_t o;
	size_t k = 0;

	th_layouts("{\"name\":\"w\",\"dtype\":\"fp32\",\"shape\":[1024,512],\"mesh\":[0,1],"
		   "\"placements\":[\"Shard(1)\"]}", &x->s);
	th_layouts("{\"name\":\"w\",\"dtype\":\"fp32\",\"shape\":[1024,512],"
		   "\"mesh\":[[8,9],[10,11]],\"placements\":[\"Replicate()\",\"Shard(0)\"]}",
		   &x->d);
	th_topo("dgx-h100:16", &x->t);
	plan_opts_default(&o);
	ck_assert_int_eq(plan_build(&x->s, &x->d, &x->t, &o, &x->p, NULL), REFIT_OK);
	ck_assert_int_eq(plan_validate(&x->p, &x->s, &x->d, &chk, NULL), REFIT_OK);
	ck_assert_uint_gt(chk.relay_bytes, 0);
	while (k < x->p.nxfers && (x->p.xfers[k].from < 2 ||
				   (x->p.xfers[k].from >= 8 && x->p.xfers[k].from < 12)))
		k++;
	ck_assert_uint_lt(k, x->p.nxfers);
	ck_assert_uint_gt(x->p.xfers[k].stage, 0);
	return k;
}

START_TEST(relay_sends_before_it_holds)
{
	vx_t x;
	size_t k = setup_relay(&x);
	plan_xfer_t *v = copy_xfers(&x, 0);
	const char *m;

	v[k].stage--; /* passes the part on in the stage it arrives */
	m = revalidate(&x, v, x.p.nxfers);
	ck_assert_msg(strstr(m, "does not hold it at the start of the stage"), "%s", m);
	free(v);
	teardown(&x);
}
END_TEST

START_TEST(relay_data_is_staging)
{
	vx_t x;
	size_t k = setup_relay(&x);
	plan_xfer_t *v = copy_xfers(&x, 0);
	const char *m;

	/* relay data is freed when its round ends: a later round cannot use it */
	v[k].stage += x.p.stages_per_round;
	m = revalidate(&x, v, x.p.nxfers);
	ck_assert_msg(strstr(m, "does not hold it at the start of the stage"), "%s", m);
	free(v);
	/* and it counts against the staging bound */
	x.p.opts.staging_bytes = x.p.opts.chunk_bytes / 64;
	v = copy_xfers(&x, 0);
	m = revalidate(&x, v, x.p.nxfers);
	ck_assert_msg(strstr(m, "over the staging bound"), "%s", m);
	free(v);
	teardown(&x);
}
END_TEST

Suite *
suite_validate(void)
{
	Suite *s = suite_create("validate");
	TCase *tc = tcase_create("mutations");

	tcase_add_test(tc, dropped_transfer);
	tcase_add_test(tc, duplicated_transfer);
	tcase_add_test(tc, sender_lacks_data);
	tcase_add_test(tc, forward_too_early);
	tcase_add_test(tc, out_of_bounds_box);
	tcase_add_test(tc, index_out_of_range);
	tcase_add_test(tc, message_over_chunk);
	tcase_add_test(tc, staging_exceeded);
	tcase_add_test(tc, wrong_tensor_table);
	tcase_add_test(tc, relay_sends_before_it_holds);
	tcase_add_test(tc, relay_data_is_staging);
	suite_add_tcase(s, tc);
	return s;
}
