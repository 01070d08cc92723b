/* xplat/Types.h: the integer and socket types MRNet's headers use (treecast's
 * MRNet-compatible layer, docs/mrnet-compat.md). */
#ifndef XPLAT_TYPES_H
#define XPLAT_TYPES_H

/* What MRNet's xplat/Types.h includes, so that tools relying on it (strdup, memcmp,
 * sockets, ...) build unchanged. */
#include <cassert>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdint.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>

typedef int XPlat_Socket;
typedef uint16_t XPlat_Port;

#ifndef bool_t
#define bool_t int32_t
#endif
#define PRIszt "zu"
#define PRIsszt "zd"
#define XPLAT_MAX_HOSTNAME_LEN 256
#define XPLAT_PATH_MAX_LEN 4096

#endif /* XPLAT_TYPES_H */
