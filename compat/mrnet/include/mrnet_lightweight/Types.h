/* mrnet_lightweight/Types.h: ranks, ports and tags of MRNet's lightweight (C) back-end
 * library (treecast's MRNet-compatible layer, docs/mrnet-compat.md). */
#ifndef MRNET_LIGHTWEIGHT_TYPES_H
#define MRNET_LIGHTWEIGHT_TYPES_H

#include "xplat_lightweight/Types.h"

typedef XPlat_Port Port;
typedef uint32_t Rank;

#ifndef enum_t
#define enum_t int32_t
#endif
#ifndef char_t
#define char_t char
#endif
#ifndef uchar_t
#define uchar_t unsigned char
#endif

#define FirstSystemTag 0
#define FirstApplicationTag 100

#ifndef MRNET_VERSION_MAJOR
#define MRNET_VERSION_MAJOR 5
#define MRNET_VERSION_MINOR 0
#define MRNET_VERSION_REV 1
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* A rank or port not known (all bits set). */
extern const Rank UnknownRank;
extern const Port UnknownPort;

/* The MRNet version this library stands in for (5.0.1). */
void get_Version(int *major, int *minor, int *revision);

#ifdef __cplusplus
}
#endif

#endif /* MRNET_LIGHTWEIGHT_TYPES_H */
