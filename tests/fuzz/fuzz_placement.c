/*
 * fuzz_placement.c - libFuzzer harness for placement strings.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plan/layout.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char buf[256], back[128];
	plan_placement_t p, q;
	refit_err_t e;

	if (size >= sizeof(buf))
		return 0;
	memcpy(buf, data, size);
	buf[size] = '\0';
	refit_err_clear(&e);
	if (plan_placement_parse(buf, &p, "placement", &e) != REFIT_OK) {
		if (e.msg[0] == '\0')
			abort();
		return 0;
	}
	/* what we print parses back to the same placement */
	plan_placement_format(&p, back, sizeof(back));
	if (plan_placement_parse(back, &q, "placement", NULL) != REFIT_OK ||
	    q.kind != p.kind || q.dim != p.dim ||
	    (p.kind == PLAN_PL_STRIDED_SHARD && q.split_factor != p.split_factor))
		abort();
	return 0;
}
