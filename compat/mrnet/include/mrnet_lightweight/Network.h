/* mrnet_lightweight/Network.h: a C back-end's handle on the tree (MRNet's lightweight
 * back-end library over treecast, docs/mrnet-compat.md). */
#ifndef MRNET_LIGHTWEIGHT_NETWORK_H
#define MRNET_LIGHTWEIGHT_NETWORK_H

#include "mrnet_lightweight/Packet.h"
#include "mrnet_lightweight/Stream.h"
#include "mrnet_lightweight/Types.h"

/* Opaque: the library's own (MRNet's fields are internal to it too). */
typedef struct Network_t Network_t;

#ifdef __cplusplus
extern "C" {
#endif

/* Joins the tree as a back-end: launched by the tree (its environment), or by MRNet's
 * arguments (parent host, port, rank, own host, own rank) with the attach file in
 * TREECAST_ATTACH. NULL on failure, with the reason on stderr. */
Network_t *Network_CreateNetworkBE(int argc, char *argv[]);
/* Leaves the tree (if the front-end has not ended it) and frees the handle. */
void delete_Network_t(Network_t *net);
/* This host's name, whole; the network's own string. */
char *Network_get_LocalHostName(Network_t *net);
Port Network_get_LocalPort(Network_t *net);
Rank Network_get_LocalRank(Network_t *net);
char Network_is_ShutDown(Network_t *net);
/* Waits until the front-end ends the tree. */
void Network_waitfor_ShutDown(Network_t *net);
/* A packet from any stream into `opacket` (`*ostream` names its stream): 1 with one,
 * -1 on failure or once the tree is over. As in MRNet's lightweight library, a stream's
 * closing is no packet and is not returned: Stream_is_Closed tells. */
int Network_recv(Network_t *net, int *otag, Packet_t *opacket, Stream_t **ostream);
/* As Network_recv, without waiting: 0 when no packet arrived. */
int Network_recv_nonblock(Network_t *net, int *otag, Packet_t *opacket, Stream_t **ostream);
/* The stream of id `iid` this back-end has heard of, or NULL. */
Stream_t *Network_get_Stream(Network_t *net, unsigned int iid);
int Network_is_LocalNodeBackEnd(Network_t *net);
/* MRNet's debug output level, 0 (none) to 5 (MRNET_OUTPUT_LEVEL sets it too). */
void Network_set_OutputLevel(int l);
/* Accepted, changes nothing: the layer writes no debug log files (treecast's own
 * messages go to stderr). */
void Network_set_DebugLogDir(char *value);

#ifdef __cplusplus
}
#endif

#endif /* MRNET_LIGHTWEIGHT_NETWORK_H */
