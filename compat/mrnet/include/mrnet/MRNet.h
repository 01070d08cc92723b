/* mrnet/MRNet.h: everything of treecast's MRNet-compatible layer (docs/mrnet-compat.md). */
#if !defined(mrnet_h)
#define mrnet_h 1

#include "mrnet/Communicator.h"
#include "mrnet/Error.h"
#include "mrnet/Event.h"
#include "mrnet/FilterIds.h"
#include "mrnet/Network.h"
#include "mrnet/NetworkTopology.h"
#include "mrnet/Packet.h"
#include "mrnet/Stream.h"
#include "mrnet/Tree.h"
#include "mrnet/Types.h"

#endif /* mrnet_h */
