/*
 * coord_backend_file.c - the state file backend (coord_backend.h): the
 * document written atomically (temp file, fsync, rename, fsync of the
 * directory), read back whole.  Loop thread only.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec/json.h"
#include "common/alloc.h"
#include "daemon/coord/coord_backend.h"

typedef struct file_store {
	char *path;
	char where[4200];
} file_store_t;

void *
coord_backend_file_new(const char *path)
{
	file_store_t *f = xcalloc(1, sizeof(*f));

	f->path = xstrdup(path);
	snprintf(f->where, sizeof(f->where), "state file %s", path);
	return f;
}

static refit_status_t
file_load(void *impl, char **text, size_t *len, refit_err_t *err)
{
	file_store_t *f = impl;

	return codec_read_file(f->path, text, len, err);
}

static refit_status_t
file_save(void *impl, const char *text, size_t len, refit_err_t *err)
{
	file_store_t *f = impl;
	char tmp[4096], dir[4096];
	size_t off = 0;
	int fd;

	snprintf(tmp, sizeof(tmp), "%s.tmp", f->path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return refit_err_set(err, REFIT_ERR_SYS, "state file %s: %s", tmp, strerror(errno));
	while (off < len) {
		ssize_t n = write(fd, text + off, len - off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			close(fd);
			unlink(tmp);
			return refit_err_set(err, REFIT_ERR_SYS, "state file %s: write: %s", tmp,
					     strerror(errno));
		}
		off += (size_t)n;
	}
	if (fsync(fd) < 0 || close(fd) < 0 || rename(tmp, f->path) < 0) {
		unlink(tmp);
		return refit_err_set(err, REFIT_ERR_SYS, "state file %s: %s", f->path,
				     strerror(errno));
	}
	snprintf(dir, sizeof(dir), "%s", f->path);
	fd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
	return REFIT_OK;
}

static const char *
file_where(void *impl)
{
	return ((file_store_t *)impl)->where;
}

static void
file_free(void *impl)
{
	file_store_t *f = impl;

	if (f == NULL)
		return;
	free(f->path);
	free(f);
}

const coord_backend_t coord_backend_file = {
	.name = "file",
	.load = file_load,
	.save = file_save,
	.where = file_where,
	.free = file_free,
};
