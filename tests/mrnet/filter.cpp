/* filter.cpp: an MRNet filter function, built as MRNet's are (-shared, no libraries):
 * sums the "%d" of a wave; at the front-end (root distance 0) multiplies by the
 * stream's parameter ("%d", default 1); below the front-end, for TAG_ECHO waves, it
 * also sends the partial sum back down to its children (packets_out_reverse). */
#include <vector>

#include "mrnet/NetworkTopology.h"
#include "mrnet/Packet.h"
#include "protocol.h"

using namespace MRN;

extern "C" {

const char *ScaledSum_format_string = "%d";

void ScaledSum(std::vector<PacketPtr> &in, std::vector<PacketPtr> &out, std::vector<PacketPtr> &out_reverse,
               void **state, PacketPtr &params, const TopologyLocalInfo &info) {
    int sum = 0;
    for (unsigned int i = 0; i < in.size(); i++) {
        int v = 0;
        in[i]->unpack("%d", &v);
        sum += v;
    }
    /* per-stream state: the number of waves this instance reduced */
    long waves = (long)*state;
    *state = (void *)(waves + 1);
    int tag = in[0]->get_Tag();
    if (info.get_RootDistance() == 0) {
        int k = 1;
        if (params && params->get_NumDataElements() == 1) k = (*params)[0]->get_int32_t();
        sum *= k;
    } else if (tag == TAG_ECHO) {
        out_reverse.push_back(PacketPtr(new Packet(in[0]->get_StreamId(), TAG_ECHO_DOWN, "%d", sum)));
    }
    out.push_back(PacketPtr(new Packet(in[0]->get_StreamId(), tag, "%d", sum)));
}

} /* extern "C" */
