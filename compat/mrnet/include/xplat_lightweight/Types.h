/* xplat_lightweight/Types.h: the C headers, socket types and truth values MRNet's
 * lightweight (C) back-end library gives its users (treecast's MRNet-compatible layer,
 * docs/mrnet-compat.md). */
#ifndef XPLAT_LIGHTWEIGHT_TYPES_H
#define XPLAT_LIGHTWEIGHT_TYPES_H

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#ifndef __cplusplus
#include <stdbool.h>
#endif

typedef int XPlat_Socket;
typedef uint16_t XPlat_Port;

/* MRNet's lightweight programs use true and false as C values. */
#ifndef true
#define true (1)
#endif
#ifndef false
#define false (0)
#endif
#ifndef bool_t
#define bool_t int
#endif

#define PRIszt "zu"
#define PRIsszt "zd"
#define XPLAT_MAX_HOSTNAME_LEN 256
#define XPLAT_PATH_MAX_LEN 4096

#endif /* XPLAT_LIGHTWEIGHT_TYPES_H */
