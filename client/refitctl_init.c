/*
 * refitctl_init.c - `refitctl init DIR [--nodes N|A,B,...] [--days D]`: the
 * cluster's secrets, so that the secure set-up is one command
 * (docs/control-plane.md, "Who may call what" and "Mutual TLS"):
 *
 *   operator.token, join.token     32 random bytes as hex
 *   ca.crt, ca.key                 the cluster CA (ECDSA P-256, self-signed)
 *   coordinator.crt/.key           SAN dNSName "coordinator.refit"
 *   operator.crt/.key              SAN dNSName "operator.refit" (refitctl)
 *   node-<id>.crt/.key             SAN dNSName "<id>.node.refit"
 *
 * Every file mode 0600, created only where none is (an existing CA signs
 * the certificates of nodes added later).  The only user of OpenSSL's
 * libcrypto in refit (the daemons' TLS is gRPC's); calls nothing.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "client/refitctl_internal.h"

#define NAME_MAX_LEN 200

typedef struct init {
	const char *dir;
	int made, kept;     /* files */
	EVP_PKEY *ca_key;
	X509 *ca;
} init_t;

static void
path_of(const init_t *in, const char *name, char *out, size_t n)
{
	snprintf(out, n, "%s/%s", in->dir, name);
}

/* A new file dir/name, mode 0600, or NULL: kept (it exists) or an error,
 * said on stderr (*fail set on an error). */
static FILE *
create(init_t *in, const char *name, int *fail)
{
	char path[4096];
	int fd;
	FILE *f;

	path_of(in, name, path, sizeof(path));
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		fprintf(stderr, "refitctl init: %s: %s%s\n", path, strerror(errno),
			errno == EEXIST ? " (kept: remove it first to make a new one)" : "");
		if (errno == EEXIST)
			in->kept++;
		else
			*fail = 1;
		return NULL;
	}
	if (fchmod(fd, 0600) != 0 || (f = fdopen(fd, "w")) == NULL) {
		fprintf(stderr, "refitctl init: %s: %s\n", path, strerror(errno));
		close(fd);
		*fail = 1;
		return NULL;
	}
	return f;
}

/* Close f, written as dir/name; 0 or 1 after saying why. */
static int
finish(init_t *in, const char *name, FILE *f, int ok)
{
	char path[4096];

	path_of(in, name, path, sizeof(path));
	if (fclose(f) != 0 || !ok) {
		fprintf(stderr, "refitctl init: %s: cannot write it\n", path);
		unlink(path);
		return 1;
	}
	printf("%s\n", path);
	in->made++;
	return 0;
}

static int
new_token(init_t *in, const char *name)
{
	uint8_t raw[32];
	int fail = 0;
	FILE *f;

	if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
		fprintf(stderr, "refitctl init: getrandom: %s\n", strerror(errno));
		return 1;
	}
	if ((f = create(in, name, &fail)) == NULL)
		return fail;
	for (size_t i = 0; i < sizeof(raw); i++)
		fprintf(f, "%02x", raw[i]);
	fputc('\n', f);
	return finish(in, name, f, !ferror(f));
}

/* ext=value on x (issuer in->ca, or x itself for the CA); 0 or -1. */
static int
add_ext(init_t *in, X509 *x, int nid, const char *value)
{
	X509V3_CTX ctx;
	X509_EXTENSION *e;
	int ok;

	X509V3_set_ctx_nodb(&ctx);
	X509V3_set_ctx(&ctx, in->ca ? in->ca : x, x, NULL, NULL, 0);
	if ((e = X509V3_EXT_conf_nid(NULL, &ctx, nid, value)) == NULL)
		return -1;
	ok = X509_add_ext(x, e, -1);
	X509_EXTENSION_free(e);
	return ok ? 0 : -1;
}

/* A certificate for key, named cn (and dns, a SAN dNSName, unless the CA),
 * valid days from now, signed by the CA (in->ca_key; itself when NULL). */
static X509 *
make_cert(init_t *in, EVP_PKEY *key, const char *cn, const char *dns, long days)
{
	X509 *x = X509_new();
	BIGNUM *bn = BN_new();
	char san[NAME_MAX_LEN + 8];
	int ok;

	ok = x && bn && X509_set_version(x, 2) && BN_rand(bn, 127, BN_RAND_TOP_ANY,
							   BN_RAND_BOTTOM_ANY) &&
	     BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x)) &&
	     X509_gmtime_adj(X509_getm_notBefore(x), -3600) &&
	     X509_gmtime_adj(X509_getm_notAfter(x), days * 86400L) &&
	     X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_UTF8,
					(const unsigned char *)cn, -1, -1, 0) &&
	     X509_set_issuer_name(x, in->ca ? X509_get_subject_name(in->ca)
				  : X509_get_subject_name(x)) &&
	     X509_set_pubkey(x, key) &&
	     add_ext(in, x, NID_subject_key_identifier, "hash") == 0;
	if (ok && in->ca == NULL)
		ok = add_ext(in, x, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") == 0 &&
		     add_ext(in, x, NID_key_usage, "critical,keyCertSign,cRLSign") == 0;
	if (ok && in->ca != NULL) {
		snprintf(san, sizeof(san), "DNS:%s", dns);
		ok = add_ext(in, x, NID_basic_constraints, "critical,CA:FALSE") == 0 &&
		     add_ext(in, x, NID_authority_key_identifier, "keyid") == 0 &&
		     add_ext(in, x, NID_key_usage, "critical,digitalSignature") == 0 &&
		     /* a node and the coordinator each serve and call */
		     add_ext(in, x, NID_ext_key_usage, "serverAuth,clientAuth") == 0 &&
		     add_ext(in, x, NID_subject_alt_name, san) == 0;
	}
	ok = ok && X509_sign(x, in->ca_key ? in->ca_key : key, EVP_sha256()) > 0;
	BN_free(bn);
	if (!ok) {
		X509_free(x);
		return NULL;
	}
	return x;
}

/* base.crt and base.key, unless base.crt is there already. */
static int
write_pair(init_t *in, const char *base, EVP_PKEY *key, X509 *x)
{
	char crt[NAME_MAX_LEN + 16], kname[NAME_MAX_LEN + 16];
	int fail = 0;
	FILE *f;

	snprintf(crt, sizeof(crt), "%s.crt", base);
	snprintf(kname, sizeof(kname), "%s.key", base);
	if ((f = create(in, kname, &fail)) == NULL)
		return fail;
	if (finish(in, kname, f, PEM_write_PrivateKey(f, key, NULL, NULL, 0, NULL, NULL)))
		return 1;
	if ((f = create(in, crt, &fail)) == NULL)
		return fail ? fail : 1; /* a key without its certificate */
	return finish(in, crt, f, PEM_write_X509(f, x));
}

/* Read the CA of DIR if both its files are there: 1 read, 0 none, -1 bad. */
static int
load_ca(init_t *in)
{
	char crt[4096], key[4096];
	FILE *fc, *fk;

	path_of(in, "ca.crt", crt, sizeof(crt));
	path_of(in, "ca.key", key, sizeof(key));
	if (access(crt, F_OK) != 0 && access(key, F_OK) != 0)
		return 0;
	fc = fopen(crt, "r");
	fk = fopen(key, "r");
	if (fc)
		in->ca = PEM_read_X509(fc, NULL, NULL, NULL);
	if (fk)
		in->ca_key = PEM_read_PrivateKey(fk, NULL, NULL, NULL);
	if (fc)
		fclose(fc);
	if (fk)
		fclose(fk);
	if (in->ca == NULL || in->ca_key == NULL || X509_check_private_key(in->ca, in->ca_key) != 1) {
		fprintf(stderr, "refitctl init: %s and %s are not a CA certificate and its key "
			"(both are kept; remove both to make a new CA)\n", crt, key);
		return -1;
	}
	printf("%s (kept: it signs the new certificates)\n", crt);
	return 1;
}

static int
new_ca(init_t *in, long days)
{
	EVP_PKEY *key = EVP_EC_gen("P-256");
	X509 *x;
	int rc;

	if (key == NULL || (x = make_cert(in, key, "refit cluster CA", NULL, days)) == NULL) {
		EVP_PKEY_free(key);
		fprintf(stderr, "refitctl init: cannot make the CA (libcrypto)\n");
		return 1;
	}
	if ((rc = write_pair(in, "ca", key, x)) != 0) {
		EVP_PKEY_free(key);
		X509_free(x);
		return rc;
	}
	in->ca = x;
	in->ca_key = key;
	return 0;
}

/* base.crt/.key for dns (CN the same), signed by the CA. */
static int
new_leaf(init_t *in, const char *base, const char *dns, long days)
{
	char crt[4096];
	EVP_PKEY *key;
	X509 *x;
	int rc;

	snprintf(crt, sizeof(crt), "%s/%s.crt", in->dir, base);
	if (access(crt, F_OK) == 0) {
		fprintf(stderr, "refitctl init: %s: File exists (kept: remove it and its key "
			"first to make a new one)\n", crt);
		in->kept++;
		return 0;
	}
	if ((key = EVP_EC_gen("P-256")) == NULL ||
	    (x = make_cert(in, key, dns, dns, days)) == NULL) {
		EVP_PKEY_free(key);
		fprintf(stderr, "refitctl init: cannot make %s (libcrypto)\n", crt);
		return 1;
	}
	rc = write_pair(in, base, key, x);
	EVP_PKEY_free(key);
	X509_free(x);
	return rc;
}

/* A node id as it goes into a dNSName: letters, digits, '-', '_', '.'. */
static int
name_ok(const char *id)
{
	size_t n = strlen(id);

	if (n == 0 || n > 64 || id[0] == '.' || id[0] == '-') {
		fprintf(stderr, "refitctl init: node \"%s\": 1 to 64 characters, not starting "
			"with '.' or '-'\n", id);
		return 0;
	}
	for (size_t i = 0; i < n; i++)
		if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') ||
		      (id[i] >= '0' && id[i] <= '9') || strchr("-_.", id[i]))) {
			fprintf(stderr, "refitctl init: node \"%s\": '%c' cannot be in a "
				"certificate's name (letters, digits, '-', '_', '.')\n", id, id[i]);
			return 0;
		}
	return 1;
}

/* The node certificates --nodes asks for: a count (node0..) or names. */
static int
nodes(init_t *in, const char *spec, long days)
{
	char *dup = strdup(spec), *save = NULL, base[NAME_MAX_LEN], dns[NAME_MAX_LEN];
	char *end, *tok;
	long n = strtol(spec, &end, 10);
	int rc = 0;

	if (*end == '\0' && n >= 1 && n <= 1024) {
		for (long i = 0; i < n && rc == 0; i++) {
			snprintf(base, sizeof(base), "node-node%ld", i);
			snprintf(dns, sizeof(dns), "node%ld%s", i, RPC_TLS_NODE_SUFFIX);
			rc = new_leaf(in, base, dns, days);
		}
		free(dup);
		return rc;
	}
	for (tok = strtok_r(dup, ",", &save); tok && rc == 0; tok = strtok_r(NULL, ",", &save)) {
		if (!name_ok(tok)) {
			rc = 2;
			break;
		}
		snprintf(base, sizeof(base), "node-%s", tok);
		snprintf(dns, sizeof(dns), "%s%s", tok, RPC_TLS_NODE_SUFFIX);
		rc = new_leaf(in, base, dns, days);
	}
	free(dup);
	return rc;
}

static int
init_usage(void)
{
	fprintf(stderr, "usage: refitctl init DIR [--nodes N|ID,ID,...] [--days D]\n");
	return 2;
}

/* Every node name valid before anything is made (nothing half-made). */
static int
spec_ok(const char *spec)
{
	char *end, *dup, *save = NULL;
	long n = strtol(spec, &end, 10);
	int ok = 1;

	if (*end == '\0')
		return n >= 1 && n <= 1024;
	dup = strdup(spec);
	for (char *t = strtok_r(dup, ",", &save); t && ok; t = strtok_r(NULL, ",", &save))
		ok = name_ok(t);
	free(dup);
	return ok && spec[0] != ',' && spec[strlen(spec) - 1] != ',' && !strstr(spec, ",,");
}

int
refitctl_init(int argc, char **argv)
{
	init_t in = {0};
	const char *spec = NULL;
	long days = 825;
	int rc = 0;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--nodes") == 0 && i + 1 < argc) {
			spec = argv[++i];
		} else if (strcmp(argv[i], "--days") == 0 && i + 1 < argc) {
			char *end;

			days = strtol(argv[++i], &end, 10);
			if (*end || days < 1 || days > 36500) {
				fprintf(stderr, "refitctl init: --days \"%s\": 1 to 36500\n", argv[i]);
				return 2;
			}
		} else if (argv[i][0] != '-' && in.dir == NULL) {
			in.dir = argv[i];
		} else {
			return init_usage();
		}
	}
	if (in.dir == NULL)
		return init_usage();
	if (spec && !spec_ok(spec)) {
		fprintf(stderr, "refitctl init: --nodes \"%s\": a count (1 to 1024) or node ids "
			"separated by commas\n", spec);
		return 2;
	}
	if (mkdir(in.dir, 0700) != 0 && errno != EEXIST) {
		fprintf(stderr, "refitctl init: %s: %s\n", in.dir, strerror(errno));
		return 1;
	}
	if (access(in.dir, W_OK) != 0) {
		fprintf(stderr, "refitctl init: %s: %s\n", in.dir, strerror(errno));
		return 1;
	}
	if ((rc = new_token(&in, "operator.token")) == 0 &&
	    (rc = new_token(&in, "join.token")) == 0) {
		int have = load_ca(&in);

		rc = have < 0 ? 1 : have == 0 ? new_ca(&in, days * 2) : 0;
		if (rc == 0)
			rc = new_leaf(&in, "coordinator", RPC_TLS_COORDINATOR, days);
		/* refitctl's under mutual TLS without an operator token */
		if (rc == 0)
			rc = new_leaf(&in, "operator", "operator.refit", days);
		if (rc == 0 && spec)
			rc = nodes(&in, spec, days);
	}
	EVP_PKEY_free(in.ca_key);
	X509_free(in.ca);
	if (rc != 0)
		return rc;
	if (in.made == 0)
		return 2; /* everything was there: said on stderr */
	printf("the coordinator reads operator.token, join.token (token_file, "
	       "join_token_file) and, for mutual TLS, tls_ca ca.crt, tls_cert coordinator.crt, "
	       "tls_key coordinator.key; node ID: join.token, ca.crt, node-ID.crt, "
	       "node-ID.key; refitctl --token-file operator.token --tls-ca ca.crt (or, "
	       "with no operator token, --tls-cert operator.crt --tls-key operator.key).  Keep ca.key "
	       "off the nodes.  systemd: copy them to /etc/refit/ (LoadCredential= in the "
	       "units)\n");
	return 0;
}
