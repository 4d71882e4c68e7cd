/*
 * slice_delta.c - a slice's delta refit over a stream transport (see
 * slice_delta.h).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/crc32c.h"
#include "common/wire.h"
#include "daemon/node/slice_delta.h"
#include "dataplane/delta.h"

void
sdelta_init(sdelta_t *d, delta_store_t *store, const char *model, const char *digest,
	    const char *const *peers, const size_t *nout, const size_t *nin, size_t nnodes,
	    size_t self, uint64_t tag, uint64_t base, const bool *ok, uint64_t cap)
{
	memset(d, 0, sizeof(*d));
	d->nnodes = nnodes;
	if (store == NULL)
		return;
	d->store = store;
	d->tag = tag;
	d->base = ok ? base : 0;
	d->ok = ok;
	d->cap = cap;
	d->kept = true;
	d->out = xcalloc(nnodes ? nnodes : 1, sizeof(*d->out));
	d->in = xcalloc(nnodes ? nnodes : 1, sizeof(*d->in));
	d->enc = xcalloc(nnodes ? nnodes : 1, sizeof(*d->enc));
	d->lack = xcalloc(nnodes ? nnodes : 1, sizeof(*d->lack));
	d->nin = xcalloc(nnodes ? nnodes : 1, sizeof(*d->nin));
	for (size_t i = 0; i < nnodes; i++) {
		if (i == self)
			continue;
		d->nin[i] = nin[i];
		if (nout[i]) {
			d->out[i] = delta_tab_take(store, model, digest, peers[i], true, nout[i]);
			d->kept &= d->out[i] != NULL;
		}
		if (nin[i]) {
			d->in[i] = delta_tab_take(store, model, digest, peers[i], false, nin[i]);
			d->kept &= d->in[i] != NULL;
		}
	}
}

void
sdelta_fini(sdelta_t *d)
{
	if (d->store == NULL)
		return;
	for (size_t i = 0; i < d->nnodes; i++) {
		delta_tab_release(d->store, d->out[i]);
		delta_tab_release(d->store, d->in[i]);
		free(d->enc[i]);
		free(d->lack[i]);
	}
	free(d->out);
	free(d->in);
	free(d->enc);
	free(d->lack);
	free(d->nin);
	free(d->dec);
	d->store = NULL;
}

void
sdelta_begin(sdelta_t *d, const slice_cfg_t *c, const size_t *nout, const size_t *nin,
	     uint64_t cap)
{
	const char **ids = xcalloc(c->nnodes + 1, sizeof(*ids));

	for (size_t i = 0; i < c->nnodes; i++)
		ids[i] = c->nodes[i].node_id;
	sdelta_init(d, c->xo->memory == XPORT_MEM_HOST ? c->delta : NULL, c->model, c->digest,
		    ids, nout, nin, c->nnodes, c->self, c->delta_tag, c->delta_base, c->delta_ok,
		    cap);
	d->skip = c->delta_skip;
	d->nskip = c->delta_nskip;
	free(ids);
}

/* The messages received without room for their base, as (peer, position)
 * pairs into st; false when more than SDELTA_LACKS_MAX. */
static bool
lacks(const sdelta_t *d, slice_stats_t *st)
{
	size_t n = 0;

	for (size_t i = 0; i < d->nnodes; i++)
		for (size_t k = 0; d->lack[i] && k < d->nin[i]; k++)
			n += d->lack[i][k / 8] >> (k % 8) & 1;
	if (n > SDELTA_LACKS_MAX)
		return false;
	st->lacks = n ? xcalloc(2 * n, sizeof(*st->lacks)) : NULL;
	st->nlacks = 0;
	for (size_t i = 0; i < d->nnodes; i++)
		for (size_t k = 0; d->lack[i] && k < d->nin[i]; k++)
			if (d->lack[i][k / 8] >> (k % 8) & 1) {
				st->lacks[2 * st->nlacks] = (uint32_t)i;
				st->lacks[2 * st->nlacks++ + 1] = (uint32_t)k;
			}
	return true;
}

void
sdelta_end(sdelta_t *d, slice_stats_t *st, bool ok)
{
	st->delta_units = d->delta_units;
	st->delta_wire = d->delta_wire;
	st->delta_dense = d->delta_dense;
	st->dense_units = d->dense_units;
	st->dense_wire = d->dense_wire;
	st->bases_kept = ok && d->store != NULL && d->kept && lacks(d, st);
	sdelta_fini(d);
}

/* Does e hold base for every part of [k0, k0 + n) that has bytes? */
static bool
holds(const delta_ent_t *e, const plan_msg_t *pm, uint32_t k0, uint32_t n, uint64_t base)
{
	if (e == NULL || base == 0)
		return false;
	for (uint32_t k = k0; k < k0 + n; k++)
		if (pm->parts[k].bytes && e->tags[k] != base)
			return false;
	return true;
}

/* The unit's bytes become the base of entry e; false when not kept (e
 * NULL: no room).  A sender without room needs no report: its entry is
 * gone, so its next refit sends the message dense (holds). */
static bool
keep(sdelta_t *d, delta_ent_t *e, const plan_msg_t *pm, uint32_t k0, uint32_t n,
     const uint8_t *dense, uint64_t bytes)
{
	uint64_t off = pm->parts[k0].off;

	if (e == NULL || off + bytes > e->bytes)
		return false;
	memcpy(e->data + off, dense, bytes);
	for (uint32_t k = k0; k < k0 + n; k++)
		e->tags[k] = d->tag;
	return true;
}

/* Does peer keep no base of message pos from this node (RunSlice's lacks)? */
static bool
skipped(const sdelta_t *d, size_t peer, size_t pos)
{
	const uint32_t *v = d->skip ? d->skip[peer] : NULL;
	size_t lo = 0, hi = v ? d->nskip[peer] : 0;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (v[mid] == pos)
			return true;
		if (v[mid] < pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

/*
 * Are more than 3 in 4 of 64 elements spread over the unit changed?  Then
 * it goes dense without the codec's passes (at that density an encoding
 * saves under 13 % of the bytes, and a refit whose weights all change
 * would pay the codec on every unit for nothing).
 */
static bool
mostly_changed(const uint8_t *base, const uint8_t *cur, uint64_t bytes, unsigned esize)
{
	uint64_t n = bytes / esize, k = n < 64 ? n : 64, changed = 0;

	for (uint64_t i = 0; i < k; i++) {
		uint64_t at = i * n / k * esize;

		changed += memcmp(base + at, cur + at, esize) != 0;
	}
	return changed * 4 > k * 3;
}

void
sdelta_out(sdelta_t *d, size_t peer, size_t pos, const plan_msg_t *pm, uint32_t k0,
	   uint32_t n, unsigned esize, const uint8_t *dense, uint64_t len, uint64_t trail,
	   const uint8_t **wire, uint64_t *wlen, bool *delta)
{
	uint64_t bytes = len - trail, off, elen = 0;
	delta_ent_t *e;
	dp_delta_fmt_t fmt;
	refit_err_t err;

	*wire = dense;
	*wlen = len;
	*delta = false;
	if (d->store == NULL) {  /* delta off: dense, counted */
		d->dense_units++;
		d->dense_wire += len;
		return;
	}
	e = delta_ent_get(d->store, d->out[peer], pos, pm->bytes, pm->nparts);
	off = pm->parts[k0].off;
	if (d->ok && d->ok[peer] && !skipped(d, peer, pos) && holds(e, pm, k0, n, d->base) &&
	    bytes > SDELTA_HDR &&
	    off + bytes <= e->bytes && !mostly_changed(e->data + off, dense, bytes, esize)) {
		uint8_t *b;

		if (d->enc[peer] == NULL)
			d->enc[peer] = xmalloc(SDELTA_HDR + DP_DELTA_HDR + d->cap + 8);
		b = d->enc[peer];
		if (dp_delta_encode_best(e->data + off, dense, bytes, esize, b + SDELTA_HDR,
					 DP_DELTA_HDR + bytes, &elen, &fmt, &err) == REFIT_OK &&
		    fmt != DP_DELTA_DENSE && SDELTA_HDR + elen < bytes) {
			wire_put_le(b, d->base, 8);
			wire_put_le(b + 8, bytes, 8);
			wire_put_le(b + 16, crc32c(0, e->data + off, bytes), 4);
			wire_put_le(b + 20, 0, 4);
			memcpy(b + SDELTA_HDR + elen, dense + bytes, trail);
			*wire = b;
			*wlen = SDELTA_HDR + elen + trail;
			*delta = true;
		}
	}
	if (*delta) {
		d->delta_units++;
		d->delta_wire += *wlen;
		d->delta_dense += len;
	} else {
		d->dense_units++;
		d->dense_wire += len;
	}
	keep(d, e, pm, k0, n, dense, bytes);
}

refit_status_t
sdelta_frame_len(const uint8_t *f, uint64_t flen, uint64_t trail, uint64_t *dense,
		 refit_err_t *err)
{
	if (flen < SDELTA_HDR + DP_DELTA_HDR + trail)
		return refit_err_set(err, REFIT_ERR_REMOTE, "delta: a frame of %" PRIu64 " bytes "
				     "is shorter than its headers", flen);
	*dense = wire_get_le(f + 8, 8);
	if (*dense > UINT64_MAX / 2 || wire_get_le(f + 20, 4) != 0)
		return refit_err_set(err, REFIT_ERR_REMOTE, "delta: a frame's header is "
				     "malformed (dense bytes %" PRIu64 ", reserved %08" PRIx64 ")",
				     *dense, wire_get_le(f + 20, 4));
	return REFIT_OK;
}

refit_status_t
sdelta_in(sdelta_t *d, size_t peer, const char *peer_id, size_t pos, const plan_msg_t *pm,
	  uint32_t k0, uint32_t n, unsigned esize, const uint8_t *f, uint64_t flen,
	  uint64_t trail, const uint8_t **dense, refit_err_t *err)
{
	uint64_t base = wire_get_le(f, 8), bytes = wire_get_le(f + 8, 8);
	uint32_t crc = (uint32_t)wire_get_le(f + 16, 4);
	uint64_t off = pm->parts[k0].off;
	delta_ent_t *e = d->store ? delta_ent_find(d->in[peer], pos, pm->bytes, pm->nparts) : NULL;

	if (d->base == 0 || base != d->base || !d->ok[peer] || !holds(e, pm, k0, n, base) ||
	    off + bytes > e->bytes)
		return refit_err_set(err, REFIT_ERR_REMOTE, "delta: node \"%s\" sent message %zu "
				     "(rank %d to rank %d, stage %u) encoded against base %" PRIu64
				     ", which this node does not hold for it (the refit's base: %"
				     PRIu64 ")", peer_id, pos, pm->from, pm->to, pm->stage, base,
				     d->base);
	if (crc32c(0, e->data + off, bytes) != crc)
		return refit_err_set(err, REFIT_ERR_REMOTE, "delta: message %zu from node \"%s\": "
				     "this node's base %" PRIu64 " is not the sender's (CRC-32C %08x, "
				     "the sender's %08x)", pos, peer_id, base,
				     crc32c(0, e->data + off, bytes), crc);
	if (d->dec == NULL)
		d->dec = xmalloc(d->cap + 8);
	if (bytes + trail > d->cap)
		return refit_err_set(err, REFIT_ERR_REMOTE, "delta: message %zu from node \"%s\" "
				     "decodes to %" PRIu64 " bytes, more than a unit's %" PRIu64,
				     pos, peer_id, bytes, d->cap);
	CHECK(dp_delta_decode(e->data + off, d->dec, bytes, esize, f + SDELTA_HDR,
			      flen - SDELTA_HDR - trail, err));
	memcpy(d->dec + bytes, f + flen - trail, trail);
	*dense = d->dec;
	return REFIT_OK;
}

void
sdelta_keep_in(sdelta_t *d, size_t peer, size_t pos, const plan_msg_t *pm, uint32_t k0,
	       uint32_t n, const uint8_t *dense, uint64_t bytes)
{
	if (d->store == NULL)
		return;
	if (!keep(d, delta_ent_get(d->store, d->in[peer], pos, pm->bytes, pm->nparts), pm, k0,
		  n, dense, bytes) && pos < d->nin[peer]) {
		if (d->lack[peer] == NULL)
			d->lack[peer] = xcalloc(d->nin[peer] / 8 + 1, 1);
		d->lack[peer][pos / 8] |= (uint8_t)(1u << (pos % 8));
	}
}
