/*
 * gen.h - random inputs for property tests (gen.c).
 */
#ifndef REFIT_TESTS_GEN_H
#define REFIT_TESTS_GEN_H

#include "plan/plan.h"

#define GEN_MAXR 16

/* 0 .. n-1 */
int gen_rnd(unsigned *s, int n);
/*
 * A random case: 2..16 ranks in a random topology, 1..3 tensors of 0..3
 * dims, sources (DTensor or explicit, covering) and destinations (DTensor
 * or explicit, possibly partial), over the same ranks.
 */
void gen_case(unsigned *s, plan_layout_set_t *src, plan_layout_set_t *dst,
	      plan_topo_t *topo, int *nranks);

#endif
