/*
 * rpc_tls.c - TLS for the gRPC layer: server and channel credentials from
 * PEM files, the server's certificate reload (SIGHUP rotation), and who the
 * peer of a call is by its verified certificate.
 *
 * Names (docs/control-plane.md, "Mutual TLS"): a node's certificate
 * carries the SAN dNSName "<node id>.node.refit", the coordinator's
 * "coordinator.refit"; clients verify the server by that name (gRPC's
 * target name override), not by the address they dial, so one CA made by
 * `refitctl init` serves any addresses.  The name is read from gRPC's
 * auth context ("peer_dns": the dNSName SANs of a certificate the
 * handshake verified against the cluster CA).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/json.h"
#include "common/alloc.h"
#include "rpc/rpc_internal.h"

static refit_status_t
read_pem(const char *path, char **out, refit_err_t *err)
{
	size_t len;

	*out = NULL;
	if (path == NULL || path[0] == '\0')
		return REFIT_OK;
	if (codec_read_file(path, out, &len, err) != REFIT_OK) {
		refit_err_prefix(err, "tls");
		return REFIT_ERR_INVALID_ARG;
	}
	/* gRPC takes any bytes here and fails each handshake later */
	if (strstr(*out, "-----BEGIN ") == NULL) {
		free(*out);
		*out = NULL;
		return refit_err_set(err, REFIT_ERR_INVALID_ARG, "tls: %s is not PEM (no "
				     "-----BEGIN line)", path);
	}
	return REFIT_OK;
}

/* The PEM files tls names (NULL where none), and the key pair of them. */
typedef struct pems {
	char *cert, *key, *ca;
	grpc_ssl_pem_key_cert_pair pair;
} pems_t;

/* Read the PEM files tls names into *p; pems_free(p) in any case. */
static refit_status_t
read_pems(const rpc_tls_t *tls, pems_t *p, refit_err_t *err)
{
	memset(p, 0, sizeof(*p));
	if (read_pem(tls->cert_file, &p->cert, err) != REFIT_OK ||
	    read_pem(tls->key_file, &p->key, err) != REFIT_OK ||
	    read_pem(tls->ca_file, &p->ca, err) != REFIT_OK)
		return REFIT_ERR_INVALID_ARG;
	p->pair.private_key = p->key;
	p->pair.cert_chain = p->cert;
	return REFIT_OK;
}

static void
pems_free(pems_t *p)
{
	free(p->cert);
	free(p->key);
	free(p->ca);
}

/*
 * gRPC asks at every handshake (its thread); the files are read again only
 * after rpc_tls_src_reload.  A failed read keeps the certificate in use.
 */
static grpc_ssl_certificate_config_reload_status
fetch_config(void *arg, grpc_ssl_server_certificate_config **out)
{
	rpc_tls_src_t *src = arg;
	unsigned want = atomic_load(&src->gen);
	refit_err_t err;
	pems_t pm;

	if (want == atomic_load(&src->loaded))
		return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
	atomic_store(&src->loaded, want);
	refit_err_clear(&err);
	if (read_pems(&src->tls, &pm, &err) != REFIT_OK || pm.key == NULL || pm.cert == NULL) {
		pems_free(&pm);
		atomic_store(&src->failed, want);
		return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
	}
	*out = grpc_ssl_server_certificate_config_create(pm.ca, &pm.pair, 1);
	pems_free(&pm);
	return *out ? GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW
		    : GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
}

void
rpc_tls_src_reload(rpc_tls_src_t *src)
{
	atomic_fetch_add(&src->gen, 1);
}

refit_status_t
rpc_server_creds(rpc_tls_src_t *src, grpc_server_credentials **out, refit_err_t *err)
{
	const rpc_tls_t *tls = &src->tls;
	grpc_ssl_server_credentials_options *opts;
	pems_t pm;
	refit_status_t rc;

	*out = NULL;
	if (tls->cert_file == NULL || tls->cert_file[0] == '\0') {
		*out = grpc_insecure_server_credentials_create();
		return REFIT_OK;
	}
	/* read once here so that a bad file is an error at start */
	if ((rc = read_pems(tls, &pm, err)) != REFIT_OK)
		goto out;
	if (pm.key == NULL || (tls->require_client_cert && pm.ca == NULL)) {
		rc = refit_err_set(err, REFIT_ERR_INVALID_ARG,
				   "tls: a certificate needs its key file%s",
				   tls->require_client_cert ? " and, for mutual TLS, a CA" : "");
		goto out;
	}
	if (pm.ca == NULL) {
		/* TLS without client certificates: gRPC's fetcher wants a CA (it
		 * aborts without one), so no SIGHUP reload here */
		*out = grpc_ssl_server_credentials_create_ex(
			NULL, &pm.pair, 1, GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE, NULL);
		if (*out == NULL)
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "tls: bad certificate or "
					   "key (%s, %s)", tls->cert_file, tls->key_file);
		goto out;
	}
	atomic_store(&src->gen, 1);
	atomic_store(&src->loaded, 0);
	opts = grpc_ssl_server_credentials_create_options_using_config_fetcher(
		/* verified when presented; the methods that need a node's or the
		 * coordinator's certificate say so (rpc_auth.c), so that health
		 * probes and refitctl (operator token) need none */
		tls->require_client_cert ? GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY
					 : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
		fetch_config, src);
	if (opts)
		*out = grpc_ssl_server_credentials_create_with_options(opts);
	if (*out == NULL)
		rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "tls: bad certificate or key "
				   "(%s, %s)", tls->cert_file, tls->key_file);
out:
	pems_free(&pm);
	return rc;
}

refit_status_t
rpc_channel_creds(const rpc_tls_t *tls, grpc_channel_credentials **out, refit_err_t *err)
{
	pems_t pm;
	refit_status_t rc;

	if (tls->ca_file == NULL || tls->ca_file[0] == '\0') {
		*out = grpc_insecure_credentials_create();
		return REFIT_OK;
	}
	if ((rc = read_pems(tls, &pm, err)) == REFIT_OK) {
		*out = grpc_ssl_credentials_create(pm.ca, pm.cert && pm.key ? &pm.pair : NULL,
						   NULL, NULL);
		if (*out == NULL)
			rc = refit_err_set(err, REFIT_ERR_INVALID_ARG, "tls: bad CA file %s",
					   tls->ca_file);
	}
	pems_free(&pm);
	return rc;
}

grpc_arg
rpc_arg_str(const char *key, const char *value)
{
	grpc_arg a;

	memset(&a, 0, sizeof(a));
	a.type = GRPC_ARG_STRING;
	a.key = (char *)key;
	a.value.string = (char *)value;
	return a;
}

/* Does name (n bytes) end with suffix?  Its prefix length into *pre. */
static bool
ends_with(const char *name, size_t n, const char *suffix, size_t *pre)
{
	size_t k = strlen(suffix);

	if (n <= k || memcmp(name + n - k, suffix, k) != 0)
		return false;
	*pre = n - k;
	return true;
}

void
rpc_tls_peer_read(grpc_call *gc, rpc_tls_peer_t *p)
{
	grpc_auth_context *ctx = grpc_call_auth_context(gc);
	grpc_auth_property_iterator it;
	const grpc_auth_property *prop;

	memset(p, 0, sizeof(*p));
	if (ctx == NULL)
		return;
	it = grpc_auth_context_find_properties_by_name(ctx, GRPC_PEER_DNS_PROPERTY_NAME);
	while ((prop = grpc_auth_property_iterator_next(&it)) != NULL) {
		size_t n = prop->value_length, pre;

		p->has_cert = true;
		if (n == strlen(RPC_TLS_COORDINATOR) &&
		    memcmp(prop->value, RPC_TLS_COORDINATOR, n) == 0) {
			p->coordinator = true;
		} else if (ends_with(prop->value, n, RPC_TLS_NODE_SUFFIX, &pre)) {
			p->nodes++;
			if (p->node == NULL) {
				p->node = xmalloc(pre + 1);
				memcpy(p->node, prop->value, pre);
				p->node[pre] = '\0';
			}
		}
	}
	/* a verified certificate without dNSNames: its subject says who */
	it = grpc_auth_context_find_properties_by_name(ctx, GRPC_X509_CN_PROPERTY_NAME);
	if (grpc_auth_property_iterator_next(&it) != NULL)
		p->has_cert = true;
	grpc_auth_context_release(ctx);
}

void
rpc_tls_peer_fini(rpc_tls_peer_t *p)
{
	free(p->node);
	memset(p, 0, sizeof(*p));
}

grpc_status_code
rpc_tls_check(const rpc_tls_t *tls, bool member, const char *path, const rpc_tls_peer_t *p,
	      char *msg, size_t n)
{
	const char *want = tls->member_name;
	grpc_status_code code = p->has_cert ? GRPC_STATUS_PERMISSION_DENIED
					    : GRPC_STATUS_UNAUTHENTICATED;

	if (want != NULL && member) {
		if (p->coordinator && strcmp(want, RPC_TLS_COORDINATOR) == 0)
			return GRPC_STATUS_OK;
		snprintf(msg, n, "%s: only the coordinator (certificate name \"%s\") may call "
			 "it; the caller %s%s%s", path, want,
			 p->has_cert ? "is " : "presented no certificate",
			 p->node ? "node " : p->has_cert ? "another certificate" : "",
			 p->node ? p->node : "");
		return code;
	}
	if (p->node != NULL && p->nodes == 1)
		return GRPC_STATUS_OK;
	snprintf(msg, n, "%s needs a node's certificate from the cluster CA (SAN dNSName "
		 "\"<node id>%s\")%s", path, RPC_TLS_NODE_SUFFIX,
		 !p->has_cert ? ": none was presented" :
		 p->nodes > 1 ? ": the one presented names several nodes" :
		 ": the one presented names no node");
	return code;
}
