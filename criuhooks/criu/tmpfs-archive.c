/*
 * A tmpfs's contents as a gzip'd tar archive, written by criu itself.
 *
 * tmpfs_dump() runs tar(1), which runs gzip(1), for every tmpfs mount of
 * the dumped tree, while the tasks are frozen. For the small tmpfs mounts
 * a container has (its /dev, the empty masks over /proc and /sys, the
 * cgroup mount points) starting those processes is most of the cost.
 * tmpfs_archive() writes the same archive from criu's own process: a tar
 * stream in GNU format (the format GNU tar creates by default, with its
 * ././@LongLink records for long names), wrapped in gzip with stored
 * (uncompressed) deflate blocks, which any gunzip reads. It records what
 * criu's tar command line does: every entry of the mount's own file system
 * (--one-file-system), numeric owners, permission bits, modification times,
 * hard links of regular files and symbolic links as links to the first
 * name, and no extended attributes.
 *
 * What it does not write the way tar does, it does not write at all: a
 * sparse file, a path longer than PATH_MAX, a tree deeper than
 * TAR_MAX_DEPTH, a time before 1970, a file that is not the one listed
 * by the time it is opened, or a tree with more files than descriptors
 * left. It then returns TMPFS_ARCHIVE_USE_TAR, and the caller runs tar
 * after all.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "tmpfs-archive.h"

#define TAR_BLOCK     512
#define TAR_RECORD    (20 * TAR_BLOCK) /* tar's default blocking factor */
#define TAR_MAX_DEPTH 256
#define STORED_MAX    65535 /* the largest stored deflate block */

struct gz {
	int fd;
	uint32_t crc;
	uint32_t isize; /* input bytes, modulo 2^32 */
	uint64_t total;
	size_t len;
	unsigned char buf[STORED_MAX];
};

struct link_seen {
	dev_t dev;
	ino_t ino;
	char *name; /* NULL: a free slot */
};

struct archive {
	struct gz gz;
	dev_t dev; /* the mount's file system */
	char path[PATH_MAX];
	struct link_seen *links; /* open addressing, links_cap a power of two */
	size_t nlinks, links_cap;
	char *why; /* why not: for the caller's log */
	size_t why_len;
};

static uint32_t crc_table[256];

static void crc_init(void)
{
	uint32_t c;
	int n, k;

	if (crc_table[1])
		return;
	for (n = 0; n < 256; n++) {
		c = (uint32_t)n;
		for (k = 0; k < 8; k++)
			c = c & 1 ? 0xedb88320U ^ (c >> 1) : c >> 1;
		crc_table[n] = c;
	}
}

static uint32_t crc_update(uint32_t crc, const unsigned char *p, size_t len)
{
	crc = ~crc;
	while (len--)
		crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

static int write_all(int fd, const void *data, size_t len)
{
	const char *p = data;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += n;
		len -= n;
	}
	return 0;
}

/* One stored deflate block: a header byte (BFINAL, BTYPE 00), LEN, NLEN. */
static int gz_block(struct gz *gz, int final)
{
	unsigned char h[5];

	h[0] = final ? 1 : 0;
	h[1] = gz->len & 0xff;
	h[2] = gz->len >> 8;
	h[3] = ~h[1];
	h[4] = ~h[2];
	if (write_all(gz->fd, h, sizeof(h)) || write_all(gz->fd, gz->buf, gz->len))
		return -1;
	gz->len = 0;
	return 0;
}

static int gz_open(struct gz *gz, int fd)
{
	/* magic, deflate, no flags, no time, no extra flags, OS unix */
	static const unsigned char h[10] = { 0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3 };

	crc_init();
	gz->fd = fd;
	gz->crc = 0;
	gz->isize = 0;
	gz->total = 0;
	gz->len = 0;
	return write_all(fd, h, sizeof(h));
}

static int gz_write(struct gz *gz, const void *data, size_t len)
{
	const unsigned char *p = data;

	gz->crc = crc_update(gz->crc, p, len);
	gz->isize += (uint32_t)len;
	gz->total += len;
	while (len) {
		size_t n = STORED_MAX - gz->len;

		if (n > len)
			n = len;
		memcpy(gz->buf + gz->len, p, n);
		gz->len += n;
		p += n;
		len -= n;
		if (gz->len == STORED_MAX && gz_block(gz, 0))
			return -1;
	}
	return 0;
}

static int gz_close(struct gz *gz)
{
	unsigned char t[8];
	int i;

	if (gz_block(gz, 1))
		return -1;
	for (i = 0; i < 4; i++) {
		t[i] = gz->crc >> (8 * i);
		t[4 + i] = gz->isize >> (8 * i);
	}
	return write_all(gz->fd, t, sizeof(t));
}

static int gz_zeros(struct gz *gz, size_t len)
{
	static const unsigned char zero[TAR_BLOCK];

	while (len) {
		size_t n = len < sizeof(zero) ? len : sizeof(zero);

		if (gz_write(gz, zero, n))
			return -1;
		len -= n;
	}
	return 0;
}

static void why(struct archive *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void why(struct archive *a, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(a->why, a->why_len, fmt, ap);
	va_end(ap);
}

/*
 * A numeric field: octal digits and a NUL where the value fits, else
 * GNU tar's base-256 form (the top bit of the first byte set).
 */
static void put_num(char *field, size_t width, uint64_t v)
{
	size_t i;

	if (v < (uint64_t)1 << (3 * (width - 1))) {
		for (i = width - 1; i-- > 0; v >>= 3)
			field[i] = '0' + (v & 7);
		field[width - 1] = '\0';
		return;
	}
	for (i = width; i-- > 1; v >>= 8)
		field[i] = v & 0xff;
	field[0] = (char)0x80;
}

static int put_block(struct archive *a, char *h)
{
	unsigned int sum = 0;
	int i;

	memcpy(h + 257, "ustar  ", 8); /* GNU magic and version */
	memset(h + 148, ' ', 8);
	for (i = 0; i < TAR_BLOCK; i++)
		sum += (unsigned char)h[i];
	snprintf(h + 148, 8, "%06o", sum);
	h[155] = ' ';
	return gz_write(&a->gz, h, TAR_BLOCK);
}

/* A ././@LongLink record (type 'L' for a name, 'K' for a link target). */
static int put_long(struct archive *a, char type, const char *s)
{
	char h[TAR_BLOCK] = {};
	size_t len = strlen(s) + 1;

	strcpy(h, "././@LongLink");
	put_num(h + 100, 8, 0644); /* as GNU tar writes it */
	put_num(h + 108, 8, 0);
	put_num(h + 116, 8, 0);
	put_num(h + 124, 12, len);
	put_num(h + 136, 12, 0);
	h[156] = type;
	if (put_block(a, h) || gz_write(&a->gz, s, len))
		return -1;
	return gz_zeros(&a->gz, -len & (TAR_BLOCK - 1));
}

static int put_header(struct archive *a, const char *name, char type, const char *link, const struct stat *st,
		      uint64_t size)
{
	char h[TAR_BLOCK] = {};

	/* GNU tar writes the long link target's record first. */
	if (link && strlen(link) > 100 && put_long(a, 'K', link))
		return -1;
	if (strlen(name) > 100 && put_long(a, 'L', name))
		return -1;
	strncpy(h, name, 100);
	put_num(h + 100, 8, st->st_mode & 07777);
	put_num(h + 108, 8, st->st_uid);
	put_num(h + 116, 8, st->st_gid);
	put_num(h + 124, 12, size);
	put_num(h + 136, 12, (uint64_t)st->st_mtim.tv_sec);
	h[156] = type;
	if (link)
		strncpy(h + 157, link, 100);
	if (type == '3' || type == '4') {
		put_num(h + 329, 8, major(st->st_rdev));
		put_num(h + 337, 8, minor(st->st_rdev));
	}
	return put_block(a, h);
}

/*
 * Opens entry of dirfd, st being what fstatat said of it, without blocking
 * (a fifo put in its place) or following a link; -2 when what it opened is
 * not that file any more, or descriptors ran out: tar may do better.
 */
static int open_same(struct archive *a, int dirfd, const char *entry, int flags, const struct stat *st)
{
	struct stat now;
	int fd;

	fd = openat(dirfd, entry, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW | O_CLOEXEC | flags);
	if (fd < 0) {
		int err = errno;

		why(a, "cannot open %s: %s", a->path, strerror(err));
		return err == EMFILE || err == ENFILE || err == ELOOP || err == ENOTDIR ? -2 : -1;
	}
	if (fstat(fd, &now) || now.st_dev != st->st_dev || now.st_ino != st->st_ino ||
	    (now.st_mode & S_IFMT) != (st->st_mode & S_IFMT)) {
		why(a, "%s changed while it was archived", a->path);
		close(fd);
		return -2;
	}
	return fd;
}

static int put_file(struct archive *a, int dirfd, const char *entry, const struct stat *st)
{
	char buf[STORED_MAX];
	uint64_t left = st->st_size;
	int fd, ret = -1;

	fd = open_same(a, dirfd, entry, 0, st);
	if (fd < 0)
		return fd == -2 ? TMPFS_ARCHIVE_USE_TAR : -1;
	if (put_header(a, a->path, '0', NULL, st, st->st_size))
		goto out;
	while (left) {
		ssize_t n = read(fd, buf, left < sizeof(buf) ? left : sizeof(buf));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			why(a, "cannot read %s: %s", a->path, strerror(errno));
			goto out;
		}
		if (n == 0) {
			why(a, "%s shrank while it was read", a->path);
			goto out;
		}
		if (gz_write(&a->gz, buf, n))
			goto out;
		left -= n;
	}
	ret = gz_zeros(&a->gz, -st->st_size & (TAR_BLOCK - 1));
out:
	close(fd);
	return ret;
}

static size_t link_slot(const struct link_seen *links, size_t cap, dev_t dev, ino_t ino)
{
	size_t i = (size_t)((ino * 0x9e3779b97f4a7c15ULL) ^ dev) & (cap - 1);

	while (links[i].name && (links[i].dev != dev || links[i].ino != ino))
		i = (i + 1) & (cap - 1);
	return i;
}

/* The name a hard-linked file was first archived under, or NULL. */
static const char *link_target(struct archive *a, const struct stat *st)
{
	if (!a->nlinks)
		return NULL;
	return a->links[link_slot(a->links, a->links_cap, st->st_dev, st->st_ino)].name;
}

/* Remembers a->path as the first name of the hard-linked file st. */
static int link_remember(struct archive *a, const struct stat *st)
{
	size_t i;

	if (2 * (a->nlinks + 1) > a->links_cap) {
		size_t cap = a->links_cap ? 2 * a->links_cap : 64;
		struct link_seen *l = calloc(cap, sizeof(*l));

		if (!l)
			goto nomem;
		for (i = 0; i < a->links_cap; i++)
			if (a->links[i].name)
				l[link_slot(l, cap, a->links[i].dev, a->links[i].ino)] = a->links[i];
		free(a->links);
		a->links = l;
		a->links_cap = cap;
	}
	i = link_slot(a->links, a->links_cap, st->st_dev, st->st_ino);
	a->links[i].name = strdup(a->path);
	if (!a->links[i].name)
		goto nomem;
	a->links[i].dev = st->st_dev;
	a->links[i].ino = st->st_ino;
	a->nlinks++;
	return 0;
nomem:
	why(a, "out of memory at %s", a->path);
	return -1;
}

static int put_dir(struct archive *a, int fd, const struct stat *st, int depth);

/* One entry of directory dirfd; a->path is its archive name. */
static int put_entry(struct archive *a, int dirfd, const char *entry, const struct stat *st, int depth)
{
	char link[PATH_MAX];
	const char *first;
	ssize_t n;
	int fd, ret = 0;

	if (st->st_mtim.tv_sec < 0) {
		why(a, "%s has a time before 1970", a->path);
		return TMPFS_ARCHIVE_USE_TAR;
	}
	/*
	 * As tar: a regular file or a symbolic link met again under another
	 * name is a link to the first; other kinds are archived each time.
	 */
	if ((S_ISREG(st->st_mode) || S_ISLNK(st->st_mode)) && st->st_nlink > 1) {
		first = link_target(a, st);
		if (first)
			return put_header(a, a->path, '1', first, st, 0);
	}
	switch (st->st_mode & S_IFMT) {
	case S_IFREG:
		if (st->st_size > 0 && (uint64_t)st->st_blocks * 512 < (uint64_t)st->st_size) {
			why(a, "%s is sparse", a->path);
			return TMPFS_ARCHIVE_USE_TAR;
		}
		ret = put_file(a, dirfd, entry, st);
		break;
	case S_IFLNK:
		n = readlinkat(dirfd, entry, link, sizeof(link));
		if (n < 0 || n == sizeof(link)) {
			why(a, "cannot read the link %s: %s", a->path, n < 0 ? strerror(errno) : "too long");
			return -1;
		}
		link[n] = '\0';
		ret = put_header(a, a->path, '2', link, st, 0);
		break;
	case S_IFCHR:
		return put_header(a, a->path, '3', NULL, st, 0);
	case S_IFBLK:
		return put_header(a, a->path, '4', NULL, st, 0);
	case S_IFIFO:
		return put_header(a, a->path, '6', NULL, st, 0);
	case S_IFSOCK:
		return 0; /* tar ignores sockets too */
	case S_IFDIR:
		if (depth >= TAR_MAX_DEPTH) {
			why(a, "%s is too deep", a->path);
			return TMPFS_ARCHIVE_USE_TAR;
		}
		fd = open_same(a, dirfd, entry, O_DIRECTORY, st);
		if (fd < 0)
			return fd == -2 ? TMPFS_ARCHIVE_USE_TAR : -1;
		return put_dir(a, fd, st, depth + 1);
	default:
		why(a, "%s is of an unknown type", a->path);
		return TMPFS_ARCHIVE_USE_TAR;
	}
	if (!ret && st->st_nlink > 1)
		ret = link_remember(a, st);
	return ret;
}

/* A directory (its header, then what it holds); fd is closed. */
static int put_dir(struct archive *a, int fd, const struct stat *st, int depth)
{
	size_t len = strlen(a->path);
	struct dirent *de;
	DIR *d;
	int ret;

	/* Directories are named with a trailing slash, as tar names them. */
	if (len + 2 > sizeof(a->path)) {
		close(fd);
		why(a, "a path under %s is too long", a->path);
		return TMPFS_ARCHIVE_USE_TAR;
	}
	if (a->path[len - 1] != '/') {
		a->path[len++] = '/';
		a->path[len] = '\0';
	}
	ret = put_header(a, a->path, '5', NULL, st, 0);
	if (ret) {
		close(fd);
		return ret;
	}
	if (st->st_dev != a->dev) { /* --one-file-system: the entry only */
		close(fd);
		return 0;
	}
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		why(a, "cannot read the directory %s: %s", a->path, strerror(errno));
		return -1;
	}
	while (!ret) {
		struct stat est;
		size_t n;

		errno = 0;
		de = readdir(d);
		if (!de) {
			if (errno) {
				why(a, "cannot read the directory %s: %s", a->path, strerror(errno));
				ret = -1;
			}
			break;
		}
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		n = strlen(de->d_name);
		if (len + n + 2 > sizeof(a->path)) {
			why(a, "a path under %s is too long", a->path);
			ret = TMPFS_ARCHIVE_USE_TAR;
			break;
		}
		memcpy(a->path + len, de->d_name, n + 1);
		if (fstatat(dirfd(d), de->d_name, &est, AT_SYMLINK_NOFOLLOW)) {
			why(a, "cannot stat %s: %s", a->path, strerror(errno));
			ret = -1;
			break;
		}
		ret = put_entry(a, dirfd(d), de->d_name, &est, depth);
	}
	a->path[len] = '\0';
	closedir(d);
	return ret;
}

int tmpfs_archive(int root_fd, int out_fd, char *why_not, size_t why_len)
{
	struct archive *a;
	struct stat st;
	size_t i;
	int fd, ret = -1;

	why_not[0] = '\0';
	a = calloc(1, sizeof(*a));
	if (!a) {
		snprintf(why_not, why_len, "out of memory");
		return -1;
	}
	a->why = why_not;
	a->why_len = why_len;
	if (gz_open(&a->gz, out_fd)) {
		goto out;
	}
	fd = openat(root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st)) {
		if (fd >= 0)
			close(fd);
		why(a, "cannot open the mount's root: %s", strerror(errno));
		goto out;
	}
	a->dev = st.st_dev;
	strcpy(a->path, "./");
	ret = put_dir(a, fd, &st, 0);
	if (ret)
		goto out;
	/* Two zero blocks end the archive; tar pads it to whole records. */
	if (gz_zeros(&a->gz, 2 * TAR_BLOCK) || gz_zeros(&a->gz, (TAR_RECORD - a->gz.total % TAR_RECORD) % TAR_RECORD) ||
	    gz_close(&a->gz))
		ret = -1;
out:
	if (ret < 0 && !why_not[0])
		snprintf(why_not, why_len, "cannot write the archive: %s", strerror(errno));
	for (i = 0; i < a->links_cap; i++)
		free(a->links[i].name);
	free(a->links);
	free(a);
	return ret;
}
