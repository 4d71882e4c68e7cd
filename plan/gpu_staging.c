/*
 * gpu_staging.c - a plan's GPU staging per rank (see gpu_staging.h).  The
 * bucket rule is slice.c's bucket_all, restated: keep the two in step.
 */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "plan/gpu_staging.h"

#define ARENA_ALIGN 256u

static int32_t
max_rank(const plan_t *p)
{
	int32_t m = 0;

	for (size_t i = 0; i < p->nxfers; i++) {
		m = p->xfers[i].from > m ? p->xfers[i].from : m;
		m = p->xfers[i].to > m ? p->xfers[i].to : m;
	}
	return m;
}

/* Rank r's message buffer of len in bucket k: a later bucket closes its
 * current one (a rank's buckets only grow within a stage). */
static void
add(plan_gpu_staging_t *out, uint64_t *acc_k, uint64_t *acc_v, const bool *want, int32_t r,
    uint64_t k, uint64_t len)
{
	if (acc_k[r] != k) {
		out->groups += acc_v[r] != 0;
		acc_k[r] = k;
		acc_v[r] = 0;
	}
	acc_v[r] += len;
	if ((want == NULL || want[r]) && acc_v[r] > out->peak) {
		out->peak = acc_v[r];
		out->rank = r;
	}
}

static void
staging(const plan_t *p, uint64_t trail, const bool *want, plan_gpu_staging_t *out)
{
	uint64_t W = p->opts.staging_bytes;
	size_t nr = (size_t)max_rank(p) + 1;
	uint64_t *cur = xcalloc(nr, sizeof(*cur)), *fill = xcalloc(nr, sizeof(*fill));
	uint64_t *acc_k = xcalloc(nr, sizeof(*acc_k)), *acc_v = xcalloc(nr, sizeof(*acc_v));
	uint32_t stage = UINT32_MAX;
	plan_msgs_t it;
	plan_msg_t m;

	memset(out, 0, sizeof(*out));
	plan_msgs_init(&it, p, 0, p->nxfers);
	while (plan_msgs_next(&it, &m)) {
		uint64_t k, len = (m.bytes + trail + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;

		if (m.stage != stage) {   /* buckets restart per stage */
			for (size_t r = 0; r < nr; r++) {
				out->groups += acc_v[r] != 0;
				acc_v[r] = 0;
				acc_k[r] = 0;
			}
			memset(cur, 0, nr * sizeof(*cur));
			memset(fill, 0, nr * sizeof(*fill));
			stage = m.stage;
		}
		k = cur[m.from] > cur[m.to] ? cur[m.from] : cur[m.to];
		if (cur[m.from] < k)
			cur[m.from] = k, fill[m.from] = 0;
		if (cur[m.to] < k)
			cur[m.to] = k, fill[m.to] = 0;
		if ((fill[m.from] || fill[m.to]) &&
		    (fill[m.from] + m.bytes > W || fill[m.to] + m.bytes > W)) {
			k++;
			cur[m.from] = cur[m.to] = k;
			fill[m.from] = fill[m.to] = 0;
		}
		fill[m.from] += m.bytes;
		if (m.to != m.from)
			fill[m.to] += m.bytes;
		add(out, acc_k, acc_v, want, m.from, k, len);
		if (m.to != m.from)
			add(out, acc_k, acc_v, want, m.to, k, len);
	}
	for (size_t r = 0; r < nr; r++)
		out->groups += acc_v[r] != 0;
	plan_msgs_fini(&it);
	free(cur);
	free(fill);
	free(acc_k);
	free(acc_v);
}

void
plan_gpu_staging(const plan_t *p, uint64_t trail, plan_gpu_staging_t *out)
{
	staging(p, trail, NULL, out);
}

void
plan_gpu_staging_ranks(const plan_t *p, uint64_t trail, const int32_t *ranks, size_t n,
		       plan_gpu_staging_t *out)
{
	size_t nr = (size_t)max_rank(p) + 1;
	bool *want = xcalloc(nr, sizeof(*want));

	for (size_t i = 0; i < n; i++)
		if (ranks[i] >= 0 && (size_t)ranks[i] < nr)
			want[ranks[i]] = true;
	staging(p, trail, want, out);
	free(want);
}
