#ifndef __CR_TMPFS_ARCHIVE_H__
#define __CR_TMPFS_ARCHIVE_H__

#include <stddef.h>

/* tmpfs_archive() could not write this tree as tar would: run tar. */
#define TMPFS_ARCHIVE_USE_TAR 1

/*
 * Writes the tree under the directory root_fd as a gzip'd tar archive to
 * out_fd, as criu's tar command line for a tmpfs would. Returns 0, -1 on
 * an error, or TMPFS_ARCHIVE_USE_TAR; why_not then says why. On anything
 * but 0 part of an archive may have been written to out_fd.
 */
int tmpfs_archive(int root_fd, int out_fd, char *why_not, size_t why_len);

#endif /* __CR_TMPFS_ARCHIVE_H__ */
