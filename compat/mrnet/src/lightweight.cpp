/* lightweight.cpp: MRNet's lightweight (C) back-end library, libmrnet_lightweight, as a
 * thin C face on the C++ layer's back-end (network.cpp): the same tree, streams and
 * format codes, for back-ends written in C. */
#include <stdarg.h>
#include <stdlib.h>

#include <map>
#include <mutex>
#include <string>

#include "mrnet/MRNet.h"
#include "mrnet_lightweight/MRNet.h"

/* The C handle: the C++ back-end and the host name handed out as a char *. */
struct Network_t {
    MRN::Network *net;
    std::string host;
};

namespace {

/* Each Packet_t's values, by the Packet_t's address. MRNet's programs allocate a
 * Packet_t with malloc (uninitialised) and receive into it again and again, so what
 * it holds cannot live in the struct: a stale entry is replaced by the next receive
 * into that address, or ends with the process. */
typedef std::map<const Packet_t *, MRN::PacketPtr> HeldMap;

/* Never destroyed: a thread still receiving while the process exits must not find
 * them gone. */
std::mutex &held_mu = *new std::mutex;
HeldMap &held = *new HeldMap;

MRN::PacketPtr held_packet(const Packet_t *p) {
    std::lock_guard<std::mutex> g(held_mu);
    HeldMap::const_iterator it = held.find(p);
    return it == held.end() ? MRN::PacketPtr() : it->second;
}

/* Makes `p` the C face of `pkt`: its fields filled, its values held. */
void hold(Packet_t *p, const MRN::PacketPtr &pkt) {
    p->stream_id = pkt->get_StreamId();
    p->tag = pkt->get_Tag();
    p->src_rank = pkt->get_SourceRank();
    p->inlet_rank = pkt->get_InletNodeRank();
    p->fmt_str = const_cast<char *>(pkt->get_FormatString());
    p->hdr = NULL;
    p->hdr_len = 0;
    p->buf = NULL;
    p->buf_len = 0;
    p->data_elements = NULL;
    p->byteorder = 0;
    std::lock_guard<std::mutex> g(held_mu);
    held[p] = pkt;
}

MRN::Stream *cxx(Stream_t *s) { return reinterpret_cast<MRN::Stream *>(s); }
Stream_t *c_face(MRN::Stream *s) { return reinterpret_cast<Stream_t *>(s); }

/* A packet from any stream. The C++ receive also returns a stream's closing (0); MRNet's
 * lightweight receive returns packets only, and its programs take anything but 1 from a
 * blocking receive as the end, so closings are passed over (Stream_is_Closed tells). */
int recv_any(Network_t *net, int *otag, Packet_t *opacket, Stream_t **ostream, bool blocking) {
    if (!net || !opacket) return -1;
    for (;;) {
        MRN::PacketPtr pkt;
        MRN::Stream *s = NULL;
        int tag = 0;
        int rc = net->net->recv(&tag, pkt, &s, blocking);
        if (rc == 0 && s && s->is_Closed()) continue;
        if (rc == 1) {
            hold(opacket, pkt);
            if (otag) *otag = tag;
            if (ostream) *ostream = c_face(s);
        }
        return rc;
    }
}

}  // namespace

extern "C" {

const Rank UnknownRank = (Rank)-1;
const Port UnknownPort = (Port)-1;

void get_Version(int *major, int *minor, int *revision) {
    int a = 0, b = 0, c = 0;
    MRN::get_Version(a, b, c);
    if (major) *major = a;
    if (minor) *minor = b;
    if (revision) *revision = c;
}

Network_t *Network_CreateNetworkBE(int argc, char *argv[]) {
    MRN::Network *cn = MRN::Network::CreateNetworkBE(argc, argv);
    if (!cn) return NULL;
    if (cn->has_Error()) {
        cn->perror("Network_CreateNetworkBE");
        delete cn;
        return NULL;
    }
    Network_t *net = new Network_t;
    net->net = cn;
    net->host = cn->get_LocalHostName();
    return net;
}

void delete_Network_t(Network_t *net) {
    if (!net) return;
    delete net->net;
    delete net;
}

char *Network_get_LocalHostName(Network_t *net) { return net ? const_cast<char *>(net->host.c_str()) : NULL; }
Port Network_get_LocalPort(Network_t *net) { return net ? net->net->get_LocalPort() : UnknownPort; }
Rank Network_get_LocalRank(Network_t *net) { return net ? net->net->get_LocalRank() : UnknownRank; }
char Network_is_ShutDown(Network_t *net) { return !net || net->net->is_ShutDown(); }

void Network_waitfor_ShutDown(Network_t *net) {
    if (net) net->net->waitfor_ShutDown();
}

int Network_recv(Network_t *net, int *otag, Packet_t *opacket, Stream_t **ostream) {
    return recv_any(net, otag, opacket, ostream, true);
}

int Network_recv_nonblock(Network_t *net, int *otag, Packet_t *opacket, Stream_t **ostream) {
    return recv_any(net, otag, opacket, ostream, false);
}

Stream_t *Network_get_Stream(Network_t *net, unsigned int iid) {
    return net ? c_face(net->net->get_Stream(iid)) : NULL;
}

int Network_is_LocalNodeBackEnd(Network_t *net) { return net && net->net->is_LocalNodeBackEnd(); }
void Network_set_OutputLevel(int l) { MRN::set_OutputLevel(l); }
/* The layer writes no debug logs of its own (treecast's go to stderr). */
void Network_set_DebugLogDir(char *) {}

unsigned int Stream_get_Id(Stream_t *stream) { return stream ? cxx(stream)->get_Id() : INVALID_STREAM_ID; }

int Stream_send(Stream_t *stream, int itag, const char *iformat_str, ...) {
    if (!stream || !iformat_str) return -1;
    va_list ap;
    va_start(ap, iformat_str);
    int rc = cxx(stream)->send(iformat_str, ap, itag);
    va_end(ap);
    return rc;
}

int Stream_send_packet(Stream_t *stream, Packet_t *ipacket) {
    MRN::PacketPtr pkt = held_packet(ipacket);
    if (!stream || !pkt) return -1;
    pkt->set_Tag(ipacket->tag);
    if (cxx(stream)->send(pkt) != 0) return -1;
    /* as MRNet's does: a packet sent is the library's, and freed */
    delete_Packet_t(ipacket);
    return 0;
}

int Stream_flush(Stream_t *stream) { return stream ? cxx(stream)->flush() : -1; }

int Stream_recv(Stream_t *stream, int *otag, Packet_t *opacket, bool_t blocking) {
    if (!stream || !opacket) return -1;
    MRN::PacketPtr pkt;
    int tag = 0;
    int rc = cxx(stream)->recv(&tag, pkt, blocking != 0);
    if (rc == 1) {
        hold(opacket, pkt);
        if (otag) *otag = tag;
    }
    return rc;
}

char Stream_is_Closed(Stream_t *stream) { return !stream || cxx(stream)->is_Closed(); }
char Stream_is_ShutDown(Stream_t *stream) { return Stream_is_Closed(stream); }

Packet_t *new_Packet_t(Rank isrc, unsigned int istream_id, int itag, const char *fmt, va_list arg_list) {
    if (!fmt) return NULL;
    MRN::PacketPtr pkt(new MRN::Packet(fmt, arg_list, istream_id, itag));
    if (pkt->has_Error()) return NULL;
    pkt->set_SourceRank(isrc);
    Packet_t *p = static_cast<Packet_t *>(calloc(1, sizeof(Packet_t)));
    if (!p) return NULL;
    hold(p, pkt);
    return p;
}

Packet_t *new_Packet_t_2(unsigned int istream_id, int itag, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    Packet_t *p = new_Packet_t(UnknownRank, istream_id, itag, fmt, ap);
    va_end(ap);
    return p;
}

void Packet_set_DestroyData(Packet_t *, int) {}

int Packet_get_Tag(Packet_t *packet) { return packet ? packet->tag : -1; }

void Packet_set_Tag(Packet_t *packet, int tag) {
    if (!packet) return;
    packet->tag = tag;
    MRN::PacketPtr pkt = held_packet(packet);
    if (pkt) pkt->set_Tag(tag);
}

unsigned int Packet_get_StreamId(Packet_t *packet) { return packet ? packet->stream_id : INVALID_STREAM_ID; }

void Packet_set_StreamId(Packet_t *packet, unsigned int strm_id) {
    if (!packet) return;
    packet->stream_id = strm_id;
    MRN::PacketPtr pkt = held_packet(packet);
    if (pkt) pkt->set_StreamId(strm_id);
}

char *Packet_get_FormatString(Packet_t *packet) {
    MRN::PacketPtr pkt = held_packet(packet);
    return pkt ? const_cast<char *>(pkt->get_FormatString()) : NULL;
}

int Packet_unpack_valist(Packet_t *packet, va_list arg_list, const char *ifmt_str) {
    MRN::PacketPtr pkt = held_packet(packet);
    if (!pkt || !ifmt_str) return -1;
    return pkt->unpack(arg_list, ifmt_str, false);
}

int Packet_unpack(Packet_t *packet, const char *ifmt_str, ...) {
    va_list ap;
    va_start(ap, ifmt_str);
    int rc = Packet_unpack_valist(packet, ap, ifmt_str);
    va_end(ap);
    return rc;
}

void delete_Packet_t(Packet_t *packet) {
    if (!packet) return;
    {
        std::lock_guard<std::mutex> g(held_mu);
        held.erase(packet);
    }
    free(packet);
}

}  // extern "C"
