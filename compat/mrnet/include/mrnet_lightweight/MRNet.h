/* mrnet_lightweight/MRNet.h: MRNet's lightweight back-end library for C programs, over
 * treecast (docs/mrnet-compat.md). Link with -lmrnet_lightweight -lxplat_lightweight. */
#ifndef MRNET_LIGHTWEIGHT_MRNET_H
#define MRNET_LIGHTWEIGHT_MRNET_H

#include "mrnet_lightweight/Types.h"
#include "mrnet_lightweight/DataElement.h"
#include "mrnet_lightweight/Error.h"
#include "mrnet_lightweight/Network.h"
#include "mrnet_lightweight/Packet.h"
#include "mrnet_lightweight/Stream.h"

#endif /* MRNET_LIGHTWEIGHT_MRNET_H */
