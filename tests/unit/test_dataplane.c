/*
 * test_dataplane.c - strided box copies, and random plans executed through
 * the executor core with every destination byte checked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "common/alloc.h"
#include "daemon/node/slice.h"
#include "dataplane/exec.h"
#include "tests/unit/gen.h"
#include "tests/unit/helpers.h"
#include "tests/unit/hostmem.h"

/* The byte k of the element at global linear index g of tensor t. */
static uint8_t
pattern(uint32_t t, int64_t g, uint32_t k)
{
	uint64_t h = (uint64_t)g * 0x9E3779B97F4A7C15ull + t * 0xBF58476D1CE4E5B9ull;

	h ^= h >> 31;
	return (uint8_t)(h >> (8 * (k % 8)));
}

START_TEST(copy_box_strided)
{
	unsigned seed = 99;

	for (int iter = 0; iter < 3000; iter++) {
		int nd = 1 + gen_rnd(&seed, 4);
		uint32_t e = 1u << gen_rnd(&seed, 4);
		int64_t shape[4], pad[4], g[4];
		plan_box_t box, full;
		plan_shard_t ss, ds;
		dp_view_t sv, dv;
		uint8_t *a, *b;
		int64_t n = 1;

		for (int d = 0; d < nd; d++) {
			shape[d] = 1 + gen_rnd(&seed, 6);
			pad[d] = gen_rnd(&seed, 3); /* non-contiguous source strides */
			box.off[d] = gen_rnd(&seed, (int)shape[d]);
			box.size[d] = 1 + gen_rnd(&seed, (int)(shape[d] - box.off[d]));
			n *= shape[d] + pad[d];
		}
		plan_box_full(&full, shape, nd);
		memset(&ss, 0, sizeof(ss));
		ss.box = full;
		ds = ss;
		a = xcalloc((size_t)n, e);
		b = xcalloc((size_t)n, e);
		memset(&sv, 0, sizeof(sv));
		sv.base = a;
		sv.ndim = nd;
		sv.elem = e;
		for (int d = nd - 1, s = 1; d >= 0; d--) {
			sv.shape[d] = shape[d];
			sv.stride[d] = s;
			s *= (int)(shape[d] + pad[d]);
		}
		for (int64_t i = 0; i < n * e; i++)
			a[i] = (uint8_t)(i * 7 + 1);
		dp_view_contiguous(&dv, b, nd, shape, e);
		dp_copy_box(&sv, &ss, &dv, &ds, &box);
		/* every element of the box arrived; everything else stayed 0 */
		int64_t tot = plan_box_volume(&full, nd);
		for (int64_t k = 0; k < tot; k++) {
			int64_t rem = k, so = 0, inbox = 1;

			for (int d = nd - 1; d >= 0; d--) {
				g[d] = rem % shape[d];
				rem /= shape[d];
				so += g[d] * sv.stride[d];
				inbox &= g[d] >= box.off[d] && g[d] < box.off[d] + box.size[d];
			}
			for (uint32_t j = 0; j < e; j++)
				ck_assert_uint_eq(b[k * e + j], inbox ? a[so * e + j] : 0);
		}
		free(a);
		free(b);
	}
}
END_TEST

/*
 * Element k (row-major) of shard s: its global linear index *g and its
 * element offset *lo inside view v.
 */
static void
elem_at(const plan_layout_t *l, const plan_shard_t *s, const dp_view_t *v, int64_t k,
	int64_t *g, int64_t *lo)
{
	int64_t gi[PLAN_MAX_DIMS];

	*g = *lo = 0;
	for (int d = l->ndim - 1; d >= 0; d--) {
		gi[d] = s->box.off[d] + k % s->box.size[d];
		k /= s->box.size[d];
	}
	for (int d = 0; d < l->ndim; d++) {
		*g = *g * l->shape[d] + gi[d];
		*lo += (s->local_off[d] + gi[d] - s->box.off[d]) * v->stride[d];
	}
}

/* Host memory for every (rank, tensor, side, piece), made on demand. */
typedef struct mem {
	const plan_layout_set_t *src, *dst;
	size_t *map;
	th_bufs_t bufs;
} mem_t;

static refit_status_t
mem_view(void *ctx, int32_t rank, uint32_t t, bool dst, int32_t piece, dp_view_t *out,
	 refit_err_t *err)
{
	mem_t *m = ctx;
	const plan_layout_t *l = dst ? &m->dst->v[t] : &m->src->v[m->map[t]];
	const dp_view_t *had = th_bufs_find(&m->bufs, rank, t, dst, piece);
	dp_view_t *v;

	if (had != NULL) {
		*out = *had;
		return REFIT_OK;
	}
	CHECK(th_bufs_make(&m->bufs, l, rank, t, dst, piece, &v, err));
	if (!dst) {
		/* fill the rank's training memory with the pattern */
		for (size_t i = 0; i < l->nshards; i++) {
			const plan_shard_t *s = &l->shards[i];
			int64_t n = plan_box_volume(&s->box, l->ndim);

			if (s->rank != rank || s->piece != piece)
				continue;
			for (int64_t k = 0; k < n; k++) {
				int64_t g, lo;

				elem_at(l, s, v, k, &g, &lo);
				for (uint32_t j = 0; j < v->elem; j++)
					v->base[lo * v->elem + j] = pattern(t, g, j);
			}
		}
	}
	*out = *v;
	return REFIT_OK;
}

/* Every element of every destination shard holds the pattern. */
static int64_t
count_bad(mem_t *m)
{
	int64_t bad = 0;

	for (uint32_t t = 0; t < m->dst->n; t++) {
		const plan_layout_t *l = &m->dst->v[t];

		for (size_t i = 0; i < l->nshards; i++) {
			const plan_shard_t *s = &l->shards[i];
			int64_t n = plan_box_volume(&s->box, l->ndim);
			dp_view_t v;

			if (plan_box_is_empty(&s->box, l->ndim))
				continue;
			ck_assert_int_eq(mem_view(m, s->rank, t, true, s->piece, &v, NULL), REFIT_OK);
			for (int64_t k = 0; k < n; k++) {
				int64_t g, lo;

				elem_at(l, s, &v, k, &g, &lo);
				for (uint32_t j = 0; j < v.elem; j++)
					bad += v.base[lo * v.elem + j] != pattern(t, g, j);
			}
		}
	}
	return bad;
}

static void
mem_fini(mem_t *m)
{
	th_bufs_free(&m->bufs);
	free(m->map);
}

/* Execute p in memory from src to dst (with verify): every destination
 * element holds the pattern and every message of p was sent; what names
 * the case in a failure. */
static void
exec_byte_exact(const plan_t *p, const plan_layout_set_t *src, const plan_layout_set_t *dst,
		bool verify, const char *what)
{
	mem_t m = {src, dst, NULL, {0}};
	dp_mem_ops_t ops = {mem_view, &m, NULL};
	dp_exec_opts_t eo = {.verify = verify, .corrupt_msg = -1};
	dp_exec_stats_t st;
	dp_exec_t *x;
	refit_err_t e;

	refit_err_clear(&e);
	ck_assert_int_eq(plan_match(src, dst, &m.map, NULL), REFIT_OK);
	ck_assert_int_eq(dp_exec_new(p, src, dst, &ops, &eo, &x, &e), REFIT_OK);
	ck_assert_msg(dp_exec_local(x, &st, &e) == REFIT_OK, "%s: %s", what, e.msg);
	ck_assert_int_eq(count_bad(&m), 0);
	ck_assert_uint_eq(st.msgs, p->nmsgs);
	dp_exec_free(x);
	mem_fini(&m);
}

START_TEST(random_plans_byte_exact)
{
	unsigned seed = 0xda7a0000u + (unsigned)_i;

	for (int iter = 0; iter < 150; iter++) {
		plan_layout_set_t src, dst;
		plan_topo_t topo;
		int nranks;

		gen_case(&seed, &src, &dst, &topo, &nranks);
		for (int mode = 0; mode < 2; mode++) {
			bool verify = gen_rnd(&seed, 2);
			plan_opts_t o;
			plan_t p;
			refit_err_t e;

			plan_opts_default(&o);
			o.mode = mode ? PLAN_MODE_BROADCAST : PLAN_MODE_RESHARD;
			o.chunk_bytes = (uint64_t)64 << gen_rnd(&seed, 4);
			o.staging_bytes = o.chunk_bytes << gen_rnd(&seed, 3);
			refit_err_clear(&e);
			ck_assert_msg(plan_build(&src, &dst, &topo, &o, &p, &e) == REFIT_OK, "%s",
				      e.msg);
			exec_byte_exact(&p, &src, &dst, verify, plan_mode_name(o.mode));
			plan_fini(&p);
		}
		plan_layout_set_fini(&src);
		plan_layout_set_fini(&dst);
		plan_topo_fini(&topo);
	}
}
END_TEST

/*
 * in's ranks plus 1 to 3 idle ranks in every domain (holding and needing
 * nothing; on a node of their own or on the domain's first node), as the
 * leftover GPUs of a rack.
 */
static void
add_idle(unsigned *seed, const plan_topo_t *in, plan_topo_t *out)
{
	int32_t next = in->nslots;

	plan_topo_init(out);
	out->nic_per_node = in->nic_per_node;
	for (int32_t r = 0; r < in->nslots; r++)
		if (in->rank_node[r] >= 0)
			ck_assert_int_eq(plan_topo_add_rank(out, r, in->nodes[in->rank_node[r]],
							    in->domains[in->rank_domain[r]], NULL),
					 REFIT_OK);
	for (int32_t d = 0; d < in->ndomains; d++) {
		int k = 1 + gen_rnd(seed, 3);

		for (int i = 0; i < k; i++) {
			char node[32];
			int32_t first = 0;

			while (in->rank_domain[first] != d)
				first++;
			if (gen_rnd(seed, 2))
				snprintf(node, sizeof(node), "idle%d", next);
			else
				snprintf(node, sizeof(node), "%s", in->nodes[in->rank_node[first]]);
			ck_assert_int_eq(plan_topo_add_rank(out, next++, node, in->domains[d], NULL),
					 REFIT_OK);
		}
	}
}

/*
 * Hierarchical receive and send: random layouts over domains with idle
 * NICs; small chunks (so parts are worth an extra hop) and small staging
 * (so relays need several rounds).  Every plan validates and executes
 * byte-exactly; some must relay through ranks that need nothing.
 */
START_TEST(idle_nics_byte_exact)
{
	unsigned seed = 0x1d1e0000u;
	int relayed = 0, rounds = 0;

	for (int iter = 0; iter < 400; iter++) {
		plan_layout_set_t src, dst;
		plan_topo_t gt, topo;
		plan_opts_t o;
		plan_t p;
		plan_check_t chk;
		bool verify = gen_rnd(&seed, 2);
		refit_err_t e;
		int nranks;

		gen_case(&seed, &src, &dst, &gt, &nranks);
		add_idle(&seed, &gt, &topo);
		plan_opts_default(&o);
		o.chunk_bytes = (uint64_t)64 << gen_rnd(&seed, 3);
		o.staging_bytes = o.chunk_bytes << (gen_rnd(&seed, 4) == 0);
		refit_err_clear(&e);
		ck_assert_msg(plan_build(&src, &dst, &topo, &o, &p, &e) == REFIT_OK, "%s", e.msg);
		ck_assert_msg(plan_validate(&p, &src, &dst, &chk, &e) == REFIT_OK, "%s", e.msg);
		ck_assert_uint_le(chk.max_staging, o.staging_bytes);
		relayed += chk.relay_bytes > 0;
		rounds += p.nstages > p.stages_per_round;
		exec_byte_exact(&p, &src, &dst, verify, "idle nics");
		plan_fini(&p);
		plan_layout_set_fini(&src);
		plan_layout_set_fini(&dst);
		plan_topo_fini(&gt);
		plan_topo_fini(&topo);
	}
	/* the random cases do exercise the new paths */
	ck_assert_int_ge(relayed, 40);
	ck_assert_int_ge(rounds, 1);
}
END_TEST

/*
 * Relay staging from a pool: random broadcast plans with several staging
 * rounds, each run twice through one pool (two refits of an epoch).  Both
 * runs are byte-exact; the second makes no buffer (every round's staging
 * reuses the first's); nothing stays handed out; the pool keeps its bound.
 */
START_TEST(pool_staging_reused)
{
	unsigned seed = 0x9001u;
	int staged = 0;

	for (int iter = 0; iter < 60; iter++) {
		plan_layout_set_t src, dst;
		plan_topo_t topo;
		plan_opts_t o;
		plan_t p;
		int nranks;
		dp_pool_t *pl;
		dp_pool_stats_t st;
		uint64_t made = 0;

		gen_case(&seed, &src, &dst, &topo, &nranks);
		plan_opts_default(&o);
		o.mode = PLAN_MODE_BROADCAST;
		o.chunk_bytes = (uint64_t)64 << gen_rnd(&seed, 3);
		o.staging_bytes = o.chunk_bytes << gen_rnd(&seed, 2);
		ck_assert_int_eq(plan_build(&src, &dst, &topo, &o, &p, NULL), REFIT_OK);
		pl = dp_pool_new((uint64_t)256 << 20, 0, 0); /* every part pooled */
		dp_pool_epoch(pl, 1, 0);
		for (int run = 0; run < 2; run++) {
			mem_t m = {&src, &dst, NULL, {0}};
			dp_mem_ops_t ops = {mem_view, &m, NULL};
			dp_exec_opts_t eo = {.verify = run, .corrupt_msg = -1, .pool = pl};
			dp_exec_stats_t es;
			dp_exec_t *x;
			refit_err_t e;

			refit_err_clear(&e);
			ck_assert_int_eq(plan_match(&src, &dst, &m.map, NULL), REFIT_OK);
			ck_assert_int_eq(dp_exec_new(&p, &src, &dst, &ops, &eo, &x, &e), REFIT_OK);
			ck_assert_msg(dp_exec_local(x, &es, &e) == REFIT_OK, "%s", e.msg);
			ck_assert_int_eq(count_bad(&m), 0);
			dp_exec_free(x);
			mem_fini(&m);
			dp_pool_stats(pl, &st);
			ck_assert_uint_eq(st.busy, 0);
			ck_assert_uint_le(st.held, st.cap);
			if (run == 0)
				made = st.made;
			else
				ck_assert_uint_eq(st.made, made);
			staged += run == 0 && es.staged_bytes_max > 0;
			ck_assert_uint_eq(st.oneoff, 0);
		}
		dp_pool_free(pl);
		plan_fini(&p);
		plan_layout_set_fini(&src);
		plan_layout_set_fini(&dst);
		plan_topo_fini(&topo);
	}
	ck_assert_int_ge(staged, 5);   /* the cases do stage relays */
}
END_TEST

START_TEST(verify_catches_corruption)
{
	plan_layout_set_t s, d;
	plan_topo_t t;
	plan_opts_t o;
	plan_t p;
	refit_err_t e;

	th_layouts("{\"name\":\"w\",\"dtype\":\"fp32\",\"shape\":[64,16],\"mesh\":[0,1],"
		   "\"placements\":[\"Shard(0)\"]}", &s);
	th_layouts("{\"name\":\"w\",\"dtype\":\"fp32\",\"shape\":[64,16],\"mesh\":[8,9,10,11],"
		   "\"placements\":[\"Shard(1)\"]}", &d);
	th_topo("dgx-h100:16", &t);
	plan_opts_default(&o);
	o.chunk_bytes = 1024;
	ck_assert_int_eq(plan_build(&s, &d, &t, &o, &p, NULL), REFIT_OK);
	for (int verify = 0; verify < 2; verify++) {
		mem_t m = {&s, &d, NULL, {0}};
		dp_mem_ops_t ops = {mem_view, &m, NULL};
		dp_exec_opts_t eo = {.verify = verify, .corrupt_msg = 3};
		dp_exec_stats_t st;
		dp_exec_t *x;

		ck_assert_int_eq(plan_match(&s, &d, &m.map, NULL), REFIT_OK);
		ck_assert_int_eq(dp_exec_new(&p, &s, &d, &ops, &eo, &x, NULL), REFIT_OK);
		refit_err_clear(&e);
		if (verify) {
			ck_assert_int_eq(dp_exec_local(x, &st, &e), REFIT_ERR_REMOTE);
			ck_assert_msg(strstr(e.msg, "fails its CRC-32C") &&
				      strstr(e.msg, "tensor \"w\" offset ["), "%s", e.msg);
		} else {
			/* without verify the damage lands silently: why verify exists */
			ck_assert_int_eq(dp_exec_local(x, &st, &e), REFIT_OK);
			ck_assert_int_gt(count_bad(&m), 0);
		}
		dp_exec_free(x);
		mem_fini(&m);
	}
	plan_fini(&p);
	plan_topo_fini(&t);
	plan_layout_set_fini(&s);
	plan_layout_set_fini(&d);
}
END_TEST

/*
 * A scripted stream transport for one slice: it takes everything the
 * executor pulls, and pushes the messages the plan has the other node send
 * here (zeros: only sizes matter), into a receive buffer taken from the
 * pool the way tcp takes it (the peer's max_in_bytes).  It records the
 * largest bytes the pool held meanwhile.
 */
typedef struct unit {
	uint64_t pushed, seq, len;   /* pushed: units pushed before it */
} unit_t;

typedef VEC(unit_t) unitvec_t;

struct xport {
	dp_pool_t *pool;
	const plan_t *plan;
	size_t self;
	const int32_t *node_of;      /* rank -> node */
	uint64_t held_peak, max_in[2], pulled_max[2];
	bool split;                  /* push each message part by part, last part first */
	unitvec_t pulls;             /* every unit pulled, in order */
};

struct xport_session {
	xport_t *x;
	xport_session_cfg_t cfg;
	uint8_t *rbuf[2];
};

static void
peak(xport_t *x)
{
	dp_pool_stats_t st;

	dp_pool_stats(x->pool, &st);
	if (st.held > x->held_peak)
		x->held_peak = st.held;
}

static refit_status_t
scr_open(xport_t *x, const xport_session_cfg_t *cfg, xport_session_t **out,
	 refit_err_t *err)
{
	xport_session_t *s = xcalloc(1, sizeof(*s));

	(void)err;
	ck_assert_uint_eq(cfg->npeers, 2);
	s->x = x;
	s->cfg = *cfg;
	for (size_t i = 0; i < 2; i++) {
		x->max_in[i] = cfg->peers[i].max_in_bytes;
		if (cfg->peers[i].recv_from)
			s->rbuf[i] = dp_pool_get(cfg->pool, cfg->peers[i].max_in_bytes);
	}
	*out = s;
	return REFIT_OK;
}

static refit_status_t
scr_exchange(xport_session_t *s, const xport_io_t *io, refit_err_t *err)
{
	xport_t *x = s->x;
	VEC(unit_t) in = {0};     /* the other node's messages to here, as units */
	plan_msgs_t it;
	plan_msg_t m;
	size_t next = 0, other = 1 - x->self;
	uint64_t pos = 0;

	plan_msgs_init(&it, x->plan, 0, x->plan->nxfers);
	while (plan_msgs_next(&it, &m)) {
		if ((size_t)x->node_of[m.from] != other || (size_t)x->node_of[m.to] != x->self)
			continue;
		if (!x->split)
			VEC_PUSH(&in, ((unit_t){0, pos, m.bytes}));
		for (uint32_t k = m.nparts; x->split && k-- > 0;)
			VEC_PUSH(&in, ((unit_t){0, pos | (uint64_t)k << 32, m.parts[k].bytes}));
		pos++;
	}
	plan_msgs_fini(&it);
	CHECK(io->begin(io->arg, err));
	for (int round = 0; round < 100000 && !io->done(io->arg); round++) {
		const uint8_t *b;
		uint64_t len = 0, seq;

		while (s->cfg.peers[other].send_to && len != UINT64_MAX) {
			CHECK(io->pull(io->arg, other, &b, &len, &seq, err));
			if (len != UINT64_MAX && len > x->pulled_max[other])
				x->pulled_max[other] = len;
			if (len != UINT64_MAX)
				VEC_PUSH(&x->pulls, ((unit_t){next, seq, len}));
			peak(x);
		}
		if (next < in.n) {
			ck_assert_uint_le(in.v[next].len, s->cfg.peers[other].max_in_bytes);
			memset(s->rbuf[other], 0, in.v[next].len);
			CHECK(io->push(io->arg, other, in.v[next].seq, s->rbuf[other],
				       in.v[next].len, err));
			next++;
			peak(x);
		}
	}
	ck_assert(io->done(io->arg));
	VEC_FREE(&in);
	return REFIT_OK;
}

static const dp_dev_ops_t *
scr_dev(xport_session_t *s)
{
	(void)s;
	return NULL;  /* host memory */
}

static void
scr_close(xport_session_t *s)
{
	for (size_t i = 0; i < 2; i++)
		dp_pool_put(s->cfg.pool, s->rbuf[i]);
	free(s);
}

/* the slots a slice uses (the node's are never called here) */
static const xport_ops_t scripted = {
	.name = "scripted", .open = scr_open, .dev = scr_dev, .exchange = scr_exchange,
	.close = scr_close,
};

/*
 * The slice sizes each buffer by what that peer really exchanges: a refit
 * of small tensors with the plan's bound at 4 MiB holds a few pages per
 * peer, not 4 MiB per peer each way (100 node daemons sized by the bound
 * ran a machine out of memory).  Rank 0 on node 0, rank 1 on node 1;
 * uneven shards, so each direction has its own largest message.
 */
START_TEST(slice_buffers_sized_by_need)
{
	plan_layout_set_t src, dst;
	plan_topo_t topo;
	plan_opts_t o;
	plan_t p;
	int32_t node_of[2] = {0, 1}, r0 = 0, r1 = 1;
	slice_node_t nodes[2] = {{"n0", "-", &r0, 1}, {"n1", "-", &r1, 1}};
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), want_out = 0, want_in = 0,
		 want_local = 0;
	plan_msgs_t it;
	plan_msg_t m;

	th_layouts("{\"name\":\"w\",\"dtype\":\"fp32\",\"shape\":[3,8192],\"mesh\":[0,1],"
		   "\"placements\":[\"Shard(0)\"]}", &src);
	th_layouts("{\"name\":\"w\",\"dtype\":\"fp32\",\"shape\":[3,8192],\"mesh\":[0,1],"
		   "\"placements\":[\"Shard(1)\"]}", &dst);
	plan_topo_init(&topo);
	ck_assert_int_eq(plan_topo_add_rank(&topo, 0, "n0", "d0", NULL), REFIT_OK);
	ck_assert_int_eq(plan_topo_add_rank(&topo, 1, "n1", "d1", NULL), REFIT_OK);
	plan_opts_default(&o);
	o.chunk_bytes = (uint64_t)4 << 20;
	ck_assert_int_eq(plan_build(&src, &dst, &topo, &o, &p, NULL), REFIT_OK);
	plan_msgs_init(&it, &p, 0, p.nxfers);
	while (plan_msgs_next(&it, &m)) {
		uint64_t *w = m.from == 0 ? (m.to == 0 ? &want_local : &want_out) :
					    m.to == 0 ? &want_in : NULL;

		if (w && m.bytes > *w)
			*w = m.bytes;
	}
	plan_msgs_fini(&it);
	/* rank 0 holds rows 0-1, rank 1 row 2: the two directions differ */
	ck_assert_uint_eq(want_out, 2 * 4096 * 4);
	ck_assert_uint_eq(want_in, 1 * 4096 * 4);
	ck_assert_uint_eq(want_local, 2 * 4096 * 4);
	for (int refit = 0; refit < 2; refit++) {
		mem_t mm = {&src, &dst, NULL, {0}};
		dp_mem_ops_t ops = {mem_view, &mm, NULL};
		dp_pool_t *pl = dp_pool_new(0, 0, 0);   /* every buffer counted */
		struct xport x = {pl, &p, 0, node_of, 0, {0}, {0}, false, {0}};
		atomic_int no_abort = 0;
		slice_cfg_t c = {
			.plan = &p, .src = &src, .dst = &dst, .mem = &ops, .corrupt = -1,
			.nodes = nodes, .nnodes = 2, .self = 0, .xo = &scripted, .x = &x,
			.refit_id = 1, .epoch = 1, .deadline_ms = INT64_MAX, .abort = &no_abort,
			.pool = pl,
		};
		slice_stats_t st;
		refit_err_t e;

		refit_err_clear(&e);
		ck_assert_int_eq(plan_match(&src, &dst, &mm.map, NULL), REFIT_OK);
		ck_assert_msg(slice_run(&c, &st, &e) == REFIT_OK, "%s", e.msg);
		ck_assert_uint_eq(st.msgs_out, 1);
		ck_assert_uint_eq(st.msgs_in, 1);
		ck_assert_uint_eq(st.msgs_local, 1);
		/* the receive bound is the peer's real largest message */
		ck_assert_uint_eq(x.max_in[1], want_in);
		ck_assert_uint_eq(x.max_in[0], 0);
		ck_assert_uint_eq(x.pulled_max[1], want_out);
		/* held: the packed buffer to n1, the local one, n1's receive buffer,
		 * each rounded to pages after its tag page; far under the bound */
		ck_assert_uint_eq(x.held_peak, (want_out + pg) + (want_local + pg) +
					       (want_in + pg));
		ck_assert_uint_lt(x.held_peak, o.chunk_bytes);
		dp_pool_free(pl);
		VEC_FREE(&x.pulls);
		mem_fini(&mm);
	}
	plan_fini(&p);
	plan_topo_fini(&topo);
	plan_layout_set_fini(&src);
	plan_layout_set_fini(&dst);
}
END_TEST

/*
 * Relays cut through, part by part.  A hand-made plan: rank 1 (node n1)
 * sends tensors a and b whole to rank 0 (node n0) in stage 0, as two
 * messages (together they exceed chunk_bytes); in stage 1 rank 0 relays
 * rows 0-1 of each to rank 2 (node n1), one message of two parts.  Node n0
 * must send the part of a as soon as a has arrived, before b has: with
 * message-level readiness the relay waited for its last piece (on the
 * testbed tp8x2 reshard ran at 72 % of the link, relays trailing the
 * training nodes' sends by 0.7 s).  Node n1 then takes the relay part by
 * part, last part first, and refuses a part it already has.
 */
static void
cut_plan(plan_t *p, plan_tensor_ref_t *t, plan_xfer_t *x, plan_box_t *b)
{
	memset(p, 0, sizeof(*p));
	memset(b, 0, 3 * sizeof(*b));
	for (int i = 0; i < 2; i++)
		t[i] = (plan_tensor_ref_t){i ? "b" : "a", PLAN_DT_FP32, 2, 4};
	b[0].size[0] = 6, b[0].size[1] = 256;           /* whole: 6 KiB */
	b[1].size[0] = 2, b[1].size[1] = 256;           /* rows 0-1: 2 KiB */
	b[2].off[0] = 2, b[2].size[0] = 4, b[2].size[1] = 256;  /* rows 2-5 */
	x[0] = (plan_xfer_t){0, 1, 0, 0, 0};
	x[1] = (plan_xfer_t){0, 1, 0, 1, 0};
	x[2] = (plan_xfer_t){0, 1, 2, 0, 2};
	x[3] = (plan_xfer_t){0, 1, 2, 1, 2};
	x[4] = (plan_xfer_t){1, 0, 2, 0, 1};
	x[5] = (plan_xfer_t){1, 0, 2, 1, 1};
	p->opts.mode = PLAN_MODE_RESHARD;
	p->opts.chunk_bytes = 8192;
	p->opts.staging_bytes = 1 << 20;
	p->tensors = t;
	p->ntensors = 2;
	p->xfers = x;
	p->nxfers = 6;
	p->boxes = b;
	p->nboxes = 3;
	p->nstages = 2;
	p->stages_per_round = 2;
}

/* Node self's slice of cut_plan over transport xo (split: units part by
 * part); the units it pulled go to pulls. */
static refit_status_t
cut_run(const xport_ops_t *xo, size_t self, bool split, unitvec_t *pulls, slice_stats_t *st,
	refit_err_t *e)
{
	static const char *lay =
		"{\"tensors\":[{\"name\":\"a\",\"dtype\":\"fp32\",\"shape\":[6,256],\"mesh\":%s,"
		"\"placements\":[\"Replicate()\"]},"
		"{\"name\":\"b\",\"dtype\":\"fp32\",\"shape\":[6,256],\"mesh\":%s,"
		"\"placements\":[\"Replicate()\"]}]}";
	char js[1024];
	plan_layout_set_t src, dst;
	plan_tensor_ref_t t[2];
	plan_xfer_t xf[6];
	plan_box_t bx[3];
	plan_t p;
	int32_t node_of[3] = {0, 1, 1}, r0 = 0, r12[2] = {1, 2};
	slice_node_t nodes[2] = {{"n0", "-", &r0, 1}, {"n1", "-", r12, 2}};
	dp_pool_t *pl = dp_pool_new(0, 0, 0);
	struct xport x = {pl, &p, self, node_of, 0, {0}, {0}, split, {0}};
	mem_t mm = {&src, &dst, NULL, {0}};
	dp_mem_ops_t ops = {mem_view, &mm, NULL};
	atomic_int no_abort = 0;
	slice_cfg_t c = {
		.plan = &p, .src = &src, .dst = &dst, .mem = &ops, .corrupt = -1,
		.nodes = nodes, .nnodes = 2, .self = self, .xo = xo, .x = &x,
		.refit_id = 1, .epoch = 1, .deadline_ms = INT64_MAX, .abort = &no_abort,
		.pool = pl,
	};
	refit_status_t rc;

	snprintf(js, sizeof(js), lay, "[1]", "[1]");
	th_layouts(js, &src);
	snprintf(js, sizeof(js), lay, "[0,2]", "[0,2]");
	th_layouts(js, &dst);
	cut_plan(&p, t, xf, bx);
	refit_err_clear(e);
	ck_assert_int_eq(plan_match(&src, &dst, &mm.map, NULL), REFIT_OK);
	rc = slice_run(&c, st, e);
	*pulls = x.pulls;
	dp_pool_free(pl);
	mem_fini(&mm);
	plan_layout_set_fini(&src);
	plan_layout_set_fini(&dst);
	return rc;
}

START_TEST(slice_relays_cut_through)
{
	for (size_t self = 0; self < 2; self++) {
		for (int split = 0; split < 2; split++) {
			unitvec_t pulls;
			slice_stats_t st;
			refit_err_t e;

			ck_assert_msg(cut_run(&scripted, self, split, &pulls, &st, &e) == REFIT_OK,
				      "%s", e.msg);
			if (self == 0) {
				/* a's rows 0-1 went after one arrival, b's after the second */
				ck_assert_uint_eq(pulls.n, 2);
				ck_assert_uint_eq(pulls.v[0].pushed, 1);
				ck_assert_uint_eq(pulls.v[0].seq, 0);
				ck_assert_uint_eq(pulls.v[0].len, 2048);
				ck_assert_uint_eq(pulls.v[1].pushed, 2);
				ck_assert_uint_eq(pulls.v[1].seq, (uint64_t)1 << 32);
				ck_assert_uint_eq(pulls.v[1].len, 2048);
				ck_assert_uint_eq(st.msgs_out, 1);
				ck_assert_uint_eq(st.bytes_out, 4096);
				ck_assert_uint_eq(st.msgs_in, 2);
			} else {
				/* whole messages from the start: nothing waits */
				ck_assert_uint_eq(pulls.n, 2);
				ck_assert_uint_eq(pulls.v[0].len, 6144);
				ck_assert_uint_eq(st.msgs_in, 1);
				ck_assert_uint_eq(st.bytes_in, 4096);
			}
			VEC_FREE(&pulls);
		}
	}
}
END_TEST

/* A unit that repeats a part, or does not end at a part, is refused. */
static refit_status_t
bad_exchange(xport_session_t *s, const xport_io_t *io, refit_err_t *err)
{
	static uint8_t z[4096];
	const struct xport *x = s->x;
	refit_status_t rc;

	CHECK(io->begin(io->arg, err));
	if (x->split) /* part 1 of message 0, then part 1 again */
		CHECK(io->push(io->arg, 0, (uint64_t)1 << 32, z, 2048, err));
	rc = io->push(io->arg, 0, (uint64_t)1 << 32, z, x->split ? 2048 : 3000, err);
	ck_assert_int_eq(rc, REFIT_ERR_REMOTE);
	return rc;
}

static const xport_ops_t scripted_bad = {
	.name = "scripted", .open = scr_open, .dev = scr_dev, .exchange = bad_exchange,
	.close = scr_close,
};

START_TEST(slice_refuses_bad_units)
{
	static const char *want[2] = {"which do not end at a part of it",
				      "which has 2 parts, and that one arrived already"};

	for (int split = 0; split < 2; split++) {
		unitvec_t pulls;
		slice_stats_t st;
		refit_err_t e;

		ck_assert_int_eq(cut_run(&scripted_bad, 1, split, &pulls, &st, &e),
				 REFIT_ERR_REMOTE);
		ck_assert_msg(strstr(e.msg, want[split]) && strstr(e.msg, "node \"n0\""),
			      "%s", e.msg);
		VEC_FREE(&pulls);
	}
}
END_TEST

Suite *
suite_dataplane(void)
{
	TCase *tc = th_tcase("exec", 300,
			     TH_TESTS(copy_box_strided, verify_catches_corruption,
				      idle_nics_byte_exact, pool_staging_reused,
				      slice_buffers_sized_by_need, slice_relays_cut_through,
				      slice_refuses_bad_units));

	tcase_add_loop_test(tc, random_plans_byte_exact, 0, 2);
	return th_suite("dataplane", tc, NULL);
}
