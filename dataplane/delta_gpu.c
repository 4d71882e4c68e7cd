/*
 * delta_gpu.c - a delta unit on a device (see delta_gpu.h).
 */
#include <string.h>

#include "common/wire.h"
#include "dataplane/delta_gpu.h"

#define RES_BYTES 16u

uint64_t
dp_gdelta_work(uint64_t nbytes, unsigned esize)
{
	return RES_BYTES + dp_delta_dev_scratch(nbytes, esize);
}

static dp_delta_op_t
op_of(const void *base, uint64_t nbytes, unsigned esize, void *work)
{
	dp_delta_op_t op;

	memset(&op, 0, sizeof(op));
	op.base = base;
	op.nbytes = nbytes;
	op.esize = esize;
	op.result = work;
	op.scratch = (uint8_t *)work + RES_BYTES;
	return op;
}

void
dp_gdelta_encode(const dp_dev_ops_t *dev, int32_t rank, const void *base, const void *cur,
		 uint64_t nbytes, unsigned esize, void *enc, void *work)
{
	dp_delta_op_t op = op_of(base, nbytes, esize, work);

	op.cur = cur;
	op.out = enc;
	op.cap = DP_DELTA_HDR + nbytes;
	dev->delta(dev->ctx, rank, &op);
}

static refit_status_t
result(const dp_dev_ops_t *dev, int32_t rank, const void *work, uint64_t r[2], refit_err_t *err)
{
	uint8_t b[RES_BYTES];

	dev->to_host(dev->ctx, rank, b, work, RES_BYTES);
	CHECK(dev->sync(dev->ctx, err));
	r[0] = wire_get_le(b, 8);
	r[1] = wire_get_le(b + 8, 8);
	return REFIT_OK;
}

refit_status_t
dp_gdelta_encode_result(const dp_dev_ops_t *dev, int32_t rank, const void *work, uint64_t *len,
			dp_delta_fmt_t *fmt, refit_err_t *err)
{
	uint64_t r[2];

	CHECK(result(dev, rank, work, r, err));
	if (r[1] >= DP_DELTA_NFMT || r[0] < DP_DELTA_HDR)
		return refit_err_set(err, REFIT_ERR_INTERNAL, "delta encode on rank %d's device: "
				     "a result of %llu bytes in format %llu", rank,
				     (unsigned long long)r[0], (unsigned long long)r[1]);
	*len = r[0];
	*fmt = (dp_delta_fmt_t)r[1];
	return REFIT_OK;
}

void
dp_gdelta_decode(const dp_dev_ops_t *dev, int32_t rank, const void *base, void *out,
		 uint64_t nbytes, unsigned esize, const void *enc, uint64_t len, void *work)
{
	dp_delta_op_t op = op_of(base, nbytes, esize, work);

	op.out = out;
	op.enc = enc;
	op.len = len;
	op.dir = 1;
	dev->delta(dev->ctx, rank, &op);
}

refit_status_t
dp_gdelta_decode_result(const dp_dev_ops_t *dev, int32_t rank, const void *work,
			refit_err_t *err)
{
	uint64_t r[2];

	CHECK(result(dev, rank, work, r, err));
	if (r[0] != DPD_OK)
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "delta decode on rank %d's "
				     "device: %s (%llu)", rank, dpd_why(r[0]),
				     (unsigned long long)r[1]);
	return REFIT_OK;
}

void
dp_gdelta_size_put(uint8_t *msg, uint64_t wire, uint64_t tag)
{
	wire_put_le(msg, wire, 8);
	wire_put_le(msg + 8, tag, 8);
}

void
dp_gdelta_size_get(const uint8_t *msg, uint64_t *wire, uint64_t *tag)
{
	*wire = wire_get_le(msg, 8);
	*tag = wire_get_le(msg + 8, 8);
}
