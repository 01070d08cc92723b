/* xplat/Types.h: the integer and socket types MRNet's headers use (treecast's
 * MRNet-compatible layer, docs/mrnet-compat.md). */
#ifndef XPLAT_TYPES_H
#define XPLAT_TYPES_H

#include <stdint.h>
#include <inttypes.h>
#include <sys/types.h>
#include <unistd.h>

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
